"""Where the storage collector and checks read from: the real node (`HostStorage`) or a simulated one.

Every method raises nothing but what it says; a program that is not installed simply means the node has
no file system of that kind (None), never an error.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from gpufleet.agent.checks.mounts import MOUNTINFO, Mount, read_mountinfo
from gpufleet.agent.checks.process import CLEAN_ENV, Finished, run_bounded
from gpufleet.agent.storage.gpfs import MM_DIR
from gpufleet.agent.storage.lustre import LCTL_PARAMS
from gpufleet.agent.storage.probe import MountProber, ProbeResult
from gpufleet.core.config_storage import DEFAULT_SHARED_TYPES

log = logging.getLogger(__name__)

MOUNTSTATS = Path("/proc/self/mountstats")
PROGRAM_PATH = f"{CLEAN_ENV['PATH']}:{MM_DIR}"
# Shared (network or cluster) file systems by their mountinfo type: watched wherever they are mounted.
SHARED_TYPES: tuple[str, ...] = tuple(DEFAULT_SHARED_TYPES)


class StorageSource(Protocol):
    """What the node's shared file systems look like from here."""

    def mounts(self) -> dict[str, Mount]:
        """The mount table by mount point. Raises OSError when it cannot be read."""
        ...

    def probe(self, path: str) -> ProbeResult:
        """stat and statvfs of a mount point within the probe timeout. Raises nothing."""
        ...

    def mountstats(self) -> str | None:
        """/proc/self/mountstats' text; None where it cannot be read."""
        ...

    def lustre_params(self) -> str | None:
        """`lctl get_param` of the import states and llite stats; None without lctl or on failure."""
        ...

    def lustre_df(self, mountpoint: str) -> str | None:
        """`lfs df --lazy MOUNTPOINT`; None without lfs or on failure."""
        ...

    def gpfs_health(self) -> str | None:
        """`mmhealth node show -Y`; None without GPFS or on failure."""
        ...

    def gpfs_df(self, device: str) -> str | None:
        """`mmdf DEVICE -Y`; None without GPFS or on failure."""
        ...


class HostStorage:
    """The real node: its mountinfo and mountstats, a `MountProber`, and Lustre's and GPFS's programs run
    with argument lists, a clean environment and `command_timeout_s` (their process group killed after)."""

    def __init__(
        self,
        prober: MountProber,
        *,
        command_timeout_s: float = 10.0,
        mountinfo: Path = MOUNTINFO,
        mountstats_path: Path = MOUNTSTATS,
        run: Callable[[list[str], float], Finished] = run_bounded,
    ) -> None:
        self.prober = prober
        self.command_timeout_s = command_timeout_s
        self.mountinfo = mountinfo
        self.mountstats_path = mountstats_path
        self._run = run
        self._told: set[str] = set()

    def mounts(self) -> dict[str, Mount]:
        return read_mountinfo(self.mountinfo.read_text(encoding="utf-8", errors="replace"))

    def probe(self, path: str) -> ProbeResult:
        return self.prober.probe(path)

    def mountstats(self) -> str | None:
        try:
            return self.mountstats_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None

    def lustre_params(self) -> str | None:
        return self._program("lctl", ["get_param", *LCTL_PARAMS])

    def lustre_df(self, mountpoint: str) -> str | None:
        return self._program("lfs", ["df", "--lazy", "--", mountpoint])

    def gpfs_health(self) -> str | None:
        return self._program("mmhealth", ["node", "show", "-Y"])

    def gpfs_df(self, device: str) -> str | None:
        return self._program("mmdf", [device, "-Y"])

    def _program(self, name: str, args: Sequence[str]) -> str | None:
        program = shutil.which(name, path=PROGRAM_PATH)
        if program is None:
            return None
        try:
            finished = self._run([program, *args], self.command_timeout_s)
        except OSError as exc:
            self._tell(name, f"cannot run: {exc.strerror or exc}")
            return None
        if finished.timed_out:
            self._tell(name, f"no answer within {self.command_timeout_s:g} s")
            return None
        if finished.returncode != 0:
            self._tell(name, f"exited with {finished.returncode}")
            return None
        return finished.stdout.decode("utf-8", "replace")

    def _tell(self, name: str, why: str) -> None:
        if name not in self._told:  # once: a node where lfs keeps failing must not flood the log
            self._told.add(name)
            log.warning("storage: %s %s", name, why)
