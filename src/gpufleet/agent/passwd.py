"""The local account database under a root directory: `etc/passwd`, `etc/group` and `etc/shadow`.

Read from the files, never through `getent`: NSS ignores `useradd --root`, and it would also answer
with directory (LDAP, SSSD) users that are not local accounts at all.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.core.errors import ConfigError


@dataclass(frozen=True)
class PasswdEntry:
    name: str
    uid: int
    gid: int
    gecos: str
    home: str
    shell: str


@dataclass(frozen=True)
class ShadowEntry:
    name: str
    password: str  # the hash, or `*`/`!`: a leading `!` is a locked password
    expire: str  # days since the epoch, as written; empty: never; "1": expired (how gpufleet locks)

    @property
    def locked(self) -> bool:
        """Locked the way gpufleet locks: password locked and account expired."""
        return self.password.startswith("!") and self.expire == "1"

    @property
    def usable(self) -> bool:
        """Neither the password locked nor an expiry set: what an enabled account looks like."""
        return not self.password.startswith("!") and self.expire == ""


@dataclass
class LocalAccounts:
    """What the node's files say, kept up to date in memory as commands succeed."""

    users: dict[str, PasswdEntry] = field(default_factory=dict)
    groups: dict[str, int] = field(default_factory=dict)  # name -> gid
    shadow: dict[str, ShadowEntry] = field(default_factory=dict)
    _uid_owner: dict[int, str] = field(default_factory=dict)
    _gid_owner: dict[int, str] = field(default_factory=dict)

    def put_user(self, entry: PasswdEntry) -> None:
        old = self.users.get(entry.name)
        if old is not None and self._uid_owner.get(old.uid) == old.name:
            del self._uid_owner[old.uid]
        self.users[entry.name] = entry
        self._uid_owner.setdefault(entry.uid, entry.name)

    def put_group(self, name: str, gid: int) -> None:
        old = self.groups.get(name)
        if old is not None and self._gid_owner.get(old) == name:
            del self._gid_owner[old]
        self.groups[name] = gid
        self._gid_owner.setdefault(gid, name)

    def uid_owner(self, uid: int) -> str | None:
        """The (first) account with this uid, if any."""
        return self._uid_owner.get(uid)

    def gid_owner(self, gid: int) -> str | None:
        """The (first) group with this gid, if any."""
        return self._gid_owner.get(gid)


def _records(path: Path, fields: int, *, required: bool) -> list[list[str]]:
    """The colon-separated records of one file; comments, NIS `+`/`-` lines and malformed lines are left out."""
    try:
        text = path.read_text(encoding="utf-8", errors="surrogateescape")
    except FileNotFoundError:
        if required:
            raise ConfigError(f"{path} does not exist: is accounts_root the root of a system?") from None
        return []
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    records = []
    for line in text.splitlines():
        if not line or line.startswith(("#", "+", "-")):
            continue
        parts = line.split(":")
        if len(parts) >= fields:
            records.append(parts)
    return records


def read_local_accounts(root: Path) -> LocalAccounts:
    """Parse `root/etc/passwd`, `group` and `shadow`. Raises ConfigError if passwd or group cannot be read."""
    local = LocalAccounts()
    for name, _, uid, gid, gecos, home, shell, *_ in _records(root / "etc" / "passwd", 7, required=True):
        if uid.isdigit() and gid.isdigit():
            local.put_user(PasswdEntry(name, int(uid), int(gid), gecos, home, shell))
    for name, _, gid, *_ in _records(root / "etc" / "group", 4, required=True):
        if gid.isdigit():
            local.put_group(name, int(gid))
    for parts in _records(root / "etc" / "shadow", 8, required=False):
        local.shadow[parts[0]] = ShadowEntry(parts[0], parts[1], parts[7])
    return local
