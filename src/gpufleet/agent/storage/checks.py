"""The verdict on each required shared mount: mounted is not enough, it must answer.

A path in `required_mounts` that is a shared file system (a type in `shared_types`, or listed in
`shared_mounts`) is probed: hung (no answer within the probe timeout), stale (ESTALE: the server no
longer knows the export) or failing with a transport error fails the check `mount:NAME` (the node is
`failed` and drained until it answers again, like a required mount that is not mounted); a permission
error warns. A required mount of a local type keeps the plain mountinfo check (agent.checks.mounts).
"""

from __future__ import annotations

import errno
import posixpath
from collections.abc import Sequence

from gpufleet.agent.checks.mounts import Mount, mount_check_name
from gpufleet.agent.checks.ports import FAIL, PASS, WARN, result
from gpufleet.agent.storage.collector import shared
from gpufleet.agent.storage.probe import ProbeResult
from gpufleet.agent.storage.source import SHARED_TYPES, StorageSource
from gpufleet.protocol.metrics import CheckResult

# Errors that say the file system is unusable, not that this agent may not look.
_BROKEN = frozenset(
    {errno.EIO, errno.ENOTCONN, errno.ETIMEDOUT, errno.EHOSTDOWN, errno.EHOSTUNREACH, errno.ECONNREFUSED, errno.ENOENT}
)


def server_kind(fstype: str) -> str:
    """What to suspect when a mount of this type does not answer."""
    if fstype.startswith("nfs"):
        return "NFS server"
    if fstype == "lustre":
        return "Lustre server"
    if fstype == "gpfs":
        return "GPFS cluster"
    if fstype.startswith("fuse"):
        return "FUSE daemon"
    return "file server"


def verdict(path: str, mount: Mount, probe: ProbeResult) -> CheckResult:
    """The check result of one probed required mount."""
    name = mount_check_name(path)
    where = f"{mount.fstype} from {mount.source}" if mount.source else mount.fstype
    if probe.state == "ok":
        return result(name, PASS, f"{path} is mounted ({where}), answered in {probe.seconds * 1000:.0f} ms")
    if probe.state == "hung":
        return result(name, FAIL, f"{path}: {probe.message} (hung {server_kind(mount.fstype)}?)")
    if probe.state == "stale":
        return result(name, FAIL, f"{path}: stale file handle (ESTALE): the server no longer knows it; remount")
    severity = FAIL if probe.errno in _BROKEN else WARN
    return result(name, severity, f"{path}: {probe.message or 'error'}")


class StorageChecks:
    """Judges required shared mounts. `judge` is the hook agent.checks.mounts.check_mounts calls on the
    real node; `run` is a whole CheckSource over the StorageSource (the simulator's nodes, which have no
    mountinfo of their own)."""

    def __init__(
        self,
        source: StorageSource,
        *,
        required: Sequence[str] = (),
        shared_mounts: Sequence[str] = (),
        shared_types: Sequence[str] = SHARED_TYPES,
    ) -> None:
        self.source = source
        self.required = [posixpath.normpath(p) for p in required]
        self.shared_mounts = [posixpath.normpath(p) for p in shared_mounts]
        self.shared_types = tuple(shared_types)

    def judge(self, path: str, mount: Mount) -> CheckResult | None:
        """The verdict on a mounted required path, or None when it is not a shared file system."""
        if not shared(path, mount, self.shared_mounts, self.shared_types):
            return None
        return verdict(path, mount, self.source.probe(path))

    def run(self) -> list[CheckResult]:
        """Every required mount: not mounted fails, a shared one is probed, another passes. Raises nothing."""
        if not self.required:
            return []
        try:
            table = self.source.mounts()
        except OSError as exc:
            why = f"cannot read the mount table: {exc.strerror or exc}"
            return [result(mount_check_name(p), WARN, why) for p in self.required]
        out = []
        for path in self.required:
            mount = table.get(path)
            if mount is None:
                out.append(result(mount_check_name(path), FAIL, f"{path} is not mounted"))
                continue
            judged = self.judge(path, mount)
            out.append(judged or result(mount_check_name(path), PASS, f"{path} is mounted ({mount.fstype})"))
        return out
