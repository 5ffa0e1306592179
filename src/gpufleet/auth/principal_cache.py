"""A head process's memory of the API tokens it resolved a moment ago, so that a script or the CLI calling
in a loop costs no database read (and no trip to a request thread) per request: about a seventh of a job
submission's CPU.

What may be stale, and for how long. An entry lives `ttl_s` (`auth_cache_s`, 1 s by default; 0 turns the
cache off), and the token's own expiry is checked on every use. A change that this process commits to
tokens or users (a token revoked, a user disabled, removed or given another role, whether by the API or
by the directory sync) empties the cache when it commits; one committed by another head process, or by
hand in the database, is seen here within `ttl_s`. (Kubernetes' API server keeps its webhook token
reviews for 2 minutes by default.) Web sessions and node credentials are never kept: a logout, or a
removed node, takes effect on every process at once.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.auth.models import TokenKind
from gpufleet.auth.schemas import Principal
from gpufleet.core import secrets

WATCHED_TABLES = frozenset({"api_tokens", "users"})  # what a principal is read from
MAX_ENTRIES = 4096  # distinct tokens kept; beyond, the cache starts again (only valid tokens get in)


@dataclasses.dataclass(frozen=True)
class _Entry:
    who: Principal
    until: float  # time.monotonic()


class PrincipalCache:
    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.Lock()
        self._generation = 0  # counts the emptyings: a read that began before one must not be kept
        self._changed = threading.local()  # this thread's open transaction wrote tokens or users

    @property
    def generation(self) -> int:
        """Taken before the database read whose result is then `put`."""
        return self._generation

    def get(self, token: str, now: datetime) -> Principal | None:
        """The caller behind `token` if resolved less than `ttl_s` ago and not expired since; else None."""
        entry = self._entries.get(secrets.hash_token(token))
        if entry is None or entry.until <= time.monotonic():
            return None
        expires_at = entry.who.expires_at
        if expires_at is not None and now >= expires_at:
            return None  # the database read says why
        return entry.who

    def put(self, token: str, who: Principal, generation: int) -> None:
        """Keep `who`, read from the database after `generation` was taken, if it may be kept."""
        if self.ttl_s <= 0 or who.kind is not TokenKind.ADMIN:
            return
        kept = _Entry(dataclasses.replace(who, use_unrecorded=False), time.monotonic() + self.ttl_s)
        with self._lock:
            if generation != self._generation:
                return  # tokens or users changed while it was read: it may be the old state
            if len(self._entries) >= MAX_ENTRIES:
                self._entries.clear()
            self._entries[secrets.hash_token(token)] = kept

    def clear(self) -> None:
        with self._lock:
            self._generation += 1
            self._entries.clear()

    def watch(self, sessions: sessionmaker[Session]) -> None:
        """Empty the cache whenever a transaction of `sessions` that changed tokens or users commits."""
        engine: Engine | None = sessions.kw.get("bind")
        if engine is None:
            return  # an app built only for its schema: no database, nothing to watch
        event.listen(engine, "after_cursor_execute", self._noted)
        event.listen(sessions, "after_commit", self._committed)
        event.listen(sessions, "after_rollback", self._rolled_back)

    def _noted(self, _conn: Any, _cursor: Any, _statement: str, _params: Any, context: Any, _many: bool) -> None:
        # An UPDATE or DELETE built with SQLAlchemy (the ORM's flushes included) names its table; raw SQL
        # does not, and is seen within ttl_s like another process's change.
        if context is None or not (context.isupdate or context.isdelete) or context.compiled is None:
            return
        table = getattr(context.compiled.statement, "table", None)
        if table is not None and getattr(table, "name", None) in WATCHED_TABLES:
            self._changed.pending = True

    def _committed(self, _session: Session) -> None:
        # after_commit runs once the database has committed: a read after it sees the change
        if getattr(self._changed, "pending", False):
            self._changed.pending = False
            self.clear()

    def _rolled_back(self, _session: Session) -> None:
        self._changed.pending = False
