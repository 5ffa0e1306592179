"""The settings for shared file systems (agent.storage on the nodes, monitoring.storage at the head).

Kept apart from `core.config` like the directory's and the network's; `Settings` inherits these fields,
so they are set like any other (`shared_mounts = ["/shared"]` in the config file, GPUFLEET_SHARED_MOUNTS
in the environment). Which mounts a node must have stays `required_mounts`: a required mount that is a
shared file system (its type in `shared_fs_types`, or listed in `shared_mounts`) must also answer.
"""

from __future__ import annotations

import posixpath
import re

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings

_MOUNT_PATTERN = re.compile(r"/[A-Za-z0-9._@/-]{0,200}")
_FSTYPE_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,31}")
DEFAULT_SHARED_TYPES = [
    "nfs",
    "nfs4",
    "lustre",
    "gpfs",
    "beegfs",
    "wekafs",
    "ceph",
    "fuse.ceph-fuse",
    "cifs",
    "smb3",
    "fuse.glusterfs",
]


def check_mount_paths(value: list[str]) -> list[str]:
    """Mount points normalised, each once. Raises ValueError for one that is not an absolute path of
    letters, digits and `.` `_` `@` `-` (it becomes an entity name and a check name)."""
    paths = []
    for path in value:
        if not _MOUNT_PATTERN.fullmatch(path):
            raise ValueError(f"{path[:80]!r} is not an absolute path of letters, digits and '.', '_', '@', '-'")
        paths.append("/" + posixpath.normpath(path).lstrip("/"))
    return list(dict.fromkeys(paths))


class StorageSettings(BaseSettings):
    # Agent side
    shared_mounts: list[str] = Field(
        default_factory=list,
        description="shared file systems the agent watches whatever their type (mounted or not), beside every"
        " mount of a type in shared_fs_types",
    )
    shared_fs_types: list[str] = Field(
        default_factory=lambda: list(DEFAULT_SHARED_TYPES),
        description="file system types (as mountinfo names them) the agent watches wherever they are mounted",
    )
    storage_probe_timeout_s: float = Field(
        5.0, gt=0, le=300, description="how long a shared mount has to answer stat and statvfs before it is hung"
    )
    storage_detail_interval_s: float = Field(
        60.0, ge=1, le=86400, description="how often the agent runs lctl, lfs df, mmhealth and mmdf"
    )
    # Head side
    storage_fill_alert_pct: float = Field(
        90.0, gt=0, le=100, description="a shared file system this full (space or inodes) fires StorageAlmostFull"
    )
    storage_latency_factor: float = Field(
        5.0,
        gt=1,
        le=1000,
        description="mean time per operation this many times a mount's own baseline on a node fires StorageSlow",
    )

    @field_validator("shared_mounts")
    @classmethod
    def _check_shared_mounts(cls, value: list[str]) -> list[str]:
        return check_mount_paths(value)

    @field_validator("shared_fs_types")
    @classmethod
    def _check_types(cls, value: list[str]) -> list[str]:
        for fstype in value:
            if not _FSTYPE_PATTERN.fullmatch(fstype):
                raise ValueError(f"{fstype[:40]!r} is not a file system type")
        return list(dict.fromkeys(value))
