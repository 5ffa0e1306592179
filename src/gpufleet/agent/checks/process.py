"""Run one program for a check: an argv list (never a shell), its own session, a deadline, bounded output.

A check may start children (a shell script does), so it runs in a session of its own and the whole
process group is killed when it times out, and after it finished too: nothing a check left behind
outlives its round. Output past the first 64 KiB of each stream is read and thrown away, so a check
that floods its stdout neither blocks on a full pipe nor fills the agent's memory.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO, cast

log = logging.getLogger(__name__)

# What a check sees of the agent's environment: nothing but a standard PATH, the C locale and a HOME,
# so its behaviour does not depend on how the agent happened to be started.
CLEAN_ENV: Mapping[str, str] = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LC_ALL": "C",
    "HOME": "/",
}
OUTPUT_KEPT_BYTES = 64 * 1024
KILL_WAIT_S = 2.0  # for a killed process to be reaped; one stuck in the kernel (hung NFS) is given up on


@dataclass(frozen=True)
class Finished:
    """How a program ended. `returncode` is None when it still ran at the deadline (then it was killed);
    negative when a signal ended it, as in subprocess."""

    returncode: int | None
    stdout: bytes
    stderr: bytes

    @property
    def timed_out(self) -> bool:
        return self.returncode is None


def run_bounded(argv: Sequence[str], timeout_s: float, env: Mapping[str, str] = CLEAN_ENV) -> Finished:
    """Run `argv` with stdin closed, cwd `/` and `env`, for at most `timeout_s` seconds.

    Raises OSError when the program cannot be started (missing, not executable, bad interpreter line).
    """
    proc = subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd="/",
        env=dict(env),
        start_new_session=True,  # its own process group, killed as a whole
        close_fds=True,
    )
    out, err = cast(IO[bytes], proc.stdout), cast(IO[bytes], proc.stderr)  # both PIPE above
    deadline = time.monotonic() + timeout_s
    try:
        stdout, stderr = _read_until(out, err, deadline)
        # Output closed: wait for the exit for what is left of the time.
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(deadline - time.monotonic(), 0))
        returncode = proc.poll()
    finally:
        _kill_group(proc)
        out.close()
        err.close()
    return Finished(returncode, stdout, stderr)


def _read_until(out: IO[bytes], err: IO[bytes], deadline: float) -> tuple[bytes, bytes]:
    """Both streams until they close or the deadline passes; the first OUTPUT_KEPT_BYTES of each kept."""
    kept: dict[int, bytearray] = {out.fileno(): bytearray(), err.fileno(): bytearray()}
    with selectors.DefaultSelector() as selector:
        for stream in (out, err):
            selector.register(stream, selectors.EVENT_READ)
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for key, _ in selector.select(left):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fileobj)
                    continue
                buffer = kept[key.fd]
                if len(buffer) < OUTPUT_KEPT_BYTES:
                    buffer += chunk[: OUTPUT_KEPT_BYTES - len(buffer)]
    return bytes(kept[out.fileno()]), bytes(kept[err.fileno()])


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill whatever is left of the program's process group and reap the program."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    try:
        proc.wait(timeout=KILL_WAIT_S)
    except subprocess.TimeoutExpired:
        log.warning("check process %d did not die when killed (stuck in the kernel?); leaving it", proc.pid)
