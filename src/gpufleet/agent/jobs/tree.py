"""A rank's whole process tree, found and signalled: `ProcessTree`.

Leftover processes would hold the GPUs, so a rank ends only when none of its processes is left. The
tree is every process in the rank's session, every descendant of those (which catches children that
called setsid while their parent lives), every process seen in an earlier look (the executor looks
every `track_s`, which catches them after their parent died) and, where a cgroup holds the rank,
everything in it. Without a cgroup, one gap remains: a process that calls setsid and whose parent
exits before the next look. How the tree is ended (SIGTERM, a grace period, SIGKILL, podman's own
kill) is the executor's part, in `process`.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterable
from pathlib import Path

import psutil

from gpufleet.agent.jobs.cgroups import cgroup_pids

# One look at a time: psutil's process cache is shared by every rank, and a tree by its tracker and its stop.
_scan_lock = threading.Lock()


class ProcessTree:
    """Every process of one rank that can be found (see the module's docstring), remembered between looks.

    With `follow` False only the session counts: podman's client is in it, while the container's
    processes run under conmon, which leaves the session (and is ended by podman, not by signals here).
    """

    def __init__(self, sid: int, cgroup: Path | None = None, *, follow: bool = True) -> None:
        self.sid = sid
        self.cgroup = cgroup
        self.follow = follow
        self._known: dict[int, psutil.Process] = {}

    def look(self) -> list[psutil.Process]:
        """Scan /proc (blocking: a few milliseconds) and return the rank's processes that still live."""
        with _scan_lock:
            return self._look()

    def _look(self) -> list[psutil.Process]:
        procs = {proc.pid: proc for proc in psutil.process_iter(["ppid", "status"])}
        children: dict[int, list[int]] = {}
        for proc in procs.values():
            children.setdefault(proc.info["ppid"], []).append(proc.pid)
        seeds = [pid for pid in procs if _session(pid) == self.sid]
        seeds += cgroup_pids(self.cgroup)
        # A remembered pid counts only while it is the same process (psutil compares creation times).
        seeds += [pid for pid, proc in self._known.items() if procs.get(pid) == proc]
        found: set[int] = set()
        while seeds:
            pid = seeds.pop()
            if pid not in found and pid in procs:
                found.add(pid)
                if self.follow:
                    seeds += children.get(pid, [])
        self._known = {pid: procs[pid] for pid in found if procs[pid].info["status"] != psutil.STATUS_ZOMBIE}
        return list(self._known.values())

    def signal(self, procs: Iterable[psutil.Process], signum: int) -> None:
        """Send `signum` to the rank's process group and to each of `procs`."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.sid, signum)
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signum)


def _session(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None
