"""Tables for people: Rich up to a screenful, plain aligned columns beyond (fast at 1,000 rows)."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from gpufleet.cli import output

COLUMNS = [("name", "Node"), ("state", "State"), ("labels", "Labels")]


def _rows(count: int) -> list[dict[str, object]]:
    return [{"name": f"gpu{i:04d}", "state": "up", "labels": {"rack": f"r{i % 7}"}} for i in range(count)]


def test_a_long_table_is_plain_aligned_columns_cut_to_the_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(output, "console", Console(file=io.StringIO(), width=24))
    rows = _rows(output.PLAIN_ABOVE + 1)
    rows[3]["name"] = "a-very-long-node-name-indeed"
    output.table(rows, COLUMNS, title="201 nodes")
    lines = output.console.file.getvalue().splitlines()  # type: ignore[attr-defined]
    assert lines[0] == "201 nodes"
    assert len(lines) == 1 + 1 + len(rows)  # title, header, one line a row: nothing wraps
    assert lines[1].split() == ["Node", "State", "Labels"]
    assert all(len(line) <= 24 for line in lines)
    assert lines[2].split() == ["gpu0000", "up", "rack=r0"]
    assert "…" in lines[5]  # the long name, cut to fit
    assert lines[2].index("up") == lines[1].index("State")  # columns line up


def test_a_short_table_is_rich() -> None:
    buffer = io.StringIO()
    original = output.console
    output.console = Console(file=buffer, width=80)
    try:
        output.table(_rows(3), COLUMNS)
    finally:
        output.console = original
    assert "┃ Node" in buffer.getvalue()
