"""Is a mount point answering? stat and statvfs in a child process, with a deadline.

A stat on a mount whose server is gone (a hard NFS mount, Lustre, a FUSE daemon that stopped) blocks in
the kernel, uninterruptibly for as long as the server is away. Done in the agent's own process it would
take a thread with it for good; done in a child, the agent waits at most `timeout_s`, then kills the
child and moves on. A child stuck in the kernel may not die at once (it dies when the kernel lets go):
it is never waited on past `REAP_WAIT_S`, only polled at the next probe, and while it lives no second
child is started for that mount. The mount is "hung" until it is gone, so a hung server costs one
process per mount, never a pile of them.

The child is the agent's own Python interpreter, isolated (`-I -S`: no site packages, no environment),
running a few lines that time the two calls themselves and print the numbers: the latency reported is
the file system's, not the process start's.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Literal, cast

from gpufleet.agent.checks.process import CLEAN_ENV

log = logging.getLogger(__name__)

State = Literal["ok", "hung", "stale", "error"]
REAP_WAIT_S = 0.2  # after SIGKILL: a child that is not gone by then is left to a later probe
FRESH_S = 1.0  # a probe this recent answers again instead of starting another child
MAX_OUTPUT = 4096

# Prints "ok SECONDS FRSIZE BLOCKS BFREE BAVAIL FILES FFREE" or "err ERRNO SECONDS STRERROR".
_CHILD = """
import os, sys, time
path = sys.argv[1]
start = time.perf_counter()
try:
    os.stat(path)
    v = os.statvfs(path)
except OSError as e:
    print("err", e.errno or 0, time.perf_counter() - start, e.strerror or "")
else:
    print("ok", time.perf_counter() - start, v.f_frsize, v.f_blocks, v.f_bfree, v.f_bavail, v.f_files, v.f_ffree)
"""


@dataclass(frozen=True)
class ProbeResult:
    """What one probe found. Sizes are None unless `state` is ok; `seconds` is the file system's time
    (hung: how long the probe has waited, counting an earlier probe's child that is still stuck)."""

    state: State
    seconds: float
    message: str = ""
    errno: int | None = None
    size_bytes: float | None = None
    free_bytes: float | None = None
    avail_bytes: float | None = None
    files: float | None = None
    files_free: float | None = None

    def values(self) -> dict[str, float]:
        """The `fs_*` metrics of protocol.metrics.FS_METRICS this result gives."""
        out = {"fs_state": float(STATE_CODES[self.state]), "fs_probe_seconds": round(self.seconds, 6)}
        for name, value in (
            ("fs_size_bytes", self.size_bytes),
            ("fs_free_bytes", self.free_bytes),
            ("fs_avail_bytes", self.avail_bytes),
            ("fs_files", self.files),
            ("fs_files_free", self.files_free),
        ):
            if value is not None:
                out[name] = value
        return out


STATE_CODES: dict[str, int] = {"ok": 0, "hung": 1, "stale": 2, "error": 3, "not mounted": 4}


def parse_child_output(text: str) -> ProbeResult:
    """The child's one line as a result. Raises ValueError for anything else (a broken interpreter)."""
    fields = text.split(maxsplit=3)
    if fields and fields[0] == "ok" and len(text.split()) == 8:
        numbers = [float(f) for f in text.split()[1:]]
        seconds, frsize, blocks, bfree, bavail, files, ffree = numbers
        return ProbeResult(
            "ok",
            seconds,
            size_bytes=blocks * frsize,
            free_bytes=bfree * frsize,
            avail_bytes=bavail * frsize,
            files=files,
            files_free=ffree,
        )
    if fields and fields[0] == "err" and len(fields) >= 3:
        code = int(fields[1])
        strerror = fields[3].strip() if len(fields) > 3 else os.strerror(code)
        state: State = "stale" if code == errno.ESTALE else "error"
        return ProbeResult(state, float(fields[2]), message=strerror, errno=code)
    raise ValueError(f"unexpected probe output: {text[:80]!r}")


@dataclass
class _Mount:
    lock: threading.Lock
    child: subprocess.Popen[bytes] | None = None  # a killed child not reaped yet: the mount is still hung
    since: float = 0.0  # monotonic time that child started
    last: ProbeResult | None = None
    last_at: float = -1e18


class MountProber:
    """Probes mount points; thread-safe (the metrics round and the checks round share one prober, and a
    probe for a mount already being probed waits for that one instead of starting another)."""

    def __init__(
        self,
        timeout_s: float = 5.0,
        *,
        python: str = sys.executable,
        clock: Callable[[], float] = time.monotonic,
        fresh_s: float = FRESH_S,
    ) -> None:
        self.timeout_s = timeout_s
        self.python = python
        self._clock = clock
        self.fresh_s = fresh_s
        self._mounts: dict[str, _Mount] = {}
        self._guard = threading.Lock()

    def probe(self, path: str) -> ProbeResult:
        """stat and statvfs `path` within `timeout_s`. Raises nothing: a child that cannot start is an
        error result."""
        with self._guard:
            mount = self._mounts.setdefault(path, _Mount(threading.Lock()))
        with mount.lock:
            now = self._clock()
            if mount.last is not None and mount.child is None and now - mount.last_at < self.fresh_s:
                return mount.last
            if mount.child is not None:
                if mount.child.poll() is None:
                    waited = now - mount.since
                    result = ProbeResult("hung", waited, f"no answer for {waited:.0f} s (a probe is still stuck)")
                    mount.last, mount.last_at = result, now
                    return result
                _close(mount.child)  # it came back at last: the server may be back too, probe afresh
                mount.child = None
            result = self._run(path, mount)
            mount.last, mount.last_at = result, self._clock()
            return result

    def outstanding(self) -> int:
        """Children still stuck from earlier probes (at most one per mount)."""
        with self._guard:
            mounts = list(self._mounts.values())
        return sum(1 for m in mounts if m.child is not None and m.child.poll() is None)

    def close(self) -> None:
        """Kill what is left (the agent is stopping); never waits on a stuck child."""
        with self._guard:
            mounts = list(self._mounts.values())
        for mount in mounts:
            if mount.child is not None:
                _kill(mount.child)

    def _run(self, path: str, mount: _Mount) -> ProbeResult:
        started = self._clock()
        try:
            child = subprocess.Popen(
                [self.python, "-I", "-S", "-c", _CHILD, path],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                cwd="/",
                env=dict(CLEAN_ENV),
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            return ProbeResult("error", 0.0, f"cannot start the probe: {exc.strerror or exc}")
        output = _read(cast(IO[bytes], child.stdout), started + self.timeout_s, self._clock)
        if output is None:  # no answer in time: kill it, and never wait long for a child stuck in the kernel
            _kill(child)
            try:
                child.wait(timeout=REAP_WAIT_S)
            except subprocess.TimeoutExpired:
                mount.child, mount.since = child, started
                log.warning("storage: probe of %s is stuck in the kernel; no new probe until it ends", path)
            else:
                _close(child)
            return ProbeResult("hung", self.timeout_s, f"no answer within {self.timeout_s:g} s")
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=REAP_WAIT_S)
        if child.poll() is None:
            _kill(child)
        _close(child)
        try:
            return parse_child_output(output.decode("utf-8", "replace"))
        except ValueError as exc:
            return ProbeResult("error", self._clock() - started, str(exc))


def _read(stream: IO[bytes], deadline: float, clock: Callable[[], float]) -> bytes | None:
    """The child's output until it closes; None when the deadline passes first."""
    kept = bytearray()
    with selectors.DefaultSelector() as selector:
        selector.register(stream, selectors.EVENT_READ)
        while True:
            left = deadline - clock()
            if left <= 0:
                return None
            if not selector.select(left):
                continue
            chunk = os.read(stream.fileno(), MAX_OUTPUT)
            if not chunk:
                return bytes(kept)
            if len(kept) < MAX_OUTPUT:
                kept += chunk[: MAX_OUTPUT - len(kept)]


def _kill(child: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signal.SIGKILL)


def _close(child: subprocess.Popen[bytes]) -> None:
    if child.stdout is not None:
        child.stdout.close()
