"""Keeping gpufleet's users in step with a directory: one person at login (`apply_user`), everyone on a
schedule (`sync_users`). Takes a session and a clock; never commits.

A directory user becomes a row of the one users table (source "ldap" or "oidc"), so roles, tokens, jobs
and node accounts work for them as for local users. What the directory says wins on every refresh: name,
uid, gid, home, shell, SSH keys, whether the account is enabled, the role its groups map to, and the
project memberships its groups give (`ProjectMember.from_directory`). Memberships added by hand are never
touched. A user the directory no longer lists, or marks disabled, is disabled here: their tokens and web
sessions stop at once (`auth.service.authenticate` checks the user on every request).

A directory never takes over a local account of the same name or uid: that would let whoever can add an
entry to the directory become a local admin. Such clashes are reported as problems, not applied.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.auth.models import User
from gpufleet.auth.projects import Project, ProjectMember
from gpufleet.auth.users import FIRST_UID, USERNAME
from gpufleet.core.clock import Clock, to_datetime
from gpufleet.core.db import transaction
from gpufleet.directory.mapping import GroupMapping
from gpufleet.directory.models import DirectorySync
from gpufleet.directory.records import DirectoryUnavailable, DirectoryUser

log = logging.getLogger(__name__)
SOURCES = ("ldap", "oidc")


class Directory(Protocol):
    """What logins and the scheduled sync need of a directory (`directory.ldap.LdapDirectory`)."""

    def authenticate(self, username: str, password: str) -> DirectoryUser:
        """The person these credentials prove. Raises Unauthorized, or DirectoryUnavailable."""
        ...

    def users(self) -> list[DirectoryUser]:
        """Everyone the directory lists as a gpufleet user, disabled ones marked. Raises DirectoryUnavailable."""
        ...


DEFAULT_SHELL = "/bin/bash"


@dataclass
class Applied:
    user: User | None  # None: the person could not be applied (`problem` says why)
    changed: bool = False
    problem: str | None = None


@dataclass
class SyncReport:
    users: int = 0  # people the directory listed
    created: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    disabled: list[str] = field(default_factory=list)  # no longer listed, or disabled in the directory
    problems: list[str] = field(default_factory=list)


def apply_user(session: Session, clock: Clock, source: str, person: DirectoryUser, mapping: GroupMapping) -> Applied:
    """Create or refresh the user `person` describes, with the role and directory memberships their groups
    map to. A single sign-on login of a user the LDAP directory already keeps is taken as that user, and
    their role and projects stay the directory's."""
    if not USERNAME.fullmatch(person.username):
        return Applied(None, problem=f"{source} user {person.username!r}: not a valid user name on the nodes")
    user = session.scalar(select(User).where(User.username == person.username))
    if user is not None and user.source != source:
        if source == "oidc" and user.source == "ldap":
            return Applied(user)
        return Applied(None, problem=f"{source} user {person.username}: a {user.source} user has that name")
    uid = _uid(session, person, user)
    if isinstance(uid, str):
        return Applied(None, problem=uid)
    now = to_datetime(clock.now())
    values = {
        "full_name": person.full_name[:128],
        "role": mapping.role_for(person.groups),
        "enabled": person.enabled,
        "uid": uid,
        "gid": person.gid if person.gid is not None else (user.gid if user is not None else uid),
        "home": person.home,
        "shell": person.shell or DEFAULT_SHELL,
        "ssh_keys": list(person.ssh_keys),
        "source_id": person.source_id,
    }
    if user is None:
        user = User(username=person.username, source=source, created_at=now, updated_at=now, **values)
        session.add(user)
        session.flush()
        changed = True
    else:
        changed = any(getattr(user, key) != value for key, value in values.items())
        for key, value in values.items():
            setattr(user, key, value)
        if changed:
            user.updated_at = now
    user.synced_at = now
    changed |= _set_memberships(session, clock, user, mapping.projects_for(person.groups))
    return Applied(user, changed)


def _uid(session: Session, person: DirectoryUser, user: User | None) -> int | str:
    """The user's uid: the directory's uidNumber, else the one they have, else the next free one. A problem
    (str) when another user holds the directory's uid."""
    if person.uid is None:
        if user is not None:
            return user.uid
        return max(FIRST_UID, (session.scalar(select(func.max(User.uid))) or 0) + 1)
    holder = session.scalar(select(User.username).where(User.uid == person.uid))
    if holder is not None and holder != person.username:
        return f"directory user {person.username}: uid {person.uid} belongs to user {holder}"
    return person.uid


def _set_memberships(session: Session, clock: Clock, user: User, wanted: set[str]) -> bool:
    """Make the user's directory-given memberships exactly `wanted` (projects that exist); leave the
    memberships added by hand alone. True when anything changed."""
    current = {
        name: member
        for member, name in session.execute(
            select(ProjectMember, Project.name)
            .join(Project, Project.id == ProjectMember.project_id)
            .where(ProjectMember.user_id == user.id)
        ).all()
    }
    changed = False
    for name, member in current.items():
        if member.from_directory and name not in wanted:
            session.delete(member)
            changed = True
    missing = wanted - set(current)
    if missing:
        now = to_datetime(clock.now())
        for project_id in session.scalars(select(Project.id).where(Project.name.in_(missing))):
            session.add(ProjectMember(project_id=project_id, user_id=user.id, added_at=now, from_directory=True))
            changed = True
    if changed:
        session.flush()
    return changed


def sync_users(
    session: Session, clock: Clock, source: str, people: Sequence[DirectoryUser], mapping: GroupMapping
) -> SyncReport:
    """Apply everyone the directory listed, disable this source's users it no longer lists, and record the
    outcome (`DirectorySync`)."""
    report = SyncReport(users=len(people), problems=mapping.problems(session))
    listed: set[str] = set()
    for person in people:
        known = session.scalar(select(User.id).where(User.username == person.username)) is not None
        applied = apply_user(session, clock, source, person, mapping)
        if applied.user is None:
            report.problems.append(applied.problem or f"{source} user {person.username}: not applied")
            continue
        listed.add(applied.user.username)
        if not person.enabled and applied.changed:
            report.disabled.append(person.username)
        elif applied.changed:
            (report.changed if known else report.created).append(person.username)
    gone = session.scalars(
        select(User).where(User.source == source, User.enabled.is_(True), User.username.not_in(listed))
    ).all()
    for user in gone:
        user.enabled = False
        user.updated_at = to_datetime(clock.now())
        report.disabled.append(user.username)
    record(session, clock, source, report=report)
    return report


def refresh(
    sessions: sessionmaker[Session], clock: Clock, directory: Directory, mapping: GroupMapping
) -> SyncReport | None:
    """Read every user of the LDAP directory (outside any transaction) and apply them. None when the
    directory could not be read: nothing changes (a down directory must not disable everyone), and the
    error is recorded for the admin's view."""
    try:
        people = directory.users()
    except DirectoryUnavailable as exc:
        log.warning("directory sync: %s", exc)
        with transaction(sessions) as session:
            record(session, clock, "ldap", error=str(exc))
        return None
    with transaction(sessions) as session:
        report = sync_users(session, clock, "ldap", people, mapping)
    if report.created or report.changed or report.disabled:
        log.info(
            "directory sync: %d users; created %s, changed %s, disabled %s",
            report.users,
            report.created,
            report.changed,
            report.disabled,
        )
    return report


def record(session: Session, clock: Clock, source: str, *, report: SyncReport | None = None, error: str = "") -> None:
    """Note a sync attempt of `source`: its report when it succeeded, else the error."""
    row = session.get(DirectorySync, source)
    if row is None:
        row = DirectorySync(source=source, error="", users=0, changed=0, problems=[])
        session.add(row)
    now = to_datetime(clock.now())
    row.attempted_at = now
    row.error = error[:2000]
    if report is not None:
        row.succeeded_at = now
        row.users = report.users
        row.changed = len(report.created) + len(report.changed) + len(report.disabled)
        row.problems = report.problems[:200]
    session.flush()


def statuses(session: Session) -> list[DirectorySync]:
    return list(session.scalars(select(DirectorySync).order_by(DirectorySync.source)))
