"""Local users: create, change, disable, delete. Takes a session and a clock; never commits."""

from __future__ import annotations

import re

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gpufleet.auth import passwords
from gpufleet.auth.models import User
from gpufleet.auth.policy import Role
from gpufleet.auth.schemas import UserCreate, UserUpdate
from gpufleet.core.clock import Clock, to_datetime
from gpufleet.core.errors import Conflict, InvalidInput, NotFound
from gpufleet.protocol.accounts import Account, AccountList

# What useradd accepts on the nodes: a lowercase letter or underscore, then lowercase, digits, _ and -.
USERNAME = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
FIRST_UID = 10_000  # above the distributions' system and local ranges


def get_user(session: Session, username: str) -> User:
    user = session.scalar(select(User).where(User.username == username))
    if user is None:
        raise NotFound(f"no such user: {username}")
    return user


def list_users(session: Session) -> list[User]:
    return list(session.scalars(select(User).order_by(User.username)))


def create_user(session: Session, clock: Clock, spec: UserCreate) -> User:
    """Raises InvalidInput for a bad name or password, Conflict for a taken name or uid."""
    if not USERNAME.fullmatch(spec.username):  # fullmatch: "$" alone lets a trailing newline in
        raise InvalidInput(f"invalid username {spec.username!r}: lowercase letters, digits, '_' and '-' (max 32)")
    if spec.role is Role.NODE:
        raise InvalidInput("a user cannot have the node role")
    if session.scalar(select(User.id).where(User.username == spec.username)) is not None:
        raise Conflict(f"user already exists: {spec.username}")
    uid = spec.uid if spec.uid is not None else max(FIRST_UID, (session.scalar(select(func.max(User.uid))) or 0) + 1)
    if session.scalar(select(User.id).where(User.uid == uid)) is not None:
        raise Conflict(f"uid {uid} is taken")
    password_hash = None
    if spec.password is not None:
        passwords.check_policy(spec.password.get_secret_value(), spec.username)
        password_hash = passwords.hash_password(spec.password.get_secret_value())
    now = to_datetime(clock.now())
    user = User(
        username=spec.username,
        full_name=spec.full_name,
        role=spec.role,
        password_hash=password_hash,
        enabled=True,
        uid=uid,
        gid=spec.gid if spec.gid is not None else uid,
        shell=spec.shell,
        ssh_keys=list(spec.ssh_keys),
        created_at=now,
        updated_at=now,
    )
    session.add(user)
    session.flush()
    return user


def update_user(session: Session, clock: Clock, username: str, change: UserUpdate) -> User:
    """Raises InvalidInput for a directory's user: what the directory keeps is changed there."""
    user = get_user(session, username)
    if user.source != "local" and change.model_fields_set:
        raise InvalidInput(
            f"user {username} comes from the directory ({user.source}): change them there; "
            "their tokens can be revoked here"
        )
    if change.role is not None:
        if change.role is Role.NODE:
            raise InvalidInput("a user cannot have the node role")
        user.role = change.role
    if change.full_name is not None:
        user.full_name = change.full_name
    if change.shell is not None:
        user.shell = change.shell
    if change.ssh_keys is not None:
        user.ssh_keys = list(change.ssh_keys)
    if change.enabled is not None:
        user.enabled = change.enabled
    if change.password is not None:
        passwords.check_policy(change.password.get_secret_value(), user.username)
        user.password_hash = passwords.hash_password(change.password.get_secret_value())
    user.updated_at = to_datetime(clock.now())
    return user


def delete_user(session: Session, username: str) -> None:
    """Delete a user and, with them, their tokens."""
    session.delete(get_user(session, username))
    session.flush()


def accounts_for_nodes(session: Session) -> AccountList:
    """Every user's POSIX account for the agents (`accounts_sync`), disabled users too, so nodes lock them.

    Passwords never leave the head: node accounts log in with SSH keys only.
    """
    return AccountList.of(
        [
            Account(
                username=user.username,
                full_name=user.full_name,
                uid=user.uid,
                gid=user.gid,
                shell=user.shell,
                home=user.home,
                ssh_keys=list(user.ssh_keys),
                enabled=user.enabled,
            )
            for user in list_users(session)
        ]
    )
