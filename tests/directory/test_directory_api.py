"""Logins and the admin's view through the API with the directory as identity provider (directory.identity,
the /directory routes), over a directory made in the test. The same with a real slapd and a real head is
test_directory_e2e.py."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.api.context import HeadContext
from gpufleet.core.clock import FakeClock
from gpufleet.core.errors import Unauthorized
from gpufleet.directory.identity import DirectoryIdentity
from gpufleet.directory.records import DirectoryUnavailable, DirectoryUser
from gpufleet.directory.settings import mappings
from gpufleet.workers.directory_loops import DirectoryLoops
from tests.api.dashboard_helpers import PASSWORD

# One database: HTTP translation (test_directory_sync runs both).
pytestmark = pytest.mark.one_database

GROUPS = {
    "identity_provider": "ldap",
    "ldap_group_roles": {"gpu-admins": "admin"},
    "ldap_group_projects": {"ml-vision": "vision", "ml-gone": "gone"},
    "ldap_default_role": "viewer",
}


@dataclass
class FakeDirectory:
    """People and their passwords; `down` makes every call fail as an unreachable server does."""

    people: dict[str, DirectoryUser] = field(default_factory=dict)
    passwords: dict[str, str] = field(default_factory=dict)
    down: bool = False

    def authenticate(self, username: str, password: str) -> DirectoryUser:
        if self.down:
            raise DirectoryUnavailable("ldaps://127.0.0.1:1: connection refused")
        person = self.people.get(username)
        if person is None or not person.enabled or not password or self.passwords.get(username) != password:
            raise Unauthorized("unknown user name or wrong password")
        return person

    def users(self) -> list[DirectoryUser]:
        if self.down:
            raise DirectoryUnavailable("ldaps://127.0.0.1:1: connection refused")
        return list(self.people.values())


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    """SQLite only: the routes' logic is the same on both; test_directory_sync runs the sync on both."""
    return f"sqlite:///{tmp_path / 'gpufleet.db'}"


@pytest.fixture
def directory(client: TestClient, sessions: sessionmaker[Session], clock: FakeClock) -> Iterator[FakeDirectory]:
    fake = FakeDirectory()
    fake.people["alice"] = DirectoryUser(
        username="alice",
        source_id="uid=alice,ou=people,dc=gpufleet,dc=test",
        uid=20001,
        gid=20001,
        groups=frozenset({"gpu-admins", "ml-vision"}),
    )
    fake.passwords["alice"] = "alice's directory password"
    ctx: HeadContext = client.app.state.ctx  # type: ignore[attr-defined]
    before = ctx.settings, ctx.identity, ctx.directory
    ctx.settings = ctx.settings.model_copy(update=GROUPS)
    mapping = mappings(ctx.settings)["ldap"]
    ctx.identity = DirectoryIdentity(sessions, clock, fake, mapping)
    ctx.directory = DirectoryLoops(sessions, clock, fake, mapping, 300.0, lambda: True)
    assert client.post("/api/v1/projects", json={"name": "vision"}).status_code == 201
    yield fake
    ctx.settings, ctx.identity, ctx.directory = before


def _login(client: TestClient, username: str, password: str) -> tuple[int, str]:
    answer = client.post("/api/v1/login", json={"username": username, "password": password}, headers={})
    return answer.status_code, answer.json().get("token", "") if answer.status_code == 201 else answer.text


def test_a_directory_user_logs_in_with_the_role_and_projects_of_their_groups(
    client: TestClient, directory: FakeDirectory
) -> None:
    status, token = _login(client, "alice", "alice's directory password")
    assert status == 201, token
    me = client.get("/api/v1/whoami", headers={"Authorization": f"Bearer {token}"}).json()
    assert (me["user"], me["role"]) == ("alice", "admin")
    alice = client.get("/api/v1/users/alice").json()
    assert (alice["source"], alice["uid"]) == ("ldap", 20001)
    assert alice["synced_at"] is not None
    members = client.get("/api/v1/projects/vision").json()["members"]
    assert members == ["alice"]
    assert _login(client, "alice", "wrong")[0] == 401
    assert _login(client, "nobody", "whatever")[0] == 401


def test_directory_changes_reach_logins_at_once_and_tokens_at_the_next_sync(
    client: TestClient, directory: FakeDirectory
) -> None:
    _, token = _login(client, "alice", "alice's directory password")
    mine = {"Authorization": f"Bearer {token}"}
    # Out of gpu-admins and ml-vision in the directory: the next sync takes both back.
    directory.people["alice"] = replace(directory.people["alice"], groups=frozenset())
    synced = client.post("/api/v1/directory/sync")
    assert synced.status_code == 200, synced.text
    assert synced.json()["changed"] == ["alice"]
    assert client.get("/api/v1/whoami", headers=mine).json()["role"] == "viewer"
    assert client.get("/api/v1/projects/vision").json()["members"] == []
    # Disabled in the directory: the next login fails at once, the token at the next sync.
    directory.people["alice"] = replace(directory.people["alice"], enabled=False)
    assert _login(client, "alice", "alice's directory password")[0] == 401
    assert client.get("/api/v1/whoami", headers=mine).status_code == 200
    assert client.post("/api/v1/directory/sync").json()["disabled"] == ["alice"]
    assert client.get("/api/v1/whoami", headers=mine).status_code == 401


def test_while_the_directory_is_down_only_local_accounts_log_in_and_that_is_audited(
    client: TestClient, directory: FakeDirectory
) -> None:
    made = client.post("/api/v1/users", json={"username": "root2", "role": "admin", "password": PASSWORD})
    assert made.status_code == 201
    _login(client, "alice", "alice's directory password")
    directory.down = True
    status, text = _login(client, "alice", "alice's directory password")
    assert status == 503
    assert "local accounts can still log in" in text
    assert _login(client, "root2", PASSWORD)[0] == 201
    records = client.get("/api/v1/audit", params={"actor": "user:root2"}).json()
    assert any("break-glass" in r["target"] for r in records), records
    # A sync that cannot reach the directory changes nothing and says why.
    assert client.post("/api/v1/directory/sync").status_code == 503
    assert client.get("/api/v1/users/alice").json()["enabled"] is True
    status_now = client.get("/api/v1/directory").json()
    (ldap,) = status_now["sources"]
    assert ldap["error"] == "ldaps://127.0.0.1:1: connection refused"


def test_the_admins_view_and_what_may_not_be_changed_here(client: TestClient, directory: FakeDirectory) -> None:
    assert client.post("/api/v1/directory/sync").status_code == 200
    found = client.get("/api/v1/directory").json()
    assert found["users"] == {"local": 0, "ldap": 1, "oidc": 0}
    assert found["problems"] == ["ldap: group ml-gone maps to project gone, which does not exist"]
    refused = client.patch("/api/v1/users/alice", json={"role": "viewer"})
    assert refused.status_code == 400
    assert "change them there" in refused.json()["detail"]
    assert client.get("/api/v1/users/alice").json()["role"] == "admin"
