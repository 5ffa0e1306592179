"""The database: engine and session factory (built by the composition root, never at import), base model."""

from __future__ import annotations

import enum
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import DateTime, Engine, MetaData, create_engine, event
from sqlalchemy.engine import Dialect, make_url
from sqlalchemy.exc import ArgumentError, DisconnectionError, IntegrityError, OperationalError
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker
from sqlalchemy.types import TypeDecorator

from gpufleet.core.errors import ConfigError, Conflict, Unavailable

# Stable constraint names, so Alembic migrations are the same on SQLite and PostgreSQL.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite stores them naive)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    # WAL lets the API read while the flush loop writes; busy_timeout waits out short write locks
    # instead of failing; foreign keys are off by default in SQLite. The driver's own transaction
    # handling is switched off so that `_sqlite_begin` decides how transactions start.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=10000")
    cursor.close()


READONLY = "gpufleet_readonly"


def _sqlite_begin(conn: Any) -> None:
    # A deferred transaction that reads and then writes fails at once with "database is locked"
    # when another writer got in between (busy_timeout cannot help there). Taking the write lock
    # up front makes concurrent writers queue on busy_timeout instead. SQLite has one writer anyway.
    # Read-only transactions (`transaction(..., readonly=True)`) need no lock: in WAL mode they
    # read a snapshot while a writer works.
    conn.exec_driver_sql("BEGIN" if conn.get_execution_options().get(READONLY) else "BEGIN IMMEDIATE")


def make_engine(url: str) -> Engine:
    """Create the engine for a URL; SQLite gets WAL and its data directory is created.

    Raises ConfigError for a malformed URL or an unsupported driver.
    """
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise ConfigError("database_url is not a valid SQLAlchemy URL") from None
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(parsed, connect_args={"check_same_thread": False}, pool_size=20, max_overflow=20)
        event.listen(engine, "connect", _sqlite_pragmas)
        event.listen(engine, "begin", _sqlite_begin)
        return engine
    if parsed.get_backend_name() != "postgresql":
        raise ConfigError(f"unsupported database {parsed.get_backend_name()!r}: use sqlite or postgresql+psycopg")
    engine = create_engine(parsed, pool_size=10, max_overflow=10)
    event.listen(engine, "checkin", _note_checkin)
    event.listen(engine, "checkout", _IdlePing(engine.dialect))
    return engine


# A pooled connection idle for longer is tested before use (the database may have restarted, or a
# firewall dropped the connection meanwhile). One in use within this time is not: SQLAlchemy's
# pool_pre_ping costs a round trip on every checkout, two per API request (the token, then the work),
# and a restart under a busy connection fails its statement whether it was pinged or not; the pool is
# then renewed on that disconnect error, and that request alone answers 503.
PING_IDLE_S = 5.0


def _note_checkin(_dbapi_connection: Any, record: Any) -> None:
    record.info["checked_in_at"] = time.monotonic()


class _IdlePing:
    """The pool's checkout hook: ping a connection that has been idle for PING_IDLE_S or longer."""

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect

    def __call__(self, dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        checked_in_at = record.info.get("checked_in_at")
        if checked_in_at is None or time.monotonic() - checked_in_at < PING_IDLE_S:
            return  # new, or in use a moment ago
        try:
            self.dialect.do_ping(dbapi_connection)
        except Exception as exc:  # whatever the driver raises for a dead connection
            # The documented way to have the pool drop this connection and check out another.
            raise DisconnectionError(f"pooled connection failed its ping: {exc}") from exc


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def _reader(engine: Engine) -> Engine:
    """The engine a read-only transaction uses (a view of `engine`: 20 µs to make, so made each time). On
    PostgreSQL it runs in autocommit: at READ COMMITTED, PostgreSQL's default and gpufleet's, every
    statement reads its own snapshot inside a transaction too, so BEGIN and COMMIT bought a read nothing
    but two round trips (a third of an API request's, each one a hand-over of the interpreter lock between
    request threads). SQLite keeps its deferred BEGIN: there a transaction is one snapshot, and the marker
    only spares it the write lock."""
    options: dict[str, Any] = {READONLY: True}
    if engine.dialect.name == "postgresql":
        options["isolation_level"] = "AUTOCOMMIT"
    return engine.execution_options(**options)


@contextmanager
def transaction(factory: sessionmaker[Session], *, readonly: bool = False) -> Iterator[Session]:
    """One unit of work: commit on success, roll back on any error. Services never commit themselves.

    `readonly` promises that the block only reads; on SQLite it then takes no write lock. Raises
    Unavailable when the database cannot be reached or stays locked.
    """
    try:
        if readonly:
            with factory(bind=_reader(factory.kw["bind"])) as session, session.begin():
                yield session
                if session.new or session.dirty or session.deleted:
                    raise RuntimeError("a read-only transaction tried to write")
        else:
            with factory.begin() as session:
                yield session
    except OperationalError as exc:
        raise Unavailable(f"database error: {exc.orig}") from exc
    except IntegrityError as exc:
        # A uniqueness race the service's own check could not see (two replicas adding one name).
        raise Conflict("the change conflicts with a concurrent one; retry") from exc


def enum_values(enum_cls: type[enum.Enum]) -> list[str]:
    """Store enums by their lowercase values, not their Python names, so the database reads like the API."""
    return [str(member.value) for member in enum_cls]
