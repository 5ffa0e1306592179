"""Output for people (Rich tables) and for scripts (-o json, stable field names)."""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

console = Console()


class Format(enum.StrEnum):
    table = "table"
    json = "json"


OutputOpt = typer.Option(Format.table, "--output", "-o", help="table for people, json for scripts")


def print_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, sort_keys=False, default=str))


def cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in value.items())
    if isinstance(value, str) and len(value) >= 19 and value[4] == "-" and value[10] == "T":
        return value[:19].replace("T", " ")  # ISO timestamps, to the second
    return str(value)


# Above this many rows a table is printed as plain aligned columns, as squeue and kubectl print theirs:
# Rich lays out every cell, about 0.8 s for 1,000 rows, and `gpufleet node list` must feel instant.
PLAIN_ABOVE = 200


def table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]], title: str | None = None) -> None:
    if len(rows) > PLAIN_ABOVE:
        plain_table(rows, columns, title)
        return
    out = Table(title=title, header_style="bold")
    for _key, header in columns:
        out.add_column(header)
    for row in rows:
        out.add_row(*(cell(row.get(key)) for key, _ in columns))
    console.print(out)


def plain_table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]], title: str | None = None) -> None:
    """Columns padded to their widest cell, two spaces apart; the widest are cut (…) to fit the terminal."""
    texts = [[header for _key, header in columns]]
    texts += [[cell(row.get(key)).replace("\n", " ") for key, _ in columns] for row in rows]
    widths = [max(len(line[i]) for line in texts) for i in range(len(columns))]
    room = max(console.width - 2 * (len(columns) - 1), len(columns) * 4)
    while sum(widths) > room and max(widths) > 4:
        widths[widths.index(max(widths))] -= 1
    lines = [title] if title else []
    for line in texts:
        shown = [
            text if len(text) <= width else text[: width - 1] + "…" for text, width in zip(line, widths, strict=True)
        ]
        lines.append("  ".join(text.ljust(width) for text, width in zip(shown, widths, strict=True)).rstrip())
    console.file.write("\n".join(lines) + "\n")


def fields(data: dict[str, Any], keys: Sequence[tuple[str, str]]) -> None:
    out = Table(show_header=False, box=None)
    out.add_column(style="bold")
    out.add_column()
    for key, label in keys:
        out.add_row(label, cell(data.get(key)))
    console.print(out)


def size_mb(value: Any) -> str:
    """A byte count as people read it in tables: MB with one decimal; empty for None."""
    return "" if value is None else f"{value / 1e6:,.1f} MB"
