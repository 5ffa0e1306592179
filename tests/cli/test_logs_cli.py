"""gpufleet logs classify, as an admin runs it (the real console entry, no server): a line per event
for people, a JSON array for scripts, gzip and stdin, and one clear line for what it cannot read."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet.cli.logs import read_log
from gpufleet.core.errors import InvalidInput
from tests.conftest import FIXTURES

XID_LOG = FIXTURES / "kernel-logs" / "kmsg-xid79-sxid20034-nvlink-down.log"


def gpufleet(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "gpufleet.entry", *args],
        input=stdin,
        capture_output=True,
        timeout=60,
        check=False,
    )
    out, err = result.stdout.decode(errors="replace"), result.stderr.decode(errors="replace")
    return subprocess.CompletedProcess(result.args, result.returncode, out, err)


def test_people_get_one_line_per_event_and_a_count() -> None:
    result = gpufleet("logs", "classify", str(XID_LOG))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 6
    assert lines[0].split()[:7] == ["3", "+6781741.549s", "critical", "reboot", "xid", "79", "0000:91:00"]
    assert result.stderr.strip() == "6 events (6 critical) in 13 lines"


def test_scripts_get_json_and_gzip_and_stdin_read_the_same(tmp_path: Path) -> None:
    plain = json.loads(gpufleet("logs", "classify", "-o", "json", str(XID_LOG)).stdout)
    assert [(e["kind"], e["code"], e["pci_bus"], e["action"], e["line_no"]) for e in plain[:2]] == [
        ("xid", 79, "0000:91:00", "reboot", 3),
        ("gpu_off_bus", None, "0000:91:00", "reboot", 4),
    ]
    assert set(plain[0]) >= {"time", "kind", "code", "pci_bus", "severity", "action", "line"}
    zipped = tmp_path / "kern.log.gz"
    zipped.write_bytes(gzip.compress(XID_LOG.read_bytes()))
    assert json.loads(gpufleet("logs", "classify", "-o", "json", str(zipped)).stdout) == plain
    assert json.loads(gpufleet("logs", "classify", "-o", "json", "-", stdin=XID_LOG.read_bytes()).stdout) == plain


def test_an_override_changes_the_action_for_this_run() -> None:
    events = json.loads(gpufleet("logs", "classify", "-o", "json", "--xid-action", "79=drain", str(XID_LOG)).stdout)
    assert events[0]["action"] == "drain"


def test_what_cannot_be_read_or_understood_is_one_line_and_exit_2(tmp_path: Path) -> None:
    missing = gpufleet("logs", "classify", str(tmp_path / "nope.log"))
    assert (missing.returncode, missing.stdout) == (2, "")
    assert missing.stderr.strip() == f"gpufleet: error: cannot read {tmp_path / 'nope.log'}: No such file or directory"
    broken = tmp_path / "broken.gz"
    broken.write_bytes(b"\x1f\x8b not really gzip")
    assert "cannot read" in gpufleet("logs", "classify", str(broken)).stderr
    bad = gpufleet("logs", "classify", "--xid-action", "79=explode", str(XID_LOG))
    assert bad.returncode == 2
    assert "Traceback" not in bad.stderr
    assert "--xid-action: Xid 79: 'explode' is not one of ignore, warn, drain, reset_gpu, reboot" in bad.stderr


# A real binary every test machine has: the interpreter running the tests (an ELF executable).
BINARY = Path(sys.executable).resolve()


@pytest.mark.parametrize("where", ["file", "stdin"])
def test_a_binary_file_is_refused_by_name_with_exit_2(where: str) -> None:
    if where == "file":
        result = gpufleet("logs", "classify", str(BINARY))
        name = str(BINARY)
    else:
        result = gpufleet("logs", "classify", "-", stdin=BINARY.read_bytes())
        name = "stdin"
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.startswith(f"gpufleet: error: {name}: not a text log")
    assert len(result.stderr.strip().splitlines()) == 1  # one line, no traceback


def test_every_compression_logrotate_uses_is_read(tmp_path: Path) -> None:
    plain = XID_LOG.read_bytes()
    for suffix, compress in (("gz", gzip.compress), ("xz", lzma.compress), ("bz2", bz2.compress)):
        (tmp_path / f"kern.log.{suffix}").write_bytes(compress(plain))
        assert read_log(tmp_path / f"kern.log.{suffix}") == plain.decode(), suffix


def test_a_log_with_a_crash_s_nul_blocks_is_still_text(tmp_path: Path) -> None:
    """After a power loss, a filesystem can leave zero-filled blocks in a log that was being written:
    the log an admin most wants read after a crash."""
    log = tmp_path / "kern.log"
    log.write_bytes(XID_LOG.read_bytes() + b"\0" * 8192 + XID_LOG.read_bytes())
    events = json.loads(gpufleet("logs", "classify", "-o", "json", str(log)).stdout)
    assert len(events) == 12


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"LPKSHHRH" + bytes(248), "a systemd journal file: export it with journalctl --file"),  # journald's signature
        (b"\x28\xb5\x2f\xfd" + bytes(60), "zstd-compressed: decompress it first"),
        (bytes(4096), "not a text log: it holds only NUL bytes"),
        (lzma.compress(BINARY.read_bytes()), "not a text log"),  # compressed or not, a binary is a binary
        (b"\xfd7zXZ\x00 truncated", "cannot read"),
    ],
    ids=["journal", "zstd", "only-nul", "binary-in-xz", "truncated-xz"],
)
def test_what_is_not_a_text_log_says_what_it_is(tmp_path: Path, content: bytes, says: str) -> None:
    path = tmp_path / "x.log"
    path.write_bytes(content)
    with pytest.raises(InvalidInput, match=f"^(cannot read )?{path}"):
        read_log(path)
    with pytest.raises(InvalidInput) as caught:
        read_log(path)
    assert says in str(caught.value)


def test_a_device_is_refused_rather_than_read_forever() -> None:
    with pytest.raises(InvalidInput, match=r"^/dev/zero: not a log file but a character device"):
        read_log(Path("/dev/zero"))
