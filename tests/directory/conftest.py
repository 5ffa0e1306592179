"""A real OpenLDAP directory for the directory tests: Debian's slapd started by scripts/services/ldap.sh, one
instance per xdist worker on ports of its own, seeded with alice, bob, carol and dave (dave locked) and groups
of both kinds (groupOfNames with member DNs, posixGroup with memberUid).

`ldap_server` is the session's directory; tests that change it do so through `ldap_edit`, which undoes every
change after the test, so the seed is what each test starts from.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from ldap3 import BASE, HASHED_SALTED_SHA, MODIFY_ADD, MODIFY_DELETE, MODIFY_REPLACE, Connection, Server
from ldap3.utils.hashed import hashed

from gpufleet.directory.ldap import LdapConfig, LdapDirectory, VerifiedTls
from tests.directory.oidc_fixtures import oidc_provider  # noqa: F401 - the provider, one per worker, for every module here
from tests.services import SCRIPTS, install_tools, need

SCRIPT = SCRIPTS / "ldap.sh"
LDAP_PORT = 18400  # + 2 * the xdist worker's index; + 1 for its spare instance (ldap_spare)
LDAPS_PORT = 18600
LOCKED = "000001010000Z"  # pwdAccountLockedTime: locked until an admin unlocks (OpenLDAP ppolicy)


def _worker_index(worker_id: str) -> int:
    return int(worker_id[2:]) if worker_id.startswith("gw") else 0


def _service(command: str, env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), command],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, **env},
    )


@dataclass(frozen=True)
class LdapServer:
    """One running slapd from ldap.sh: what its env file says, and admin (rootdn) access to change it."""

    url: str  # ldap://127.0.0.1:PORT, StartTLS offered
    ldaps_url: str
    ca_file: Path
    base_dn: str
    user_base: str
    group_base: str
    bind_dn: str  # the read-only service account
    bind_password: str
    admin_dn: str
    admin_password: str
    passwords: Mapping[str, str]  # the seeded users' passwords: alice -> alice-pw
    state_dir: Path
    service_env: Mapping[str, str] = field(repr=False)  # what ldap.sh start/stop was run with

    @classmethod
    def from_env_file(cls, path: Path, service_env: Mapping[str, str]) -> LdapServer:
        values = dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
        passwords = dict(pair.split(":", 1) for pair in values["GPUFLEET_LDAP_USER_PASSWORDS"].split(","))
        return cls(
            url=values["GPUFLEET_LDAP_URL"],
            ldaps_url=values["GPUFLEET_LDAPS_URL"],
            ca_file=Path(values["GPUFLEET_LDAP_CA_FILE"]),
            base_dn=values["GPUFLEET_LDAP_BASE_DN"],
            user_base=values["GPUFLEET_LDAP_USER_BASE"],
            group_base=values["GPUFLEET_LDAP_GROUP_BASE"],
            bind_dn=values["GPUFLEET_LDAP_BIND_DN"],
            bind_password=values["GPUFLEET_LDAP_BIND_PASSWORD"],
            admin_dn=values["GPUFLEET_LDAP_ADMIN_DN"],
            admin_password=values["GPUFLEET_LDAP_ADMIN_PASSWORD"],
            passwords=passwords,
            state_dir=Path(values["GPUFLEET_LDAP_STATE"]),
            service_env=dict(service_env),
        )

    def config(self, **overrides: Any) -> LdapConfig:
        """gpufleet's settings for this directory (StartTLS with its CA), with `overrides` applied."""
        base = LdapConfig(
            urls=(self.url,),
            ca_file=self.ca_file,
            bind_dn=self.bind_dn,
            bind_password=self.bind_password,
            user_base=self.user_base,
            group_base=self.group_base,
        )
        return replace(base, **overrides)

    def directory(self, **overrides: Any) -> LdapDirectory:
        return LdapDirectory(self.config(**overrides))

    def user_dn(self, username: str) -> str:
        return f"uid={username},{self.user_base}"

    def group_dn(self, group: str) -> str:
        return f"cn={group},{self.group_base}"

    @contextmanager
    def admin(self) -> Iterator[Connection]:
        """A connection bound as the rootdn (ACLs do not apply), over StartTLS with the CA."""
        host, port = self.url.removeprefix("ldap://").rsplit(":", 1)
        tls = VerifiedTls(self.ca_file.read_text())
        conn = Connection(
            Server(host, port=int(port), tls=tls, get_info="NO_INFO"),
            user=self.admin_dn,
            password=self.admin_password,
            auto_bind="TLS_BEFORE_BIND",
            raise_exceptions=True,
        )
        try:
            yield conn
        finally:
            conn.unbind()

    def modify(self, dn: str, changes: Mapping[str, list[tuple[str, list[str]]]]) -> None:
        """An ldap3 modify as the admin, e.g. {"member": [(MODIFY_ADD, [dn])]}."""
        with self.admin() as conn:
            conn.modify(dn, dict(changes))

    def is_posix_group(self, group: str) -> bool:
        with self.admin() as conn:
            conn.search(self.group_dn(group), "(objectClass=posixGroup)", search_scope=BASE, attributes=["1.1"])
            return bool(conn.entries)

    def add_member(self, group: str, username: str) -> None:
        """Add the user to a seeded group: a member DN for groupOfNames, a memberUid for posixGroup."""
        attr, value = self._membership(group, username)
        self.modify(self.group_dn(group), {attr: [(MODIFY_ADD, [value])]})

    def remove_member(self, group: str, username: str) -> None:
        """Take the user out of a group. A groupOfNames must keep one member (its schema says so): the
        directory refuses to remove the last."""
        attr, value = self._membership(group, username)
        self.modify(self.group_dn(group), {attr: [(MODIFY_DELETE, [value])]})

    def lock(self, username: str) -> None:
        """Disable the account as OpenLDAP does: ppolicy refuses its binds, the disabled filter matches it."""
        self.modify(self.user_dn(username), {"pwdAccountLockedTime": [(MODIFY_REPLACE, [LOCKED])]})

    def unlock(self, username: str) -> None:
        self.modify(self.user_dn(username), {"pwdAccountLockedTime": [(MODIFY_DELETE, [])]})

    def add_user(
        self,
        username: str,
        uid_number: int,
        *,
        password: str | None = None,
        full_name: str | None = None,
        gid_number: int | None = None,
        ssh_keys: Sequence[str] = (),
        shell: str = "/bin/bash",
    ) -> str:
        """Add a posixAccount + inetOrgPerson + ldapPublicKey entry under the user base; its DN."""
        name = full_name or username.capitalize()
        attrs: dict[str, Any] = {
            "uid": username,
            "cn": name,
            "sn": name.split()[-1],
            "uidNumber": uid_number,
            "gidNumber": gid_number if gid_number is not None else uid_number,
            "homeDirectory": f"/home/{username}",
            "loginShell": shell,
        }
        if ssh_keys:
            attrs["sshPublicKey"] = list(ssh_keys)
        if password is not None:
            attrs["userPassword"] = hashed(HASHED_SALTED_SHA, password)
        dn = self.user_dn(username)
        with self.admin() as conn:
            conn.add(dn, ["inetOrgPerson", "posixAccount", "ldapPublicKey"], attrs)
        return dn

    def delete_user(self, username: str) -> None:
        """Delete the entry; memberof's referential integrity drops its member values from groups."""
        with self.admin() as conn:
            conn.delete(self.user_dn(username))

    def _membership(self, group: str, username: str) -> tuple[str, str]:
        if self.is_posix_group(group):
            return "memberUid", username
        return "member", self.user_dn(username)


class LdapEdits:
    """`LdapServer`'s changes, each undone (last first) when the test ends."""

    def __init__(self, server: LdapServer) -> None:
        self.server = server
        self._undo: list[tuple[Any, tuple[Any, ...]]] = []

    def add_member(self, group: str, username: str) -> None:
        self.server.add_member(group, username)
        self._undo.append((self.server.remove_member, (group, username)))

    def remove_member(self, group: str, username: str) -> None:
        self.server.remove_member(group, username)
        self._undo.append((self.server.add_member, (group, username)))

    def lock(self, username: str) -> None:
        self.server.lock(username)
        self._undo.append((self.server.unlock, (username,)))

    def unlock(self, username: str) -> None:
        self.server.unlock(username)
        self._undo.append((self.server.lock, (username,)))

    def add_user(self, username: str, uid_number: int, **kwargs: Any) -> str:
        dn = self.server.add_user(username, uid_number, **kwargs)
        self._undo.append((self.server.delete_user, (username,)))
        return dn

    def modify(self, dn: str, changes: Mapping[str, list[tuple[str, list[str]]]], undo: Mapping[str, Any]) -> None:
        """Any change, with the change that reverses it."""
        self.server.modify(dn, changes)
        self._undo.append((self.server.modify, (dn, undo)))

    def undo(self) -> None:
        while self._undo:
            action, args = self._undo.pop()
            action(*args)


def _start(env: Mapping[str, str]) -> LdapServer:
    install_tools(("slapd", "slappasswd", "ldapsearch", "openssl"), "ldap.sh")
    started = _service("start", env)
    if started.returncode != 0:
        said = (started.stderr.strip() or started.stdout.strip() or "start failed").splitlines()
        need("slapd", f"`ldap.sh start` failed: {said[-1]}")
    return LdapServer.from_env_file(Path(started.stdout.strip().splitlines()[-1]), env)


@pytest.fixture(scope="session")
def ldap_server(worker_id: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LdapServer]:
    """The worker's slapd, seeded (scripts/services/ldap.sh); stopped after the session."""
    index = _worker_index(worker_id)
    env = {
        "GPUFLEET_LDAP_PORT": str(LDAP_PORT + 2 * index),
        "GPUFLEET_LDAP_TLS_PORT": str(LDAPS_PORT + 2 * index),
        "GPUFLEET_SERVICES_RUN": str(tmp_path_factory.mktemp("ldap")),
    }
    server = _start(env)
    try:
        yield server
    finally:
        _service("stop", env)


@pytest.fixture
def ldap_spare(worker_id: str, tmp_path: Path) -> Iterator[LdapServer]:
    """A second slapd of the worker's own, for the test to stop (a replica going down); stopped after it."""
    index = _worker_index(worker_id)
    env = {
        "GPUFLEET_LDAP_PORT": str(LDAP_PORT + 2 * index + 1),
        "GPUFLEET_LDAP_TLS_PORT": str(LDAPS_PORT + 2 * index + 1),
        "GPUFLEET_SERVICES_RUN": str(tmp_path / "ldap-spare"),
    }
    server = _start(env)
    try:
        yield server
    finally:
        _service("stop", env)


def stop(server: LdapServer) -> None:
    """Stop an instance (ldap.sh stop)."""
    done = _service("stop", server.service_env)
    assert done.returncode == 0, done.stderr


@pytest.fixture
def ldap_edit(ldap_server: LdapServer) -> Iterator[LdapEdits]:
    """Change the session's directory as its admin; every change is undone after the test."""
    edits = LdapEdits(ldap_server)
    try:
        yield edits
    finally:
        edits.undo()
