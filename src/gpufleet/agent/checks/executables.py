"""Custom checks in the NHC style: every executable file in `checks_dir`, its exit code and first line the verdict.

Exit 0 passes, exit 1 fails (NHC's convention: the node is drained), any other exit warns; the
message is the first non-empty line of stdout, else of stderr. A check that times out or cannot be
started warns with the reason, so a broken script degrades a node but never drains a fleet.

A check runs as the agent does, normally root. When the agent is root, a check file that is not
owned by root or is writable by its group or by others is refused, and so are all of them when the
directory is: anyone who could edit such a file could run anything as root.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpufleet.agent.checks.ports import FAIL, PASS, WARN, Status, clean_line, result
from gpufleet.agent.checks.process import Finished, run_bounded
from gpufleet.protocol.metrics import CheckResult

log = logging.getLogger(__name__)

# The protocol's CheckName, less `:`: names with a colon belong to the built-in kinds (`service:`, `mount:`).
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,127}")
# What package managers and editors leave next to a configuration file; never a check.
_LEFTOVER_SUFFIXES = (".rpmsave", ".rpmnew", ".rpmorig")
_LEFTOVER_INFIXES = (".dpkg-", ".ucf-")


def is_leftover(name: str) -> bool:
    """Hidden files, editor backups and package-manager leftovers, which are silently not checks."""
    return (
        name.startswith(".")
        or name.endswith("~")
        or name.endswith(_LEFTOVER_SUFFIXES)
        or any(infix in name for infix in _LEFTOVER_INFIXES)
    )


@dataclass(frozen=True)
class CustomCheck:
    """One check file found in the directory; `refused` says why it must not run (None: it may)."""

    name: str
    path: Path
    refused: str | None = None


def unsafe(st: os.stat_result) -> str | None:
    """Why a file or directory with this status must not be trusted by a root agent, or None."""
    if st.st_mode & stat.S_IWOTH:
        return "writable by others"
    if st.st_mode & stat.S_IWGRP:
        return "writable by group"
    if st.st_uid != 0:
        return "not owned by root"
    return None


class CustomChecks:
    """The check files of one directory, found afresh each round (so a check added or removed takes
    effect at the next round), and how to run one."""

    def __init__(
        self,
        directory: Path,
        *,
        timeout_s: float,
        enforce_owner: bool | None = None,
        run: Callable[[list[str], float], Finished] = run_bounded,
    ) -> None:
        self.directory = directory
        self.timeout_s = timeout_s
        # Only a root agent can tell a root-owned file from a user's; a non-root agent runs checks as itself.
        self.enforce_owner = os.geteuid() == 0 if enforce_owner is None else enforce_owner
        self._run = run
        self._told: set[str] = set()  # names whose skip was logged already: once, not every round

    def find(self) -> tuple[list[CustomCheck], list[CheckResult]]:
        """The checks to run, sorted by name, and results for a directory that cannot be read (status 2,
        named `checks_dir`). A missing directory means no custom checks. Raises nothing."""
        try:
            dir_stat = self.directory.stat()
            entries = sorted(os.scandir(self.directory), key=lambda e: e.name)
        except FileNotFoundError:
            return [], []
        except OSError as exc:
            return [], [result("checks_dir", WARN, f"cannot read {self.directory}: {exc.strerror or exc}")]
        dir_problem = unsafe(dir_stat) if self.enforce_owner else None
        found = []
        for entry in entries:
            check = self._consider(entry)
            if check is not None and dir_problem is not None and check.refused is None:
                check = CustomCheck(check.name, check.path, f"refused: {self.directory} is {dir_problem}")
            if check is not None:
                found.append(check)
        return found, []

    def _consider(self, entry: os.DirEntry[str]) -> CustomCheck | None:
        """A directory entry as a check, or None when it is not one (said once in the log)."""
        name = entry.name
        if is_leftover(name):
            return None
        try:
            st = entry.stat()  # follows a symbolic link: a link to a check is a check
        except OSError as exc:
            self._tell(name, f"cannot stat it: {exc.strerror or exc}")
            return None
        if not stat.S_ISREG(st.st_mode) or not st.st_mode & 0o111:
            return None  # not executable: how a check is switched off (chmod -x), as with run-parts
        if not NAME_PATTERN.fullmatch(name):
            self._tell(name, "its name is not 1-128 letters, digits, '.', '_', '@' or '-'")
            return None
        path = Path(entry.path)
        problem = unsafe(st) if self.enforce_owner else None
        return CustomCheck(name, path, f"refused: {problem}" if problem else None)

    def _tell(self, name: str, why: str) -> None:
        if name not in self._told:
            self._told.add(name)
            log.warning("checks: %s/%s skipped: %s", self.directory, name[:200], why)

    def run_one(self, check: CustomCheck) -> CheckResult:
        """Run one check and read its verdict. Raises nothing: what goes wrong is the verdict (status 2)."""
        if check.refused is not None:
            return result(check.name, WARN, check.refused)
        try:
            finished = self._run([str(check.path)], self.timeout_s)
        except OSError as exc:
            return result(check.name, WARN, f"cannot run: {exc.strerror or exc}")
        return verdict(check.name, finished, self.timeout_s)


def first_line(output: bytes) -> str:
    """The first non-empty line of a program's output, cleaned and trimmed for a message."""
    for line in output.decode("utf-8", errors="replace").splitlines():
        cleaned = clean_line(line)
        if cleaned:
            return cleaned
    return ""


def verdict(name: str, finished: Finished, timeout_s: float) -> CheckResult:
    """NHC's reading of a finished check: exit 0 pass, 1 fail, anything else (a signal, a timeout) warn."""
    line = first_line(finished.stdout) or first_line(finished.stderr)
    code = finished.returncode
    if code is None:
        return result(name, WARN, f"timed out after {timeout_s:g} s" + (f": {line}" if line else ""))
    if code < 0:
        return result(name, WARN, f"killed by {_signal_name(-code)}" + (f": {line}" if line else ""))
    status: Status = PASS if code == 0 else FAIL if code == 1 else WARN
    return result(name, status, line or ("" if code == 0 else f"exited with {code}"))


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
