"""Required mounts: each path must be a mount point, as `/proc/self/mountinfo` lists them.

The kernel's mount table is read rather than each path stat()ed (as `os.path.ismount` does): a
stat on a hung NFS mount blocks in the kernel, uninterruptibly, and would hang the round.
The path is compared as given, not resolved (resolving would stat it too).
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpufleet.agent.checks.ports import FAIL, PASS, WARN, result
from gpufleet.protocol.metrics import CheckResult

MOUNTINFO = Path("/proc/self/mountinfo")
_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")


@dataclass(frozen=True)
class Mount:
    fstype: str
    read_only: bool
    source: str = ""  # mountinfo's mount source: `server:/export`, `/dev/sda1`, a GPFS device name


def mount_check_name(path: str) -> str:
    """`mount:home` for `/home`, `mount:scratch-a` for `/scratch/a`, `mount:-` for `/`: a path's slashes
    as systemd writes them in mount unit names, since a check name has no `/`."""
    inner = posixpath.normpath(path).strip("/")
    return "mount:" + (inner.replace("/", "-") or "-")


def read_mountinfo(text: str) -> dict[str, Mount]:
    """Mount points and their filesystem types, from mountinfo's text (the topmost mount wins)."""
    mounts: dict[str, Mount] = {}
    for line in text.splitlines():
        # ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTIONS
        fields = line.split()
        if len(fields) < 7 or "-" not in fields[6:]:
            continue
        after = fields.index("-", 6)
        if after + 1 >= len(fields):
            continue
        point = _OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), fields[4])
        source = (
            _OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), fields[after + 2]) if after + 2 < len(fields) else ""
        )
        mounts[point] = Mount(fstype=fields[after + 1], read_only="ro" in fields[5].split(","), source=source)
    return mounts


def check_mounts(
    paths: list[str],
    mountinfo: Path = MOUNTINFO,
    judge: Callable[[str, Mount], CheckResult | None] | None = None,
) -> list[CheckResult]:
    """One result per required path: mounted passes (the message names the filesystem type), not
    mounted fails. An unreadable mount table warns for every path. `judge` (agent.storage.checks) may
    give a mounted path its own verdict instead (a shared file system probed: hung, stale); None from it
    keeps the plain one. Raises nothing."""
    if not paths:
        return []
    try:
        mounts = read_mountinfo(mountinfo.read_text(encoding="utf-8", errors="replace"))
    except OSError as exc:
        why = f"cannot read {mountinfo}: {exc.strerror or exc}"
        return [result(mount_check_name(p), WARN, why) for p in paths]
    results = []
    for path in paths:
        mount = mounts.get(posixpath.normpath(path))
        if mount is None:
            results.append(result(mount_check_name(path), FAIL, f"{path} is not mounted"))
        else:
            judged = judge(posixpath.normpath(path), mount) if judge is not None else None
            if judged is not None:
                results.append(judged)
                continue
            how = f"{mount.fstype}, read-only" if mount.read_only else mount.fstype
            results.append(result(mount_check_name(path), PASS, f"{path} is mounted ({how})"))
    return results
