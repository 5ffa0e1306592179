"""The agent's log watcher: follows files across restarts, rotation and floods; turns Xid and
fallen-off-the-bus lines into the events the head's health checks act on."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpufleet.agent.logs import LogWatcher, pci_index

XID79 = "[6781741.548779] NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
OFF_BUS = "[6781741.548783] NVRM: GPU 0000:91:00.0: GPU has fallen off the bus."
XID13 = "[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics Exception"
NOISE = "[    5.2] IPv6: ADDRCONF(NETDEV_CHANGE): eth0: link becomes ready"
BUSES = {0: "00000000:18:00.0", 3: "00000000:91:00.0"}  # NVML's form


def watcher(tmp_path: Path, *paths: Path, **kw: int) -> LogWatcher:
    return LogWatcher(list(paths), tmp_path / "cursors.json", pci_index(BUSES), blocking=False, clock=lambda: 5.0, **kw)


def append(path: Path, *lines: str, end: str = "\n") -> None:
    with path.open("a") as fh:
        fh.write("\n".join(lines) + end)


def test_xid_and_fallen_off_bus_lines_become_events_for_the_gpu_at_that_address(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    append(log, NOISE, XID79, OFF_BUS, XID13)
    w = watcher(tmp_path, log)
    events = w.poll(0)
    assert [(e.kind, e.gpu, e.code) for e in events] == [("xid", 3, 79), ("gpu_lost", 3, None), ("xid", None, 13)]
    assert events[0].message == XID79  # the line itself is the evidence the head shows
    assert [e.kind for e in w.classified] == ["xid", "gpu_off_bus", "xid"]
    assert w.poll(0) == []  # nothing new


def test_a_restart_neither_repeats_nor_skips_lines(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    append(log, XID13)
    assert len(watcher(tmp_path, log).poll(0)) == 1
    append(log, NOISE, XID79)  # written while the agent was down
    again = watcher(tmp_path, log)  # a new agent process: the cursor comes from the file
    assert [(e.code, e.gpu) for e in again.poll(0)] == [(79, 3)]


def test_a_partial_line_waits_for_its_end(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    append(log, XID79[:40], end="")
    w = watcher(tmp_path, log)
    assert w.poll(0) == []
    append(log, XID79[40:])
    assert [(e.code, e.message) for e in w.poll(0)] == [(79, XID79)]


def test_a_rotated_or_truncated_log_is_read_from_its_start(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    append(log, NOISE, NOISE, XID13)
    w = watcher(tmp_path, log)
    assert len(w.poll(0)) == 1
    os.rename(log, tmp_path / "kern.log.1")  # logrotate: a new file (new inode) under the old name
    append(log, XID79)
    assert [e.code for e in w.poll(0)] == [79]
    log.write_text("NVRM: Xid (PCI:0000:cb:00): 13, x\n")  # truncated in place (copytruncate): shorter now
    assert [e.code for e in w.poll(0)] == [13]


def test_a_flood_is_read_a_slice_at_a_time_and_a_huge_backlog_skipped(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    append(log, *([XID13] * 25))
    w = watcher(tmp_path, log, max_lines=10)
    assert [len(w.poll(0)) for _ in range(4)] == [10, 10, 5, 0]
    far = watcher(tmp_path / "other", log, max_backlog_bytes=500)
    assert far.poll(0) == []  # 25 lines behind is more than 500 bytes: skipped to the end
    append(log, XID79)
    assert [e.code for e in far.poll(0)] == [79]


def test_missing_logs_and_unreadable_cursors_are_not_fatal(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    log = tmp_path / "kern.log"
    (tmp_path / "cursors.json").write_text("{not json")
    w = watcher(tmp_path, log, tmp_path / "nvidia-fabricmanager.log")
    assert "reading logs from their start" in caplog.text
    assert w.poll(0) == []  # neither file exists yet
    append(log, XID79)  # created later: read from its start
    assert [e.code for e in w.poll(0)] == [79]


def test_a_blocking_poll_waits_for_lines_up_to_its_timeout(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    w = LogWatcher([log], tmp_path / "cursors.json", pci_index(BUSES), blocking=True)
    assert w.poll(300) == []  # waited, nothing came
    append(log, XID79)
    assert [e.code for e in w.poll(300)] == [79]
