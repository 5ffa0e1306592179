"""The node's kernel log and driver logs, followed and classified where they are written.

`LogWatcher` is an `EventSource`: each poll reads what was appended to its files since the last one,
classifies it (`gpufleet.logs.classify`, the same code as `gpufleet logs classify`) and returns the
events the head's health checks act on: an Xid becomes `NodeEvent(kind="xid")` for the GPU at that
PCI address, and "fallen off the bus" becomes `gpu_lost`. The Xids NVML also reports arrive twice on
a real node; the head's verdict is the same either way, and a log catches what NVML misses (an agent
started after the Xid, a GPU NVML no longer lists).

Where it is in each file is kept in `cursors` (a JSON file, written atomically after every read), so
a restarted agent neither reads a line twice nor skips one; a rotated file (new inode) or a truncated
one (shorter than the cursor) is read from its start. At most `max_lines` lines are read per file per
poll: a log flooding faster than that is read later rather than all at once, and a flood longer than
`max_backlog_bytes` behind is skipped to its end, with a warning, as a ring buffer would.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gpufleet.logs.classify import LogClassifier, LogEvent, normalize_pci
from gpufleet.protocol.logs import MAX_LINE_CHARS, LogLine
from gpufleet.protocol.metrics import NodeEvent

log = logging.getLogger(__name__)

MAX_LINES = 5_000  # per file per poll
MAX_BACKLOG_BYTES = 64 * 1024 * 1024  # further behind than this, a file is skipped to its end
MAX_LINE_BYTES = 16 * 1024  # longer lines are cut (the kernel's own limit is 1 KiB)
READ_BYTES = 4 * 1024 * 1024  # per file per poll
POLL_STEP_S = 0.2  # how often a blocking poll looks for new lines
# The classifier's kinds that say the host itself cannot run work: sent as host_fault events for the health checks.
HOST_FAULTS = frozenset({"driver", "oops", "panic"})


KMSG = Path("/dev/kmsg")
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


@dataclass
class Cursor:
    """A file's inode and byte offset; for /dev/kmsg, the last record's sequence number (`offset`) and
    the boot it belongs to (sequence numbers start again at every boot)."""

    inode: int = 0
    offset: int = 0
    boot: str = ""


@dataclass
class FollowedFile:
    path: Path
    cursor: Cursor = field(default_factory=Cursor)
    classifier: LogClassifier = field(default_factory=LogClassifier)

    def read_new(self, max_lines: int, max_backlog: int) -> list[str]:
        """Complete lines appended since the cursor (a partial last line waits for its end)."""
        try:
            st = os.stat(self.path)
        except OSError:
            return []  # not there (yet): a log that appears later is read from its start
        if st.st_ino != self.cursor.inode or st.st_size < self.cursor.offset:
            self.cursor = Cursor(inode=st.st_ino, offset=0)
            self.classifier = LogClassifier(policy=self.classifier.policy)
        if st.st_size - self.cursor.offset > max_backlog:
            log.warning("%s: %d bytes behind; skipping to its end", self.path, st.st_size - self.cursor.offset)
            self.cursor.offset = st.st_size
            return []
        if st.st_size == self.cursor.offset:
            return []
        try:
            with self.path.open("rb") as fh:
                fh.seek(self.cursor.offset)
                data = fh.read(min(st.st_size - self.cursor.offset, READ_BYTES))
        except OSError as exc:
            log.warning("cannot read %s: %s", self.path, exc.strerror)
            return []
        complete = data.split(b"\n")[:-1][:max_lines]  # what follows the last newline is a partial line
        consumed = sum(len(line) + 1 for line in complete)
        if not complete and len(data) >= MAX_LINE_BYTES:  # no newline in sight: take the piece as a line
            complete, consumed = [data], len(data)
        self.cursor.offset += consumed
        return [line[:MAX_LINE_BYTES].decode("utf-8", errors="replace").rstrip("\r") for line in complete]


@dataclass
class KmsgFollower:
    """The kernel's ring buffer through /dev/kmsg: every distribution has it, rsyslog or not.

    Each read() returns one record, `priority,sequence,microseconds,flags;message` and continuation
    lines (" KEY=value"), which are dropped. The device is opened once and read without blocking;
    records up to the cursor's sequence number are skipped, so a restarted agent reads the ring
    buffer again from where it was, and after a reboot (a new boot id) the whole buffer. Records the
    kernel overwrote before they were read (EPIPE) are counted and logged, not fatal.
    """

    path: Path = KMSG
    cursor: Cursor = field(default_factory=Cursor)
    classifier: LogClassifier = field(default_factory=LogClassifier)
    boot_id: Path = BOOT_ID
    overwritten: int = 0
    _fd: int | None = None
    _warned: bool = False

    def read_new(self, max_lines: int, max_backlog: int) -> list[str]:
        """Records written since the cursor, as `pri,seq,usec,flags;message` lines."""
        fd = self._fd if self._fd is not None else self._open()
        if fd is None:
            return []
        lines: list[str] = []
        while len(lines) < max_lines:
            try:
                record = os.read(fd, 16 * 1024)
            except BlockingIOError:
                break
            except BrokenPipeError:  # the kernel overwrote records before they were read
                self.overwritten += 1
                continue
            except OSError as exc:
                log.warning("cannot read %s: %s", self.path, exc.strerror)
                self.close()
                break
            line, seq = parse_kmsg_record(record)
            if seq is None or seq <= self.cursor.offset:
                continue
            self.cursor.offset = seq
            lines.append(line)
        return lines

    def _open(self) -> int | None:
        try:
            self._fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as exc:
            if not self._warned:  # once: it is tried again every poll, in case permissions change
                log.warning("cannot open %s: %s; the kernel log is not followed", self.path, exc.strerror)
                self._warned = True
            return None
        try:
            boot = self.boot_id.read_text().strip()
        except OSError:
            boot = ""
        if boot != self.cursor.boot:  # a reboot: this boot's records are all new
            self.cursor = Cursor(offset=-1, boot=boot)
        return self._fd

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def parse_kmsg_record(record: bytes) -> tuple[str, int | None]:
    """(`pri,seq,usec,flags;message`, seq) of one /dev/kmsg record; its continuation lines are dropped.
    (line, None) for something that is not a record."""
    first = record.split(b"\n", 1)[0][:MAX_LINE_BYTES].decode("utf-8", errors="replace")
    header, sep, _ = first.partition(";")
    fields = header.split(",")
    if not sep or len(fields) < 3 or not fields[1].isdigit():
        return first, None
    return first, int(fields[1])


class LogWatcher:
    """Follows log files and turns what matters to the head's health checks into `NodeEvent`s.

    `gpu_index` maps a normalised PCI bus id ("0000:2b:00") to the GPU's index on this node; `blocking`
    polls wait in a thread (a real agent), non-blocking ones return at once (the simulator).
    """

    def __init__(
        self,
        paths: list[Path],
        cursors: Path,
        gpu_index: Callable[[str], int | None],
        *,
        blocking: bool = True,
        max_lines: int = MAX_LINES,
        max_backlog_bytes: int = MAX_BACKLOG_BYTES,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.blocking = blocking
        self._cursors_path = cursors
        self._gpu_index = gpu_index
        self._max_lines = max_lines
        self._max_backlog = max_backlog_bytes
        self._clock = clock
        saved = self._load()
        self.files: list[FollowedFile | KmsgFollower] = [
            KmsgFollower(p, saved.get(str(p), Cursor())) if p == KMSG else FollowedFile(p, saved.get(str(p), Cursor()))
            for p in paths
        ]
        self.classified: list[LogEvent] = []  # every event of the last poll
        self.lines_read = 0
        self._lines: list[LogLine] = []  # every line read, for the head to keep (take_lines)

    def _load(self) -> dict[str, Cursor]:
        try:
            raw = json.loads(self._cursors_path.read_text())
            return {path: Cursor(int(c["inode"]), int(c["offset"]), str(c.get("boot", ""))) for path, c in raw.items()}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("unreadable log cursors %s (%s): reading logs from their start", self._cursors_path, exc)
            return {}

    def _save(self) -> None:
        data = {str(f.path): asdict(f.cursor) for f in self.files}
        tmp = self._cursors_path.with_suffix(".tmp")
        try:
            self._cursors_path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(data))
            os.replace(tmp, self._cursors_path)
        except OSError as exc:
            log.warning("cannot save log cursors to %s: %s", self._cursors_path, exc.strerror)

    def read_once(self) -> list[NodeEvent]:
        """One pass over every file: the events for the head, and every classified event kept in
        `classified`."""
        self.classified = []
        moved = False
        for followed in self.files:
            before = asdict(followed.cursor)
            lines = followed.read_new(self._max_lines, self._max_backlog)
            self.lines_read += len(lines)
            first = followed.classifier.line_no + 1  # the number the classifier gives lines[0]
            events = list(followed.classifier.feed(lines))
            self.classified.extend(events)
            self._keep(str(followed.path), lines, {e.line_no - first: e for e in events})
            moved = moved or before != asdict(followed.cursor)
        if moved:
            self._save()
        return [e for e in (self._node_event(c) for c in self.classified) if e is not None]

    def _keep(self, source: str, lines: list[str], events: dict[int, LogEvent]) -> None:
        now = self._clock()
        for index, text in enumerate(lines):
            event = events.get(index)
            if event is None:
                self._lines.append(LogLine(ts=now, source=source, line=text[:MAX_LINE_CHARS]))
                continue
            self._lines.append(
                LogLine(
                    ts=event.time if event.time is not None else now,
                    source=source,
                    line=event.line[:MAX_LINE_CHARS],  # a multi-line message, whole, on its last line
                    kind=event.kind,
                    code=event.code,
                    severity=event.severity,
                    action=event.action,
                    pci_bus=event.pci_bus,
                    device=event.device[:64] if event.device else None,
                    gpu=self._gpu_index(event.pci_bus) if event.pci_bus else None,
                )
            )

    def take_lines(self) -> list[LogLine]:
        """Every line read since the last call, events classified, for the head to keep and search."""
        lines, self._lines = self._lines, []
        return lines

    def poll(self, timeout_ms: int) -> list[NodeEvent]:
        """Events appended since the last poll; a blocking watcher waits up to `timeout_ms` for some."""
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            events = self.read_once()
            if events or not self.blocking or time.monotonic() >= deadline:
                return events
            time.sleep(min(POLL_STEP_S, max(deadline - time.monotonic(), 0)))

    def _node_event(self, event: LogEvent) -> NodeEvent | None:
        gpu = self._gpu_index(event.pci_bus) if event.pci_bus else None
        message = event.line[:512]
        if event.kind == "xid" and event.code is not None:
            return NodeEvent(
                ts=self._clock(), kind="xid", gpu=gpu, code=event.code, message=message, suggested=event.suggested
            )
        if event.kind == "gpu_off_bus" and gpu is not None:
            return NodeEvent(ts=self._clock(), kind="gpu_lost", gpu=gpu, message=message)
        if event.kind in HOST_FAULTS:
            # The classifier's own message names the fault ("kernel panic: ..."); the line is in the log store.
            return NodeEvent(
                ts=self._clock(), kind="host_fault", message=(event.message or message)[:512], suggested=event.action
            )
        return None


def pci_index(pci_bus_ids: dict[int, str]) -> Callable[[str], int | None]:
    """`gpu_index` for LogWatcher from {GPU index: NVML's PCI bus id}."""
    by_bus = {normalize_pci(bus): index for index, bus in pci_bus_ids.items()}
    return by_bus.get
