"""Directory users onto gpufleet's users table (directory.sync, directory.mapping), with a directory made in
the test: creation, refresh, groups to roles and projects, hand-made memberships left alone, removal and
disabling, clashes with local users reported and not applied. The real LDAP server is in test_ldap_real.py
and the end-to-end logins in test_directory_e2e.py."""

from __future__ import annotations

from dataclasses import replace

import pytest
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.auth import projects
from gpufleet.auth.policy import Role
from gpufleet.auth.projects import projects_of
from gpufleet.auth.schemas import UserCreate
from gpufleet.auth.users import create_user, get_user
from gpufleet.core.clock import FakeClock
from gpufleet.core.db import transaction
from gpufleet.directory import sync
from gpufleet.directory.mapping import GroupMapping
from gpufleet.directory.records import DirectoryUser

MAPPING = GroupMapping.of(
    roles={"gpu-admins": "admin", "ops": "operator", "guests": "viewer"},
    projects={"ml-vision": "vision", "ml-nlp": "nlp", "ml-gone": "no-such-project"},
    default_role="member",
)
ALICE = DirectoryUser(  # noqa: S604 - a login shell, not a subprocess
    username="alice",
    source_id="uid=alice,ou=people,dc=gpufleet,dc=test",
    full_name="Alice Liddell",
    uid=20001,
    gid=20001,
    home="/home/alice",
    shell="/bin/zsh",
    ssh_keys=("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIEXAMPLEKEYalice alice@laptop",),
    groups=frozenset({"gpu-admins", "ml-vision", "hpc-users"}),
)
BOB = DirectoryUser(
    username="bob",
    source_id="uid=bob,ou=people,dc=gpufleet,dc=test",
    uid=20002,
    gid=20000,
    groups=frozenset({"ml-vision", "ml-nlp", "guests"}),
)


@pytest.fixture
def db(sessions: sessionmaker[Session], clock: FakeClock) -> sessionmaker[Session]:
    with transaction(sessions) as s:
        projects.create_project(s, clock, "vision")
        projects.create_project(s, clock, "nlp")
    return sessions


def _sync(db: sessionmaker[Session], clock: FakeClock, *people: DirectoryUser) -> sync.SyncReport:
    with transaction(db) as s:
        return sync.sync_users(s, clock, "ldap", list(people), MAPPING)


def test_directory_users_arrive_with_their_posix_identity_role_and_projects(
    db: sessionmaker[Session], clock: FakeClock
) -> None:
    report = _sync(db, clock, ALICE, BOB)
    assert sorted(report.created) == ["alice", "bob"]
    assert report.problems == ["group ml-gone maps to project no-such-project, which does not exist"]
    with transaction(db, readonly=True) as s:
        alice = get_user(s, "alice")
        assert (alice.source, alice.source_id) == ("ldap", ALICE.source_id)
        assert (alice.uid, alice.gid, alice.home, alice.shell) == (20001, 20001, "/home/alice", "/bin/zsh")
        assert alice.ssh_keys == list(ALICE.ssh_keys)
        assert alice.full_name == "Alice Liddell"
        assert alice.role is Role.ADMIN
        assert alice.password_hash is None  # the directory checks their password, never gpufleet
        bob = get_user(s, "bob")
        assert bob.role is Role.VIEWER  # the only group with a role; a user in none gets the default
        assert (bob.gid, bob.shell) == (20000, "/bin/bash")
        assert projects_of(s, "alice") == {"vision"}
        assert projects_of(s, "bob") == {"vision", "nlp"}
    assert _sync(db, clock, ALICE, BOB).created == []  # nothing new the second time
    assert _sync(db, clock, ALICE, BOB).changed == []


def test_leaving_a_group_loses_its_project_and_role_but_not_what_an_admin_added_by_hand(
    db: sessionmaker[Session], clock: FakeClock
) -> None:
    _sync(db, clock, ALICE, BOB)
    with transaction(db) as s:
        projects.create_project(s, clock, "side")
        projects.add_member(s, clock, "side", "alice")  # by hand
    report = _sync(db, clock, replace(ALICE, groups=frozenset({"hpc-users"})), BOB)
    assert report.changed == ["alice"]
    with transaction(db, readonly=True) as s:
        assert projects_of(s, "alice") == {"side"}
        assert get_user(s, "alice").role is Role.MEMBER
        assert projects_of(s, "bob") == {"vision", "nlp"}
    _sync(db, clock, ALICE, BOB)  # back in the group: back in the project
    with transaction(db, readonly=True) as s:
        assert projects_of(s, "alice") == {"side", "vision"}


def test_a_user_disabled_or_gone_from_the_directory_is_disabled_and_comes_back_when_listed(
    db: sessionmaker[Session], clock: FakeClock
) -> None:
    _sync(db, clock, ALICE, BOB)
    report = _sync(db, clock, replace(ALICE, enabled=False))
    assert sorted(report.disabled) == ["alice", "bob"]
    with transaction(db, readonly=True) as s:
        assert not get_user(s, "alice").enabled
        assert not get_user(s, "bob").enabled
    _sync(db, clock, ALICE, BOB)
    with transaction(db, readonly=True) as s:
        assert get_user(s, "alice").enabled
        assert get_user(s, "bob").enabled


def test_a_directory_never_takes_over_a_local_account_by_name_or_uid(
    db: sessionmaker[Session], clock: FakeClock
) -> None:
    with transaction(db) as s:
        create_user(s, clock, UserCreate(username="alice", role=Role.ADMIN))
        create_user(s, clock, UserCreate(username="root2", uid=20002))
    report = _sync(db, clock, ALICE, BOB, replace(BOB, username="Bad Name", source_id="x"))
    assert report.created == []
    assert "ldap user alice: a local user has that name" in report.problems
    assert "directory user bob: uid 20002 belongs to user root2" in report.problems
    assert "ldap user 'Bad Name': not a valid user name on the nodes" in report.problems
    with transaction(db, readonly=True) as s:
        alice = get_user(s, "alice")
        assert alice.source == "local"
        assert alice.role is Role.ADMIN
        assert projects_of(s, "alice") == set()
        # Local users are never disabled by a directory sync, listed or not.
        assert get_user(s, "root2").enabled


def test_the_sync_status_says_when_what_and_why_not(db: sessionmaker[Session], clock: FakeClock) -> None:
    _sync(db, clock, ALICE)
    clock.advance(60)
    with transaction(db) as s:
        sync.record(s, clock, "ldap", error="ldaps://ldap1: connection refused")
    with transaction(db, readonly=True) as s:
        (row,) = sync.statuses(s)
        assert row.source == "ldap"
        assert row.error == "ldaps://ldap1: connection refused"
        assert row.attempted_at is not None
        assert row.succeeded_at is not None
        assert row.attempted_at > row.succeeded_at  # the last success is older than the failed attempt
        assert (row.users, row.changed) == (1, 1)
        assert row.problems == ["group ml-gone maps to project no-such-project, which does not exist"]


def test_a_single_sign_on_of_a_directory_user_keeps_the_directorys_role_and_projects(
    db: sessionmaker[Session], clock: FakeClock
) -> None:
    _sync(db, clock, ALICE)
    via_sso = DirectoryUser(username="alice", source_id="https://sso#1234", groups=frozenset())
    with transaction(db) as s:
        applied = sync.apply_user(s, clock, "oidc", via_sso, GroupMapping())
        assert applied.user is not None
        assert not applied.changed
        assert applied.user.source == "ldap"
        assert applied.user.role is Role.ADMIN
        assert projects_of(s, "alice") == {"vision"}
