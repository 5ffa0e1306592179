"""A backup's manifest: what the archive holds, where each member goes back to, and its checksum.

The archive (tar.gz) holds `manifest.json` first, then its members:

- `database/gpufleet.sqlite` (SQLite's online backup) or `database/gpufleet.pgdump` (`pg_dump --format=custom`);
- `data/REL`: a file or directory at REL under the head's data directory (the TLS directory, the secrets
  key `bmc.key`, the admins' job templates and burn-in profiles), restored at REL under the new one;
- `settings/NAME`: a file a path setting names outside those (`bmc_key_file`, `tls_cert`, `tls_key`,
  `tls_ca`), restored where the restoring head's setting points, else at its default place under the
  data directory.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from gpufleet.core.errors import InvalidInput

FORMAT = 1
MANIFEST = "manifest.json"
DATABASE_MEMBERS = {"sqlite": "database/gpufleet.sqlite", "postgresql": "database/gpufleet.pgdump"}
DATA_PREFIX = "data/"
SETTINGS_PREFIX = "settings/"
# Path settings whose file a backup carries when it lies outside the data directory's backed-up parts,
# and where a restore puts it when the restoring head leaves the setting unset (under its data directory).
SETTING_DEFAULTS = {
    "bmc_key_file": "bmc.key",
    "tls_cert": "tls/server.pem",
    "tls_key": "tls/server.key",
    "tls_ca": "tls/ca.pem",
}
_MAX_MANIFEST_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class Entry:
    """One archive member: a regular file (size, sha256) or a directory, with its permission bits."""

    member: str
    kind: Literal["file", "dir"]
    mode: int
    size: int = 0
    sha256: str = ""

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"member": self.member, "kind": self.kind, "mode": f"{self.mode:04o}"}
        if self.kind == "file":
            out |= {"size": self.size, "sha256": self.sha256}
        return out


@dataclass(frozen=True)
class Manifest:
    gpufleet_version: str
    alembic_revision: str
    created_at: str  # ISO 8601, UTC
    database: Literal["sqlite", "postgresql"]
    source_host: str
    source_data_dir: str
    entries: tuple[Entry, ...]
    not_included: tuple[str, ...] = field(default=())
    format: int = FORMAT

    @property
    def database_member(self) -> str:
        return DATABASE_MEMBERS[self.database]

    def as_dict(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "gpufleet_version": self.gpufleet_version,
            "alembic_revision": self.alembic_revision,
            "created_at": self.created_at,
            "database": self.database,
            "source": {"host": self.source_host, "data_dir": self.source_data_dir},
            "entries": [e.as_dict() for e in self.entries],
            "not_included": list(self.not_included),
        }

    def to_bytes(self) -> bytes:
        return (json.dumps(self.as_dict(), indent=2) + "\n").encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Manifest:
        """The manifest in `data`. Raises InvalidInput when it is not one this gpufleet can read."""
        if len(data) > _MAX_MANIFEST_BYTES:
            raise InvalidInput("not a gpufleet backup: its manifest is too large")
        try:
            raw = json.loads(data)
            fmt = int(raw["format"])
            if fmt > FORMAT:
                raise InvalidInput(
                    f"the backup's format is {fmt}, newer than this gpufleet reads ({FORMAT}): restore it with"
                    f" gpufleet {raw.get('gpufleet_version', '?')} or later"
                )
            database = raw["database"]
            if database not in DATABASE_MEMBERS:
                raise InvalidInput(f"not a gpufleet backup: unknown database kind {database!r}")
            entries = tuple(_entry(e) for e in raw["entries"])
            manifest = cls(
                gpufleet_version=str(raw["gpufleet_version"]),
                alembic_revision=str(raw["alembic_revision"]),
                created_at=str(raw["created_at"]),
                database=database,
                source_host=str(raw["source"]["host"]),
                source_data_dir=str(raw["source"]["data_dir"]),
                entries=entries,
                not_included=tuple(str(x) for x in raw.get("not_included", [])),
                format=fmt,
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise InvalidInput(f"not a gpufleet backup: its manifest is malformed ({exc!r})") from None
        names = [e.member for e in entries]
        if len(set(names)) != len(names):
            raise InvalidInput("not a gpufleet backup: its manifest names a member twice")
        if manifest.database_member not in names:
            raise InvalidInput("not a gpufleet backup: its manifest names no database")
        return manifest


def _entry(raw: dict[str, Any]) -> Entry:
    kind = raw["kind"]
    if kind not in ("file", "dir"):
        raise ValueError(f"unknown kind {kind!r}")
    mode = int(raw["mode"], 8)
    if not 0 <= mode <= 0o777:
        raise ValueError(f"bad mode {raw['mode']!r}")
    member = check_member(str(raw["member"]))
    if kind == "file":
        size, digest = int(raw["size"]), str(raw["sha256"])
        if size < 0 or len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise ValueError(f"bad size or checksum for {member!r}")
        return Entry(member, "file", mode, size, digest)
    return Entry(member, "dir", mode)


def check_member(member: str) -> str:
    """`member` if it is a name a backup may hold: the database, data/REL or settings/NAME, with no
    absolute path, `..` or empty part (so no member can be written outside its target). Raises ValueError."""
    if member in DATABASE_MEMBERS.values():
        return member
    if member.startswith(SETTINGS_PREFIX) and member.removeprefix(SETTINGS_PREFIX) in SETTING_DEFAULTS:
        return member
    if member.startswith(DATA_PREFIX):
        rel = member.removeprefix(DATA_PREFIX)
        parts = rel.split("/")
        if rel and "\\" not in rel and "\0" not in rel and all(p not in ("", ".", "..") for p in parts):
            return member
    raise ValueError(f"member {member[:200]!r} is not one a gpufleet backup holds")


def data_target(member: str, data_dir: Path) -> Path:
    """Where a `data/REL` member goes under `data_dir`."""
    return data_dir.joinpath(*PurePosixPath(member.removeprefix(DATA_PREFIX)).parts)
