"""One row the database refuses costs only that row: every other node's samples, log lines and jobs'
output in the same flush are written (workers.batches)."""

from __future__ import annotations

import math
from typing import Any

import pytest
from sqlalchemy import delete, select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.core.clock import FakeClock
from gpufleet.core.db import transaction
from gpufleet.core.errors import Unavailable
from gpufleet.inventory import service as inventory
from gpufleet.inventory.models import Node
from gpufleet.inventory.schemas import NodeSettings
from gpufleet.jobs.builtin import BuiltinWorkloadManager
from gpufleet.logs.models import LogRecord
from gpufleet.monitoring.health import HealthJudge
from gpufleet.monitoring.models import MetricSample
from gpufleet.monitoring.tracker import HealthTracker
from gpufleet.protocol.logs import LogLine
from gpufleet.protocol.metrics import EntityValues, Sample
from gpufleet.workers import batches
from gpufleet.workers.monitoring_loops import MonitoringLoops

NODES = ["a1", "a2", "a3", "a4"]


@pytest.fixture
def loops(sessions: sessionmaker[Session], clock: FakeClock) -> MonitoringLoops:
    with transaction(sessions) as s:
        inventory.add_nodes(s, clock, NODES, NodeSettings())
    judge = HealthJudge(tracker=HealthTracker(), workload=BuiltinWorkloadManager(clock), resume_after_rounds=3)
    return MonitoringLoops(sessions=sessions, clock=clock, judge=judge, is_leader=lambda: True)


def _ids(sessions: sessionmaker[Session]) -> dict[str, int]:
    with transaction(sessions, readonly=True) as s:
        return {name: node_id for node_id, name in s.execute(select(Node.id, Node.name))}


def _sample(ts: Any) -> Sample:
    # model_construct: the channel refuses these (protocol.bounds); this is the store's last line of defence.
    return Sample.model_construct(ts=ts, entities=[EntityValues(entity="gpu:0", values={"gpu_util": 50.0})])


def test_a_sample_timed_nan_is_dropped_alone(
    sessions: sessionmaker[Session], clock: FakeClock, loops: MonitoringLoops
) -> None:
    """The issue's case: SQLite stores NaN as NULL, and `ts` is NOT NULL."""
    if sessions.kw["bind"].dialect.name != "sqlite":
        pytest.skip("PostgreSQL's double precision holds NaN: the row is not refused there")
    bad_ts = math.nan
    ids = _ids(sessions)
    now = clock.now()
    for i in range(10):  # the bad one amid every node's rows, not at an edge of the batch
        name = NODES[i % len(NODES)]
        loops.ingest(ids[name], [_sample(bad_ts if (name, i) == ("a3", 6) else now + i)])
    assert loops.flush_metrics_once() == 9
    assert loops.refused_rows == 1
    with transaction(sessions, readonly=True) as s:
        stored = sorted(s.execute(select(MetricSample.node_id, MetricSample.ts)))
    assert stored == sorted((ids[NODES[i % len(NODES)]], now + i) for i in range(10) if i != 6)
    # The next flush is not poisoned by it.
    loops.ingest(ids["a3"], [_sample(now + 20)])
    assert loops.flush_metrics_once() == 1


def test_log_lines_the_database_refuses_are_dropped_alone(
    sessions: sessionmaker[Session], clock: FakeClock, loops: MonitoringLoops
) -> None:
    ids = _ids(sessions)
    now = clock.now()
    good = [(ids[name], f"line {i} of {name}") for i, name in enumerate(NODES * 5)]
    for node_id, text in good[:7]:
        loops.log_lines(node_id, [LogLine(ts=now, source="kernel", line=text)])
    loops.log_lines(ids["a2"], [LogLine.model_construct(ts=None, source="kernel", line="no time")])  # type: ignore[arg-type]  # NOT NULL
    loops.log_lines(
        ids["a4"], [LogLine(ts=now, source="kernel", line="code too large").model_copy(update={"code": 2**70})]
    )
    for node_id, text in good[7:]:
        loops.log_lines(node_id, [LogLine(ts=now, source="kernel", line=text)])
    assert loops.flush_log_lines_once() == len(good)
    assert loops.refused_rows == 2
    with transaction(sessions, readonly=True) as s:
        stored = sorted(s.execute(select(LogRecord.node_id, LogRecord.line)))
    assert stored == sorted(good)


def test_rows_of_a_node_removed_while_they_waited_are_dropped_without_the_others(
    sessions: sessionmaker[Session], clock: FakeClock, loops: MonitoringLoops
) -> None:
    ids = _ids(sessions)
    for name in NODES:
        loops.ingest(ids[name], [_sample(clock.now()), _sample(clock.now() + 1)])
    with transaction(sessions) as s:
        s.execute(delete(Node).where(Node.name == "a2"))
    assert loops.flush_metrics_once() == 6
    assert loops.refused_rows == 0  # stale, not refused
    with transaction(sessions, readonly=True) as s:
        assert set(s.scalars(select(MetricSample.node_id))) == {ids["a1"], ids["a3"], ids["a4"]}


def test_every_row_refused_costs_a_bounded_number_of_writes(sessions: sessionmaker[Session]) -> None:
    """A bug that fails every row is not bisected down to each of 10,000 rows: past MAX_ISOLATED single
    refusals the rest of what fails is given up whole."""
    calls = 0

    def broken(_session: Session, _rows: list[int]) -> None:
        nonlocal calls
        calls += 1
        raise ValueError("a bug")

    written = batches.write_isolating(sessions, range(10_000), broken)
    assert (written.stored, sorted(written.refused)) == ([], list(range(10_000)))
    assert written.first_error == "a bug"
    assert calls < 4 * batches.MAX_ISOLATED * 14  # 14 = log2(10,000): the bisection's depth


def test_a_database_that_is_away_is_no_rows_fault(sessions: sessionmaker[Session]) -> None:
    """Unavailable goes to the caller at once (it keeps its rows for the next flush): nothing is dropped."""
    calls = 0

    def away(_session: Session, _rows: list[int]) -> None:
        nonlocal calls
        calls += 1
        raise Unavailable("database error: database is locked")

    with pytest.raises(Unavailable):
        batches.write_isolating(sessions, range(100), away)
    assert calls == 1


def test_rows_written_keep_their_order(sessions: sessionmaker[Session]) -> None:
    written_in: list[int] = []

    def odd_refused(_session: Session, rows: list[int]) -> None:
        if any(r == 13 for r in rows):
            raise ValueError("13")
        written_in.extend(rows)

    written = batches.write_isolating(sessions, range(40), odd_refused)
    assert written.refused == [13]
    assert written.stored == written_in == [r for r in range(40) if r != 13]
