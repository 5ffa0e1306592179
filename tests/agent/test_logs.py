"""The agent's log watcher: follows files across restarts, rotation and floods; turns Xid and
fallen-off-the-bus lines into the events the head's health checks act on."""

from __future__ import annotations

import os
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpufleet.agent.logs import KMSG, KmsgFollower, LogWatcher, parse_kmsg_record, pci_index

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


def test_kmsg_records_are_read_by_their_sequence_number() -> None:
    text = "4,3964,206764307,-;NVRM: Xid (PCI:0000:91:00): 79, GPU has fallen off the bus."
    assert parse_kmsg_record(text.encode() + b"\n SUBSYSTEM=pci\n DEVICE=+pci:0000:91:00.0\n") == (text, 3964)
    assert parse_kmsg_record(b"not a record")[1] is None


def _kmsg_usable() -> bool:
    try:
        fd = os.open(KMSG, os.O_RDWR | os.O_NONBLOCK)
    except OSError:
        return False
    os.close(fd)
    return True


def _write_kmsg(line: str) -> None:
    fd = os.open(KMSG, os.O_WRONLY)  # a character device: one write is one record
    try:
        os.write(fd, line.encode() + b"\n")
    finally:
        os.close(fd)


@pytest.mark.skipif(not _kmsg_usable(), reason="no /dev/kmsg this process may read and write (needs root)")
def test_the_real_kernel_log_is_followed_across_a_restart(tmp_path: Path) -> None:
    """Writes two harmless marker lines into this machine's kernel log and reads them back."""
    marker = f"gpufleet-test {uuid.uuid4()}"

    def follower() -> KmsgFollower:
        watcher = LogWatcher([KMSG], tmp_path / "cursors.json", pci_index(BUSES), blocking=False)
        found = watcher.files[0]
        assert isinstance(found, KmsgFollower)
        return found

    def mine(lines: list[str]) -> list[str]:
        return [line.split(";", 1)[1] for line in lines if marker in line]

    _write_kmsg(f"{marker} first")
    w = LogWatcher([KMSG], tmp_path / "cursors.json", pci_index(BUSES), blocking=False)
    w.read_once()  # the whole ring buffer, to its end; the cursor is saved
    assert w.lines_read > 0
    w.files[0].close()  # type: ignore[union-attr]
    _write_kmsg(f"{marker} second")
    again = follower()  # a restarted agent: from the saved sequence number on, so "first" is not read again
    assert mine(again.read_new(100_000, 0)) == [f"{marker} second"]
    again.close()


def test_what_a_line_says_to_do_travels_with_its_event(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    append(
        log,
        "NVRM: Xid (PCI:0000:18:00): 144, SAW_MVB Nonfatal XC0 i0 Link 0 (0x00000001 0x00000008 0x00000000)",
        "NVRM: Xid (PCI:0000:91:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
        XID79,
    )
    events = watcher(tmp_path, log).poll(0)
    assert [(e.code, e.gpu, e.suggested) for e in events] == [(144, 0, "warn"), (154, 3, "reboot"), (79, 3, None)]


def test_every_line_read_is_kept_for_the_head_with_its_classification(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    append(log, NOISE, XID79, XID13)
    w = watcher(tmp_path, log)
    w.poll(0)
    lines = w.take_lines()
    assert [(x.line, x.kind, x.code, x.gpu, x.severity, x.source) for x in lines] == [
        (NOISE, None, None, None, None, str(log)),
        (XID79, "xid", 79, 3, "critical", str(log)),
        (XID13, "xid", 13, None, "warning", str(log)),  # 0000:cb:00 is not a GPU of this node
    ]
    assert lines[0].ts == 5.0  # no time of its own: when it was read
    assert lines[2].ts == datetime(2024, 8, 30, 11, 43, 9, tzinfo=UTC).timestamp()  # dmesg -T's own
    assert w.take_lines() == []


MISMATCH = "[ 8957.099615] NVRM: API mismatch: the client has the version 570.148.08, but"  # fixture line 21's form


def test_a_driver_mismatch_oops_or_panic_becomes_a_host_fault_event(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    panic = "[  105.483902] Kernel panic - not syncing: Fatal exception in interrupt"
    append(log, NOISE, MISMATCH, "NVRM: this kernel module has the version 535.54.03.  Please", panic)
    events = watcher(tmp_path, log).poll(0)
    assert [(e.kind, e.suggested) for e in events] == [("host_fault", "reboot"), ("host_fault", "drain")]
    assert "570.148.08" in events[0].message
    assert "kernel panic" in events[1].message
