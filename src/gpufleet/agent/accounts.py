"""Accounts on nodes (`accounts_sync`): the cluster users' local accounts and SSH keys, kept as the head says.

The agent creates each user with the same uid and gid on every node, updates their shell and full
name, and writes their `authorized_keys`. It changes only accounts it created itself: their names
(and the uid each was given) are kept in a state file, and a local account of the same name that
gpufleet did not create, or a uid already taken, is skipped and reported, never touched. A disabled
user, or one the head no longer lists, is locked (password locked, account expired, no keys), not
deleted: their files stay, and re-enabling them unlocks the same account.

Everything goes through `useradd`, `usermod` and `groupadd` (with `--root` for a root other than `/`),
run as argv lists by an injectable runner. What exists is read from the root's `etc/passwd`, `group`
and `shadow`, never from `getent`, which ignores `--root`.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from gpufleet.agent import authorized_keys
from gpufleet.agent.passwd import LocalAccounts, PasswdEntry, ShadowEntry, read_local_accounts
from gpufleet.core.errors import ConfigError, GpufleetError
from gpufleet.protocol.accounts import USERNAME_PATTERN, Account, AccountList

log = logging.getLogger(__name__)

Runner = Callable[[Sequence[str]], None]
# Below 1000 are the distributions' system accounts and groups (root, sudo, docker, ...): a head that
# hands one out is wrong, and joining such a group would grant far more than an account.
MIN_ID = 1000
MAX_ID = 2**31 - 2
SHELL_PATTERN = re.compile(r"/[A-Za-z0-9/._-]{1,127}")
# A home from the head (a directory's homeDirectory) is made by useradd and gets the user's authorized_keys:
# it must end in the user's own name and lie outside the system's trees, or a head (or a directory entry)
# could point it at /root or /etc and plant keys there.
HOME_PATTERN = re.compile(r"/[A-Za-z0-9/._-]{1,255}")
SYSTEM_TREES = frozenset(
    {"bin", "boot", "dev", "etc", "lib", "lib32", "lib64", "proc", "root", "run", "sbin", "sys", "usr", "var"}
)
COMMAND_TIMEOUT_S = 120.0
# Where account tools live when the agent's PATH (a systemd unit's, say) lacks the sbin directories.
_SBIN = "/usr/local/sbin:/usr/sbin:/sbin"


class CommandFailed(GpufleetError):
    """An account command (useradd, usermod, groupadd, groupmod) could not run or exited non-zero."""


class _Skip(Exception):
    """Internal: this account is left alone this pass, for the reason given."""


def run_command(argv: Sequence[str]) -> None:
    """Run one account command from an argv list (never a shell). Raises CommandFailed with its error output."""
    program = shutil.which(argv[0], path=os.environ.get("PATH", "") + ":" + _SBIN) or argv[0]
    try:
        result = subprocess.run(
            [program, *argv[1:]], capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CommandFailed(f"{argv[0]}: {exc}") from None
    if result.returncode != 0:
        lines = (result.stderr or result.stdout).strip().splitlines()
        raise CommandFailed(f"{argv[0]} exited with {result.returncode}: {lines[-1] if lines else 'no message'}")


@dataclass
class SyncReport:
    """What one pass did, by username. `skipped` and `failed` say why; `failed` is retried next pass."""

    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    locked: list[str] = field(default_factory=list)
    unlocked: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.created or self.updated or self.locked or self.unlocked)

    def summary(self) -> str:
        counts = {
            "created": len(self.created),
            "updated": len(self.updated),
            "locked": len(self.locked),
            "unlocked": len(self.unlocked),
            "skipped": len(self.skipped),
            "failed": len(self.failed),
        }
        return ", ".join(f"{n} {what}" for what, n in counts.items() if n) or "no changes"

    def mark_updated(self, name: str) -> None:
        if name not in self.created and name not in self.updated:
            self.updated.append(name)


@dataclass
class ManagedState:
    """The accounts and groups gpufleet created on this node, with the uid or gid it gave each."""

    users: dict[str, int] = field(default_factory=dict)
    groups: dict[str, int] = field(default_factory=dict)


class StateFile:
    """The managed set, in the agent's state directory: JSON, mode 0600, replaced atomically."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> ManagedState:
        """Raises ConfigError when the file exists but cannot be read: then nothing counts as managed."""
        try:
            data = json.loads(self.path.read_text())
            return ManagedState(
                users={str(k): int(v) for k, v in data["users"].items()},
                groups={str(k): int(v) for k, v in data["groups"].items()},
            )
        except FileNotFoundError:
            return ManagedState()
        except OSError as exc:
            raise ConfigError(f"{self.path}: cannot read the managed accounts: {exc.strerror}") from None
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ConfigError(f"{self.path}: corrupt managed-accounts file ({exc}); accounts are not synced") from None

    def save(self, state: ManagedState) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump({"users": state.users, "groups": state.groups}, fh, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        tmp.replace(self.path)


@dataclass(frozen=True)
class _Wanted:
    """One account as it should be on this node, checked."""

    name: str
    uid: int
    gid: int
    gecos: str
    shell: str
    keys: bytes  # the authorized_keys content
    enabled: bool
    home: str  # where useradd makes it; an existing account's home is never moved


def gecos(full_name: str) -> str:
    """The full name as a passwd comment: `:` and control characters would break the file's lines."""
    return "".join(" " if c == ":" or ord(c) < 32 or ord(c) == 127 else c for c in full_name).strip()


def check_account(account: Account) -> tuple[_Wanted, list[str]]:
    """The account as this node will apply it, and notes on keys left out. Raises _Skip for a bad account."""
    if not USERNAME_PATTERN.fullmatch(account.username):
        raise _Skip("not a valid username (lowercase letters, digits, '_', '-'; at most 32)")
    for what, value in (("uid", account.uid), ("gid", account.gid)):
        if not MIN_ID <= value <= MAX_ID:
            raise _Skip(f"{what} {value} is outside {MIN_ID}..{MAX_ID}")
    shell = account.shell
    if not SHELL_PATTERN.fullmatch(shell) or ".." in PurePosixPath(shell).parts:
        raise _Skip(f"not a valid shell: {shell[:60]!r}")
    home = account.home or f"/home/{account.username}"
    parts = PurePosixPath(home).parts
    if (
        not HOME_PATTERN.fullmatch(home)
        or ".." in parts
        or len(parts) < 3
        or parts[1] in SYSTEM_TREES
        or parts[-1] != account.username
    ):
        raise _Skip(
            f"not a home directory it may have: {home[:60]!r} (/SOMEWHERE/{account.username}, not in /etc, /root...)"
        )
    keys, dropped = authorized_keys.render(account.ssh_keys if account.enabled else [])
    wanted = _Wanted(
        account.username, account.uid, account.gid, gecos(account.full_name), shell, keys, account.enabled, home
    )
    return wanted, [f"{account.username}: {note}" for note in dropped]


class AccountSync:
    """Applies the head's account list to one root directory (`/` in production)."""

    def __init__(self, root: Path, state_path: Path, runner: Runner = run_command) -> None:
        self.root = root
        self.state = StateFile(state_path)
        self.runner = runner
        # One pass at a time: a pass cancelled with its channel keeps running in its thread.
        self._lock = threading.Lock()

    def apply(self, listing: AccountList) -> SyncReport:
        """Create, update, lock or unlock the managed accounts so they match `listing`.

        A bad entry is skipped and one that fails is reported; neither stops the others. Raises
        ConfigError when the root's account files or the state file cannot be read: nothing is changed then.
        """
        with self._lock:
            return _Pass(self, read_local_accounts(self.root), self.state.load()).run(listing)


class _Pass:
    """One application of a list: the local view and the managed set, updated as commands succeed."""

    def __init__(self, sync: AccountSync, local: LocalAccounts, managed: ManagedState) -> None:
        self.sync = sync
        self.local = local
        self.managed = managed
        self.report = SyncReport()

    def run(self, listing: AccountList) -> SyncReport:
        seen: set[str] = set()
        uids: dict[int, str] = {}
        for account in listing.accounts:
            try:
                wanted = self._check(account, seen, uids)
            except _Skip as skip:
                self.report.skipped[account.username] = str(skip)
                continue
            self._guarded(wanted.name, functools.partial(self._converge, wanted))
        listed = {account.username for account in listing.accounts}
        for name in sorted(set(self.managed.users) - listed):
            self._guarded(name, functools.partial(self._retire, name))
        self.sync.state.save(self.managed)
        return self.report

    def _check(self, account: Account, seen: set[str], uids: dict[int, str]) -> _Wanted:
        """The account checked, and the first in the list with its name and uid. Raises _Skip."""
        if account.username in seen:
            raise _Skip("listed twice: only the first entry counts")
        seen.add(account.username)
        wanted, notes = check_account(account)
        if wanted.uid in uids:
            raise _Skip(f"uid {wanted.uid} is listed for {uids[wanted.uid]} as well")
        uids[wanted.uid] = wanted.name
        self.report.notes.extend(notes)
        return wanted

    def _guarded(self, name: str, step: Callable[[], None]) -> None:
        """Run one account's step; a failure is reported and the local view re-read, and the pass goes on."""
        try:
            step()
        except _Skip as skip:
            self.report.skipped[name] = str(skip)
        except (CommandFailed, OSError) as exc:
            self.report.failed[name] = str(exc)
            log.warning("accounts: %s: %s", name, exc)
            # A failed command may have done part of its work: believe the files, not the memory.
            self.local = read_local_accounts(self.sync.root)
            if name not in self.local.users:
                self.managed.users.pop(name, None)
            if name not in self.local.groups:
                self.managed.groups.pop(name, None)

    # -- commands -----------------------------------------------------------------------------------
    def _run(self, program: str, *args: str) -> None:
        root = [] if self.sync.root == Path("/") else ["--root", str(self.sync.root)]
        self.sync.runner([program, *root, *args])

    def _home(self, entry: PasswdEntry) -> Path:
        home = PurePosixPath(entry.home)
        if not home.is_absolute() or ".." in home.parts:
            raise _Skip(f"home directory {entry.home!r} is not a plain absolute path")
        return self.sync.root.joinpath(*home.parts[1:])

    # -- one listed account -------------------------------------------------------------------------
    def _converge(self, want: _Wanted) -> None:
        entry = self.local.users.get(want.name)
        if entry is None:
            if want.enabled:
                self._create(want)
            else:
                self.managed.users.pop(want.name, None)  # gone locally and disabled: nothing to keep
            return
        given = self.managed.users.get(want.name)
        if given is None:
            raise _Skip("a local account of this name exists that gpufleet did not create")
        if entry.uid not in (given, want.uid):
            raise _Skip(f"the local account now has uid {entry.uid}, not the {given} gpufleet gave it")
        self._update(entry, want)
        if want.enabled:
            self._unlock(want.name)
        else:
            self._lock(want.name)
        current = self.local.users[want.name]
        changed = self._keys(current, want.uid, want.gid, want.keys, create_home=want.enabled)
        if changed and want.name not in self.report.locked and want.name not in self.report.unlocked:
            self.report.mark_updated(want.name)  # locking empties the keys, unlocking restores them

    def _create(self, want: _Wanted) -> None:
        owner = self.local.uid_owner(want.uid)
        if owner is not None:
            raise _Skip(f"uid {want.uid} belongs to the local account {owner}")
        self._ensure_group(want)
        # Recorded before useradd: a crash after it must not leave an account gpufleet no longer knows.
        self.managed.users[want.name] = want.uid
        self.sync.state.save(self.managed)
        home = want.home
        self._run(
            "useradd", "-u", str(want.uid), "-g", str(want.gid), "-s", want.shell, "-c", want.gecos,
            "-m", "-d", home, "-p", "*", want.name,
        )  # fmt: skip
        # `*`: no password that works, yet not locked (sshd refuses key logins to a `!` account without PAM).
        entry = PasswdEntry(want.name, want.uid, want.gid, want.gecos, home, want.shell)
        self.local.put_user(entry)
        self.local.shadow[want.name] = ShadowEntry(want.name, "*", "")
        self.report.created.append(want.name)
        self._keys(entry, want.uid, want.gid, want.keys, create_home=True)

    def _update(self, entry: PasswdEntry, want: _Wanted) -> None:
        args: list[str] = []
        if entry.uid != want.uid:
            owner = self.local.uid_owner(want.uid)
            if owner is not None and owner != want.name:
                raise _Skip(f"uid {want.uid} belongs to the local account {owner}")
            args += ["-u", str(want.uid)]
        if entry.gid != want.gid:
            self._ensure_group(want)
            args += ["-g", str(want.gid)]
        if entry.shell != want.shell:
            args += ["-s", want.shell]
        if entry.gecos != want.gecos:
            args += ["-c", want.gecos]
        if not args:
            return
        self._run("usermod", *args, want.name)
        self.local.put_user(PasswdEntry(want.name, want.uid, want.gid, want.gecos, entry.home, want.shell))
        self.managed.users[want.name] = want.uid
        self.report.mark_updated(want.name)

    def _ensure_group(self, want: _Wanted) -> None:
        """Make sure the gid exists: a new group named after the user, or gpufleet's own group moved to it."""
        if self.local.gid_owner(want.gid) is not None:
            return
        existing = self.local.groups.get(want.name)
        if existing is None:
            self.managed.groups[want.name] = want.gid
            self.sync.state.save(self.managed)
            self._run("groupadd", "-g", str(want.gid), want.name)
        elif self.managed.groups.get(want.name) == existing:
            self._run("groupmod", "-g", str(want.gid), want.name)
            self.managed.groups[want.name] = want.gid
        else:
            raise _Skip(f"gid {want.gid} does not exist and the local group {want.name} has gid {existing}")
        self.local.put_group(want.name, want.gid)

    # -- locking ------------------------------------------------------------------------------------
    def _lock(self, name: str) -> None:
        shadow = self.local.shadow.get(name)
        if shadow is not None and shadow.locked:
            return
        self._run("usermod", "-L", "-e", "1", name)
        password = shadow.password if shadow is not None else ""
        self.local.shadow[name] = ShadowEntry(name, password if password.startswith("!") else "!" + password, "1")
        self.report.locked.append(name)

    def _unlock(self, name: str) -> None:
        shadow = self.local.shadow.get(name)
        if shadow is None or shadow.usable:
            return
        password = shadow.password.lstrip("!")
        # usermod -U refuses (and exits 0) when unlocking would leave an empty password: set `*` then.
        self._run("usermod", *(["-U"] if password else ["-p", "*"]), "-e", "", name)
        self.local.shadow[name] = ShadowEntry(name, password or "*", "")
        self.report.unlocked.append(name)

    def _retire(self, name: str) -> None:
        """A managed account the head no longer lists: lock it and empty its keys, keep its files."""
        entry = self.local.users.get(name)
        given = self.managed.users[name]
        if entry is None:
            del self.managed.users[name]  # removed locally: nothing left to lock
            return
        if entry.uid != given:
            del self.managed.users[name]
            raise _Skip(f"the local account now has uid {entry.uid}, not the {given} gpufleet gave it; forgotten")
        self._lock(name)
        self._keys(entry, entry.uid, entry.gid, authorized_keys.render([])[0], create_home=False)

    def _keys(self, entry: PasswdEntry, uid: int, gid: int, content: bytes, *, create_home: bool) -> bool:
        """Install the keys; a locked account without a home has no keys to clear."""
        home = self._home(entry)
        if not create_home and not home.exists():
            return False
        try:
            return authorized_keys.install(home, uid, gid, content, create_home=create_home)
        except FileNotFoundError:
            self.report.notes.append(f"{entry.name}: {home} cannot be created (no parent directory); no keys")
            return False
