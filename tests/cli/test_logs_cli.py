"""gpufleet logs classify, as an admin runs it (the real console entry, no server): a line per event
for people, a JSON array for scripts, gzip and stdin, and one clear line for what it cannot read."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import FIXTURES

XID_LOG = FIXTURES / "kernel-logs" / "kmsg-xid79-sxid20034-nvlink-down.log"


def gpufleet(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpufleet.entry", *args],
        input=stdin.decode() if stdin is not None else None,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


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
