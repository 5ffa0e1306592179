"""Database plumbing on both backends: migrations match the models, the lease is exclusive."""

from datetime import UTC, datetime

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.core import db
from gpufleet.core.clock import FakeClock
from gpufleet.core.db import make_engine, make_session_factory, transaction
from gpufleet.core.errors import Unavailable
from gpufleet.core.leases import Lease, holder_of, release, try_acquire
from gpufleet.logs.models import FTS_INDEX, FTS_TABLE
from gpufleet.migrations import metadata, upgrade


def test_migrations_match_the_models(engine: Engine) -> None:
    with engine.connect() as conn:
        # The full-text index of log lines is the database's own (FTS5 tables on SQLite, a GIN expression
        # index on PostgreSQL), made by migration 0011 beside the models.
        def ours(_obj: object, name: str | None, kind: str, _reflected: bool, _compare_to: object) -> bool:
            return name not in (None, FTS_INDEX) and not (kind == "table" and str(name).startswith(FTS_TABLE))

        context = MigrationContext.configure(conn, opts={"compare_type": True, "include_object": ours})
        diff = compare_metadata(context, metadata())
    assert diff == []


def test_upgrade_is_idempotent(engine: Engine) -> None:
    upgrade(engine)  # a second start of the head must not fail


def test_lease_is_exclusive_until_it_expires(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    with transaction(sessions) as s:
        assert try_acquire(s, "leader", "a", clock.now(), ttl_s=5)
    with transaction(sessions) as s:
        assert not try_acquire(s, "leader", "b", clock.now(), ttl_s=5)
        assert try_acquire(s, "leader", "a", clock.now(), ttl_s=5)  # renewal
    clock.advance(4)
    with transaction(sessions) as s:
        assert not try_acquire(s, "leader", "b", clock.now(), ttl_s=5)
    clock.advance(2)  # a's renewal at t=0 expired at t=5
    with transaction(sessions) as s:
        assert holder_of(s, "leader", clock.now()) is None
        assert try_acquire(s, "leader", "b", clock.now(), ttl_s=5)
        assert holder_of(s, "leader", clock.now()) == "b"


def test_released_lease_is_free_at_once(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    with transaction(sessions) as s:
        assert try_acquire(s, "leader", "a", clock.now(), ttl_s=60)
        release(s, "leader", "a")
    with transaction(sessions) as s:
        assert try_acquire(s, "leader", "b", clock.now(), ttl_s=60)


def test_reads_do_not_wait_for_a_writer(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    with transaction(sessions) as writer:
        assert try_acquire(writer, "leader", "a", clock.now(), ttl_s=5)  # holds the write lock (SQLite)
        with transaction(sessions, readonly=True) as reader:
            assert holder_of(reader, "leader", clock.now()) is None  # the writer has not committed yet


def test_a_read_only_transaction_refuses_to_write(sessions: sessionmaker[Session]) -> None:
    with pytest.raises(RuntimeError, match="read-only"), transaction(sessions, readonly=True) as session:
        session.add(Lease(name="x", holder="y", expires_at=datetime.now(UTC)))
    with transaction(sessions, readonly=True) as session:
        assert session.get(Lease, "x") is None


def test_a_read_on_postgresql_opens_no_transaction_block_and_writes_stay_atomic(
    sessions: sessionmaker[Session],
) -> None:
    """On PostgreSQL a read-only transaction runs in autocommit (no BEGIN and COMMIT round trips: at READ
    COMMITTED each statement reads its own snapshot anyway); the pooled connection it used is back in a
    transaction block for the next writer, whose error still rolls everything back."""

    class Boom(Exception):
        pass

    postgres = sessions.kw["bind"].dialect.name == "postgresql"
    with transaction(sessions, readonly=True) as reader:
        if postgres:  # now() is the transaction's start: in a block, both statements would see one time
            first = reader.execute(text("SELECT now()")).scalar_one()
            reader.execute(text("SELECT pg_sleep(0.01)"))
            assert reader.execute(text("SELECT now()")).scalar_one() > first
        assert reader.get(Lease, "x") is None
    with pytest.raises(Boom), transaction(sessions) as writer:  # the same pooled connection
        writer.add(Lease(name="x", holder="y", expires_at=datetime.now(UTC)))
        writer.flush()
        if postgres:
            assert writer.execute(text("SELECT now() = statement_timestamp()")).scalar_one() is False
        raise Boom
    with transaction(sessions, readonly=True) as reader:
        assert reader.get(Lease, "x") is None


@pytest.mark.postgres
def test_a_dropped_connection_costs_one_transaction_at_most(
    postgres_url: str, postgres_admin: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL's pool pings a connection only after PING_IDLE_S of idleness: an idle connection the
    server dropped is replaced unseen; a busy one fails its one transaction (503), and the next works."""
    engine = make_engine(postgres_url)
    sessions = make_session_factory(engine)

    def backend_pid() -> int:
        with transaction(sessions, readonly=True) as s:
            return int(s.execute(text("SELECT pg_backend_pid()")).scalar_one())

    def drop(pid: int) -> None:
        with postgres_admin.connect() as conn:
            conn.execute(text("SELECT pg_terminate_backend(:pid, 5000)"), {"pid": pid})

    try:
        first = backend_pid()
        assert backend_pid() == first  # one pooled connection, reused
        drop(first)
        monkeypatch.setattr(db, "PING_IDLE_S", 0.0)  # idle long enough: pinged, found dead, replaced
        second = backend_pid()
        assert second != first

        monkeypatch.setattr(db, "PING_IDLE_S", 3600.0)  # in use a moment ago: not pinged
        drop(second)
        with pytest.raises(Unavailable):
            backend_pid()
        assert backend_pid() not in (first, second)  # the pool was renewed on the disconnect
    finally:
        engine.dispose()
