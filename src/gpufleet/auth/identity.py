"""Who a user name and password belong to: the identity protocol, and the local implementation.

Routes never check passwords themselves; they go through `password_login`, which asks the configured
`IdentityProvider`. The directory's (`directory.identity`, `identity_provider = "ldap"`) proves the
credentials against LDAP and returns the matching gpufleet `User` row (created or refreshed from the
directory's record), so roles, projects, tokens and node accounts keep working on the one users table.
"""

from __future__ import annotations

import functools
import math
from typing import Protocol

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpufleet.auth import passwords
from gpufleet.auth.models import User
from gpufleet.auth.throttle import LoginThrottle
from gpufleet.core.errors import InvalidInput, TooManyRequests, Unauthorized

# The same answer whatever was wrong, so a login attempt never tells whether a user exists.
BAD_CREDENTIALS = "unknown user name or wrong password"


@functools.cache
def _dummy_hash() -> str:
    """Verified when the user does not exist, so that case takes as long as a wrong password. Made at
    first use, not at import: hashing costs a quarter of a second, and every head and CLI process imports this."""
    return passwords.hash_password("gpufleet-no-such-user-dummy")


class IdentityProvider(Protocol):
    name: str

    def verify(self, session: Session, username: str, password: str) -> User:
        """The enabled user these credentials prove. Raises Unauthorized (BAD_CREDENTIALS) otherwise."""
        ...

    def note(self, user: User) -> str:
        """What the login's audit record should say about how `user` was let in ("" for nothing)."""
        ...


class LocalPasswords:
    """Users and argon2 password hashes in gpufleet's own database."""

    name = "local"

    def verify(self, session: Session, username: str, password: str) -> User:
        user = session.scalar(select(User).where(User.username == username))
        if user is None or user.password_hash is None:
            passwords.verify(_dummy_hash(), password)
            raise Unauthorized(BAD_CREDENTIALS)
        if not passwords.verify(user.password_hash, password) or not user.enabled:
            raise Unauthorized(BAD_CREDENTIALS)
        return user

    def note(self, user: User) -> str:
        return ""


def password_login(
    session: Session, identity: IdentityProvider, throttle: LoginThrottle, username: str, password: str, source: str
) -> User:
    """Check a login, slowed down after repeated failures from the same name or address.

    Raises TooManyRequests while the caller must wait (the password is not even checked), and
    Unauthorized for bad credentials or a disabled user.
    """
    if not username or len(password) > passwords.MAX_LENGTH:
        raise InvalidInput("a user name and a password of at most 1024 characters are required")
    wait = throttle.wait_s(username, source)
    if wait > 0:
        raise TooManyRequests(f"too many failed logins; try again in {math.ceil(wait)} s", retry_after_s=wait)
    try:
        user = identity.verify(session, username, password)
    except Unauthorized:
        throttle.failed(username, source)
        raise
    throttle.succeeded(username)
    return user
