"""Fleet-wide metrics on SQLite and PostgreSQL: newest sample per node, fleet roll-ups, fleet charts."""

import asyncio
import json

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.core.clock import FakeClock
from gpufleet.core.db import transaction
from gpufleet.inventory import service as inventory
from gpufleet.inventory.schemas import NodeSettings
from gpufleet.jobs.builtin import BuiltinWorkloadManager
from gpufleet.monitoring import fleet, store
from gpufleet.monitoring.health import HealthJudge
from gpufleet.monitoring.models import FleetRollup, MetricRollup
from gpufleet.monitoring.tracker import HealthTracker
from gpufleet.protocol.metrics import EntityValues, Sample
from gpufleet.workers import rollup_process
from gpufleet.workers.monitoring_loops import MonitoringLoops

# One database: aggregation logic (test_health runs both).
pytestmark = pytest.mark.one_database

T0 = 1_800_000_000.0  # a minute boundary


def _nodes(sessions: sessionmaker[Session], clock: FakeClock, *names: str) -> list[int]:
    with transaction(sessions) as s:
        return [n.id for n in inventory.add_nodes(s, clock, list(names), NodeSettings())]


def _sample(ts: float, gpus: dict[int, tuple[float, float, float]]) -> Sample:
    """A sample with a host entity and, per GPU index, (gpu_util, power_w, gpu_temp_c)."""
    return Sample(
        ts=ts,
        entities=[EntityValues(entity="host", values={"cpu_util": 99.0})]
        + [
            EntityValues(
                entity=f"gpu:{i}",
                values={"gpu_util": util, "power_w": power, "gpu_temp_c": temp, "energy_mj": 1e9},
            )
            for i, (util, power, temp) in gpus.items()
        ],
    )


def _write(sessions: sessionmaker[Session], node_id: int, samples: list[Sample]) -> None:
    with transaction(sessions) as s:
        store.write_rows(s, store.sample_rows(node_id, samples))


def _two_nodes_two_minutes(sessions: sessionmaker[Session], clock: FakeClock) -> tuple[int, int]:
    """Minute T0: both nodes, GPUs with different sample counts. Minute T0+60: only n1 reports."""
    n1, n2 = _nodes(sessions, clock, "n1", "n2")
    _write(
        sessions,
        n1,
        [
            _sample(T0, {0: (10, 100, 50), 1: (40, 300, 60)}),
            _sample(T0 + 30, {0: (30, 200, 50)}),  # gpu:1 missed this one
            _sample(T0 + 60, {0: (90, 800, 40), 1: (10, 850, 50)}),
        ],
    )
    _write(
        sessions,
        n2,
        [
            _sample(T0 + 10, {0: (60, 400, 70), 1: (100, 500, 80)}),
            _sample(T0 + 40, {0: (80, 400, 70), 1: (100, 500, 80)}),
        ],
    )
    return n1, n2


def _fleet_rows(sessions: sessionmaker[Session]) -> dict[float, dict[str, list[float]]]:
    with transaction(sessions, readonly=True) as s:
        rows = s.execute(select(FleetRollup.bucket, FleetRollup.values).order_by(FleetRollup.bucket)).all()
    return {bucket: json.loads(raw) for bucket, raw in rows}


def test_latest_gpu_values_picks_each_nodes_newest_row_since(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    fresh, behind, stale, silent = _nodes(sessions, clock, "fresh", "behind", "stale", "silent")
    _write(sessions, fresh, [_sample(T0 + i, {0: (float(i), 100, 50)}) for i in (0, 10, 5)])  # newest not last
    _write(sessions, behind, [_sample(T0 - 100, {0: (1, 1, 1)}), _sample(T0 - 5, {0: (2, 2, 2)})])
    _write(sessions, stale, [_sample(T0 - 100, {0: (3, 3, 3)})])
    with transaction(sessions, readonly=True) as s:
        latest = fleet.latest_gpu_values(s, since=T0 - 10)
    assert set(latest) == {fresh, behind}  # stale's only sample is too old; silent has none
    assert stale not in latest
    assert silent not in latest
    assert latest[fresh]["gpu:0"]["gpu_util"] == 10.0
    assert "host" not in latest[fresh]  # only the GPUs' summary metrics: energy_mj is not one
    assert latest[behind]["gpu:0"] == {"gpu_util": 2.0, "power_w": 2.0, "gpu_temp_c": 2.0}
    with transaction(sessions, readonly=True) as s:
        assert fleet.latest_gpu_values(s, since=T0 + 11) == {}


def test_fleet_rollups_sum_every_gpus_mean_once_per_bucket(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    _two_nodes_two_minutes(sessions, clock)
    with transaction(sessions) as s:
        assert store.rollup(s, until=T0 + 125) == 3  # n1 and n2 at T0, n1 at T0+60
    expected = {
        # util: GPU means 20, 40, 70, 100 (not the mean of the six samples, 53.3); power: 150+300+400+500
        T0: {"gpu_util": [230.0, 4.0], "power_w": [1350.0, 4.0], "gpu_temp_c": [260.0, 4.0]},
        T0 + 60: {"gpu_util": [100.0, 2.0], "power_w": [1650.0, 2.0], "gpu_temp_c": [90.0, 2.0]},
    }
    assert _fleet_rows(sessions) == expected  # host metrics and counters (energy_mj) are left out
    with transaction(sessions) as s:
        assert store.rollup(s, until=T0 + 125) == 0
        # the same rows again, as from a second leader that read before the first one wrote: skipped
        rows = store.fleet_rollup_rows(
            [{"node_id": 1, "bucket": T0, "values": json.dumps({"gpu:0": {"gpu_util": [1, 1, 1, 1]}})}]
        )
        store.write_fleet_rollups(s, rows)
    assert _fleet_rows(sessions) == expected


def test_the_leaders_rollup_pass_writes_fleet_rollups(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    _two_nodes_two_minutes(sessions, clock)
    judge = HealthJudge(tracker=HealthTracker(), workload=BuiltinWorkloadManager(clock), resume_after_rounds=3)
    loops = MonitoringLoops(sessions=sessions, clock=clock, judge=judge, is_leader=lambda: True)
    clock.advance(T0 + 70 - clock.now())
    assert loops.rollup_once() == 2
    assert list(_fleet_rows(sessions)) == [T0]
    clock.advance(60)
    assert loops.rollup_once() == 1
    assert loops.rollup_once() == 0
    assert _fleet_rows(sessions)[T0 + 60]["power_w"] == [1650.0, 2.0]
    assert len(_fleet_rows(sessions)) == 2


def test_the_loop_aggregates_in_its_own_process_what_rollup_once_would(
    sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    """The loop's roll-up aggregates in a spawned worker process (off the head's GIL) and writes the
    same rows as the in-process pass."""
    _two_nodes_two_minutes(sessions, clock)
    clock.advance(T0 + 130 - clock.now())
    judge = HealthJudge(tracker=HealthTracker(), workload=BuiltinWorkloadManager(clock), resume_after_rounds=3)
    loops = MonitoringLoops(sessions=sessions, clock=clock, judge=judge, is_leader=lambda: True, rollup_every_s=0.2)
    url = sessions.kw["bind"].url.render_as_string(hide_password=False)
    with transaction(sessions, readonly=True) as s:
        expected = store.rollup_rows(s, clock.now())
    assert rollup_process.aggregate(url, clock.now()) == (expected, store.fleet_rollup_rows(expected))

    async def run_until_rolled_up() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(loops.run(stop))
        try:
            for _ in range(300):  # the worker's spawn takes a second or two on a busy machine
                if len(_fleet_rows(sessions)) == 2:
                    break
                await asyncio.sleep(0.1)
        finally:
            stop.set()
            await task

    asyncio.run(run_until_rolled_up())
    assert _fleet_rows(sessions)[T0 + 60]["power_w"] == [1650.0, 2.0]
    with transaction(sessions, readonly=True) as s:
        assert s.scalar(select(func.count()).select_from(MetricRollup)) == 3
        assert store.rollup_window(s, clock.now()) is None  # nothing left to roll up


def test_fleet_series_mean_util_and_total_power(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    _two_nodes_two_minutes(sessions, clock)
    with transaction(sessions) as s:
        store.rollup(s, until=T0 + 125)
    with transaction(sessions, readonly=True) as s:
        by_minute = fleet.fleet_series(s, T0, T0 + 120, 60)
        by_two = fleet.fleet_series(s, T0, T0 + 120, 120)
        # a third minute without a roll-up is a gap: power stays the mean of the minutes there are
        by_three = fleet.fleet_series(s, T0, T0 + 180, 180)
        later = fleet.fleet_series(s, T0 + 60, T0 + 120, 60)
        with pytest.raises(ValueError, match="non-empty"):
            fleet.fleet_series(s, T0, T0, 60)
        with pytest.raises(ValueError, match="positive"):
            fleet.fleet_series(s, T0, T0 + 60, 0)
        with pytest.raises(ValueError, match="larger step"):
            fleet.fleet_series(s, T0, T0 + 86_400, 1)
    assert by_minute == {
        "gpu_util": [(T0, 57.5), (T0 + 60, 50.0)],
        "power_w": [(T0, 1350.0), (T0 + 60, 1650.0)],
        "gpu_temp_c": [(T0, 65.0), (T0 + 60, 45.0)],
    }
    # util over GPU-minutes (230 + 100) / 6; power the mean of the two minutes' totals
    assert by_two == {
        "gpu_util": [(T0, 55.0)],
        "power_w": [(T0, 1500.0)],
        "gpu_temp_c": [(T0, pytest.approx(350 / 6))],
    }
    assert by_three["power_w"] == [(T0, 1500.0)]
    assert later["power_w"] == [(T0 + 60, 1650.0)]


def test_prune_removes_old_fleet_rollups(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    _two_nodes_two_minutes(sessions, clock)
    with transaction(sessions) as s:
        store.rollup(s, until=T0 + 125)
    retention = store.Retention(raw_s=3600, rollup_s=86_400)
    with transaction(sessions) as s:
        store.prune(s, T0 + 86_400 + 30, retention)  # T0 is older than a day then, T0+60 is not
    assert list(_fleet_rows(sessions)) == [T0 + 60]
    with transaction(sessions) as s:
        store.prune(s, T0 + 86_400 + 61, retention)
    with transaction(sessions, readonly=True) as s:
        assert s.scalar(select(func.count()).select_from(FleetRollup)) == 0
