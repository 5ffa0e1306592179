"""A generated block inside a file people edit: only the lines between the markers change, byte for byte."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufleet.core import managed_block
from gpufleet.core.errors import InvalidInput

BEGIN, END = managed_block.markers("nodes")
CONF = f"""ClusterName=c
# keep this comment
{BEGIN}
NodeName=old CPUs=1
{END}
PartitionName=mine Nodes=x
"""


def test_markers_name_the_block() -> None:
    assert (BEGIN, END) == ("# BEGIN gpufleet managed nodes", "# END gpufleet managed nodes")
    assert managed_block.wrap("a\nb", "nodes") == f"{BEGIN}\na\nb\n{END}\n"


def test_only_the_lines_between_the_markers_change() -> None:
    new = managed_block.place(CONF, "NodeName=new CPUs=2\n", "nodes")
    assert new == CONF.replace("NodeName=old CPUs=1", "NodeName=new CPUs=2")
    assert managed_block.place(new, "NodeName=new CPUs=2\n", "nodes") == new  # placing again changes nothing


def test_every_other_byte_is_kept_crlf_and_non_utf8_included(tmp_path: Path) -> None:
    raw = b"A=1\r\n# caf\xe9 latin-1\r\n  " + BEGIN.encode() + b"  \r\nold\r\n" + END.encode() + b"\r\nB=2"
    path = tmp_path / "slurm.conf"
    path.write_bytes(raw)
    text = managed_block.read_text(path)
    managed_block.write_atomic(path, managed_block.place(text, "new\n", "nodes"), backup=False)
    assert path.read_bytes() == raw.replace(b"old\r\n", b"new\n")


def test_an_empty_body_leaves_the_markers_alone() -> None:
    assert managed_block.place(CONF, "", "nodes") == CONF.replace("NodeName=old CPUs=1\n", "")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", f"{BEGIN}\nX\n{END}\n"),
        ("A=1\n", f"A=1\n\n{BEGIN}\nX\n{END}\n"),
        ("A=1", f"A=1\n\n{BEGIN}\nX\n{END}\n"),  # a last line without its newline gets one
        ("A=1\n\n", f"A=1\n\n{BEGIN}\nX\n{END}\n"),
    ],
)
def test_without_markers_the_block_is_appended(text: str, expected: str) -> None:
    assert managed_block.place(text, "X", "nodes") == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (f"{BEGIN}\nA=1\n", "found 1 and 0"),
        (f"A=1\n{END}\n", "found 0 and 1"),
        (f"{BEGIN}\n{END}\n{BEGIN}\n{END}\n", "found 2 and 2 .line 1, line 2, line 3, line 4."),
        (f"{END}\n{BEGIN}\n", "line 1. comes before"),
    ],
)
def test_broken_markers_are_refused(text: str, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        managed_block.place(text, "X\n", "nodes")


def test_other_blocks_markers_are_not_ours() -> None:
    other = "# BEGIN gpufleet managed other\nx\n# END gpufleet managed other\n"
    assert managed_block.find(other, "nodes") is None


@given(
    st.lists(st.sampled_from(["A=1", "# c", "", "  x = y ", "\t", "é"]), max_size=6),
    st.lists(st.sampled_from(["A=1", "# c", "", "z"]), max_size=6),
    st.lists(st.sampled_from(["N=1", "N=2"]), max_size=4),
)
def test_what_surrounds_the_block_survives_any_body(before: list[str], after: list[str], lines: list[str]) -> None:
    text = "\n".join([*before, BEGIN, "old", END, *after]) + "\n"
    new = managed_block.place(text, "".join(f"{line}\n" for line in lines), "nodes")
    head, _, rest = new.partition(BEGIN + "\n")
    inside, _, tail = rest.partition(END + "\n")
    assert head == "".join(f"{line}\n" for line in before)
    assert tail == "".join(f"{line}\n" for line in after)
    assert inside == "".join(f"{line}\n" for line in lines)


def test_unified_diff() -> None:
    assert managed_block.unified_diff(CONF, CONF, "slurm.conf") == ""
    diff = managed_block.unified_diff(CONF, CONF.replace("old", "new"), "/etc/slurm/slurm.conf")
    assert diff.startswith("--- /etc/slurm/slurm.conf\n+++ /etc/slurm/slurm.conf (gpufleet)\n")
    assert "\n-NodeName=old CPUs=1\n+NodeName=new CPUs=1\n" in diff
    unterminated = managed_block.unified_diff("a\nb", "a\nc\n", "f")
    assert unterminated.endswith("-b\n\\ No newline at end of file\n+c\n")


def test_read_text_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match=r"nope.conf: no such file"):
        managed_block.read_text(tmp_path / "nope.conf")
    assert managed_block.read_text(tmp_path / "new.conf", missing_ok=True) == ""
    with pytest.raises(InvalidInput, match="no such file"):
        managed_block.read_text(tmp_path / "no-dir" / "gres.conf", missing_ok=True)
    with pytest.raises(InvalidInput, match="is a directory"):
        managed_block.read_text(tmp_path)


def test_write_atomic_keeps_a_backup_and_the_mode(tmp_path: Path) -> None:
    path = tmp_path / "slurm.conf"
    path.write_text("old\n")
    path.chmod(0o640)
    backup = managed_block.write_atomic(path, "new\n")
    assert backup == tmp_path / "slurm.conf.bak"
    assert path.read_text() == "new\n"
    assert backup.read_text() == "old\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["slurm.conf", "slurm.conf.bak"]  # no temporary left


def test_a_new_file_gets_0644_and_no_backup(tmp_path: Path) -> None:
    path = tmp_path / "gres.conf"
    assert managed_block.write_atomic(path, "x\n") is None
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert not (tmp_path / "gres.conf.bak").exists()


def test_a_symlink_stays_a_symlink(tmp_path: Path) -> None:
    real = tmp_path / "shared" / "slurm.conf"
    real.parent.mkdir()
    real.write_text("old\n")
    link = tmp_path / "slurm.conf"
    link.symlink_to(real)
    managed_block.write_atomic(link, "new\n")
    assert link.is_symlink()
    assert real.read_text() == "new\n"
    assert (real.parent / "slurm.conf.bak").read_text() == "old\n"


def test_a_failed_write_changes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "slurm.conf"
    path.write_text("old\n")

    def refuse(*_: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(InvalidInput, match=r"cannot write .*slurm\.conf: Operation not permitted"):
        managed_block.write_atomic(path, "new\n", backup=False)
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["slurm.conf"]


def test_writing_into_a_missing_directory_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match=r"cannot write .*gres\.conf: No such file or directory"):
        managed_block.write_atomic(tmp_path / "missing" / "gres.conf", "x\n")
