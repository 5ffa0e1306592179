"""cgroup v2 limits for ranks: the parent cgroup the agent sets up where the node allows it
(`CgroupParent.detect`), one child per rank with `memory.max` and `cpu.max`, and the reads and writes
that list, kill and remove what a rank's cgroup holds.

Where the hierarchy is cgroup v1 or hybrid, or not writable, there is no parent and the limits are not
enforced (the executor says so in the rank's result). RLIMIT_AS is no substitute: CUDA reserves far
more address space than it uses.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CgroupParent:
    """A cgroup v2 directory whose children may use the cpu and memory controllers; one child per rank."""

    path: Path

    @classmethod
    def detect(cls, root: Path = Path("/sys/fs/cgroup"), name: str = "gpufleet") -> CgroupParent | None:
        """`root/name`, set up for rank cgroups, when `root` is a writable cgroup v2 hierarchy offering cpu
        and memory; None otherwise (cgroup v1, a hybrid hierarchy, not root), logged."""
        try:
            offered = (root / "cgroup.controllers").read_text().split()
        except OSError:
            log.info("no cgroup v2 hierarchy at %s: job cpu and memory limits are not enforced", root)
            return None
        if not {"cpu", "memory"} <= set(offered):
            log.info("cgroup v2 at %s lacks cpu or memory (%s): job limits are not enforced", root, " ".join(offered))
            return None
        parent = root / name
        try:
            # The root cgroup may hand controllers down although it holds processes; `parent` holds
            # none (only rank cgroups), so it may too.
            (root / "cgroup.subtree_control").write_text("+cpu +memory")
            parent.mkdir(exist_ok=True)
            (parent / "cgroup.subtree_control").write_text("+cpu +memory")
        except OSError as exc:
            log.info("cannot set up the cgroup %s (%s): job limits are not enforced", parent, exc)
            return None
        return cls(parent)

    def create(self, name: str, cpus: int, mem_mib: int) -> Path:
        """A child cgroup `name` limited to `cpus` CPUs and `mem_mib` MiB (0: no limit). Raises OSError."""
        path = self.path / name
        path.mkdir(exist_ok=True)
        if mem_mib:
            (path / "memory.max").write_text(str(mem_mib * 1024 * 1024))
        if cpus:
            period = 100_000  # microseconds; `cpus` full periods per period is `cpus` CPUs
            (path / "cpu.max").write_text(f"{cpus * period} {period}")
        return path


def cgroup_pids(path: Path | None) -> list[int]:
    """The processes in a cgroup (none when there is no cgroup or it is gone)."""
    if path is None:
        return []
    try:
        text = (path / "cgroup.procs").read_text()
    except OSError:
        return []
    return [int(word) for word in text.split() if word.isdigit() and int(word) > 1]


def cgroup_kill(path: Path) -> None:
    """Kill everything in the cgroup at once, where the kernel has cgroup.kill (5.14+)."""
    kill = path / "cgroup.kill"
    if kill.exists():
        with contextlib.suppress(OSError):
            kill.write_text("1")


def cgroup_remove(path: Path) -> None:
    """Remove an emptied rank cgroup; a failure is only logged (an empty cgroup costs little)."""
    try:
        path.rmdir()
    except OSError as exc:
        log.warning("could not remove the job cgroup %s: %s", path, exc)
