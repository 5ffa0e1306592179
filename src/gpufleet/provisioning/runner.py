"""The one place provisioning runs programs (debootstrap, tar, cp, chroot + apt, rsync).

Every program is an argument list with a timeout: never a shell, never a string to split. A program
that runs past its timeout is killed with its whole process group (debootstrap and apt start
children of their own). Its output is read as it comes, so a caller can follow progress (rsync's
`--info=progress2`) line by line, and what is kept of it is bounded. Because every program passes
through here, a dry run can show the exact argv (`Plan`) instead of running it, and tests can
substitute a fake runner.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import shlex
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from gpufleet.core.errors import GpufleetError

KEEP_CHARS = 256 * 1024  # of stdout and stderr each: rsync's itemized list of a big change is long
_KILL_GRACE_S = 5.0


class CommandFailed(GpufleetError):
    """A program exited non-zero, ran past its timeout or could not be started. Its message names
    the program, the exit status and the last lines it wrote to stderr.

    In a request (a drift report) this is 502, not 500: the head worked, the program or the node it
    reached (an rsync to a node that is down) did not."""

    http_status = 502
    exit_code = 1


@dataclass(frozen=True)
class Completed:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    seconds: float


@dataclass(frozen=True)
class Step:
    """One program to run: what a dry run prints."""

    argv: tuple[str, ...]
    timeout_s: float
    env: Mapping[str, str] = field(default_factory=dict)  # added to a minimal environment

    def shown(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        return (env + " " if env else "") + shlex.join(self.argv)


class Runner(Protocol):
    def run(
        self,
        step: Step,
        *,
        on_line: Callable[[str], None] | None = None,
        ok_codes: frozenset[int] = frozenset({0}),
    ) -> Completed: ...


def _environment(extra: Mapping[str, str]) -> dict[str, str]:
    """A small, predictable environment: programs in a chroot must not see the head's own variables."""
    base = {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "LC_ALL": "C.UTF-8",
        "LANG": "C.UTF-8",
        "HOME": os.environ.get("HOME", "/root"),
    }
    return base | dict(extra)


def _tail(text: str, lines: int = 6) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:] if line.strip())


class ProcessRunner:
    """Runs a Step as a child process in a session of its own; the only caller of subprocess here."""

    def run(
        self,
        step: Step,
        *,
        on_line: Callable[[str], None] | None = None,
        ok_codes: frozenset[int] = frozenset({0}),
    ) -> Completed:
        """Raises CommandFailed when the program cannot start, times out, or exits with a code not
        in `ok_codes` (rsync's 24, "some files vanished", is one a caller may accept)."""
        started = time.monotonic()
        name = Path(step.argv[0]).name
        try:
            proc = subprocess.Popen(
                list(step.argv),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=_environment(step.env),
                start_new_session=True,
            )
        except OSError as exc:
            raise CommandFailed(f"cannot run {name}: {exc.strerror or exc}") from None
        out, err, timed_out = self._collect(proc, step.timeout_s, started, on_line)
        seconds = time.monotonic() - started
        if timed_out:
            raise CommandFailed(f"{name} ran past its timeout of {step.timeout_s:g} s and was killed: {_tail(err)}")
        returncode = proc.returncode if proc.returncode is not None else -1
        if returncode not in ok_codes:
            detail = _tail(err) or _tail(out)
            raise CommandFailed(f"{name} exited with status {returncode}: {detail or 'no output'}")
        return Completed(tuple(step.argv), returncode, out, err, seconds)

    def _collect(
        self,
        proc: subprocess.Popen[bytes],
        timeout_s: float,
        started: float,
        on_line: Callable[[str], None] | None,
    ) -> tuple[str, str, bool]:
        """Read both pipes until the program ends or the deadline passes (then kill its group).
        Keeps the last KEEP_CHARS of each; hands every stdout line to `on_line` as it comes."""
        if proc.stdout is None or proc.stderr is None:
            raise CommandFailed("no pipes to read the program's output from")
        kept: dict[int, bytearray] = {1: bytearray(), 2: bytearray()}
        lines = _Lines(on_line)
        deadline = started + timeout_s
        timed_out = False
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ, 1)
            sel.register(proc.stderr, selectors.EVENT_READ, 2)
            while sel.get_map() and not timed_out:
                left = deadline - time.monotonic()
                timed_out = left <= 0
                for key, _ in [] if timed_out else sel.select(timeout=min(left, 1.0)):
                    chunk = os.read(key.fd, 65536)
                    if not chunk:
                        sel.unregister(key.fileobj)
                        continue
                    buf = kept[key.data]
                    buf += chunk
                    if len(buf) > 2 * KEEP_CHARS:
                        del buf[:-KEEP_CHARS]
                    if key.data == 1:
                        lines.feed(chunk)
        if not timed_out:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
        if timed_out:
            self._kill(proc)
        lines.flush()
        proc.stdout.close()
        proc.stderr.close()
        out, err = (bytes(kept[k][-KEEP_CHARS:]).decode("utf-8", "replace") for k in (1, 2))
        return out, err, timed_out

    @staticmethod
    def _kill(proc: subprocess.Popen[bytes]) -> None:
        """SIGTERM to the whole group, then SIGKILL after a grace."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=_KILL_GRACE_S)
                return


class _Lines:
    """Splits output into lines for a callback; rsync ends progress lines with \\r, the rest with \\n."""

    def __init__(self, on_line: Callable[[str], None] | None) -> None:
        self.on_line = on_line
        self.pending = b""

    def feed(self, chunk: bytes) -> None:
        if self.on_line is None:
            return
        *lines, self.pending = (self.pending + chunk).replace(b"\r", b"\n").split(b"\n")
        for line in lines:
            if line:
                self.on_line(line.decode("utf-8", "replace"))

    def flush(self) -> None:
        if self.on_line is not None and self.pending:
            self.on_line(self.pending.decode("utf-8", "replace"))
        self.pending = b""


def run_all(runner: Runner, steps: Sequence[Step]) -> list[Completed]:
    """Each step in order; the first failure stops the rest."""
    return [runner.run(step) for step in steps]
