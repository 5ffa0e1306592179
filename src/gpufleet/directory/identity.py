"""Password logins against the site's directory (`identity_provider = "ldap"`), with local accounts kept as
the break-glass path.

A login names a user. A local account (made in gpufleet) is checked against its own password hash whether
or not the directory answers, so an admin can still get in while the directory is down; each such login is
audited as break-glass. Any other name is checked by binding to the directory as that user; a success
refreshes the user from the directory (`directory.sync.apply_user`: role, projects, keys, enabled) before
the token or session is made, so a change in the directory counts at once for new logins. A directory that
cannot be reached answers 503, never a wrong-password 401 that would lock the user out by the throttle.
"""

from __future__ import annotations

import logging

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.auth.identity import BAD_CREDENTIALS, LocalPasswords
from gpufleet.auth.models import User
from gpufleet.core.clock import Clock
from gpufleet.core.db import transaction
from gpufleet.core.errors import Unauthorized, Unavailable
from gpufleet.directory.mapping import GroupMapping
from gpufleet.directory.records import DirectoryUnavailable
from gpufleet.directory.sync import Directory, apply_user

log = logging.getLogger(__name__)
BREAK_GLASS = "local account: break-glass beside the directory"


class DirectoryIdentity:
    name = "ldap"

    def __init__(
        self, sessions: sessionmaker[Session], clock: Clock, directory: Directory, mapping: GroupMapping
    ) -> None:
        self.sessions = sessions
        self.clock = clock
        self.directory = directory
        self.mapping = mapping
        self.local = LocalPasswords()

    def verify(self, session: Session, username: str, password: str) -> User:
        source = session.scalar(select(User.source).where(User.username == username))
        if source == "local":
            return self.local.verify(session, username, password)
        try:
            person = self.directory.authenticate(username, password)
        except DirectoryUnavailable as e:
            log.warning("directory login of %s: %s", username, e)
            raise Unavailable("the directory cannot be reached; local accounts can still log in") from e
        # Written in a transaction of its own: the caller's session only reads (the password check is slow).
        with transaction(self.sessions) as s:
            applied = apply_user(s, self.clock, "ldap", person, self.mapping)
        if applied.user is None:
            log.warning("directory login of %s refused: %s", username, applied.problem)
            raise Unauthorized(BAD_CREDENTIALS)
        if not applied.user.enabled:
            raise Unauthorized(BAD_CREDENTIALS)
        return applied.user

    def note(self, user: User) -> str:
        return BREAK_GLASS if user.source == "local" else f"from the directory ({user.source})"
