"""The metric store on SQLite and PostgreSQL: batches in, buckets out, roll-ups for older data."""

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.core.clock import FakeClock
from gpufleet.core.db import transaction
from gpufleet.inventory import service as inventory
from gpufleet.inventory.schemas import NodeSettings
from gpufleet.monitoring import store
from gpufleet.monitoring.models import MetricRollup, MetricSample
from gpufleet.protocol.metrics import EntityValues, Sample

T0 = 1_800_000_000.0  # a minute boundary


def _node(sessions: sessionmaker[Session], clock: FakeClock) -> int:
    with transaction(sessions) as s:
        return inventory.add_nodes(s, clock, ["n1"], NodeSettings())[0].id


def _sample(ts: float, util: float) -> Sample:
    return Sample(
        ts=ts,
        entities=[
            EntityValues(entity="host", values={"cpu_util": 1.0}),
            EntityValues(entity="gpu:0", values={"gpu_util": util, "power_w": 100 + util}),
        ],
    )


def test_samples_come_back_averaged_per_step(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    node_id = _node(sessions, clock)
    samples = [_sample(T0 + i * 5, util=float(i)) for i in range(24)]  # two minutes at 5 s
    with transaction(sessions) as s:
        store.write_rows(s, store.sample_rows(node_id, samples))
    retention = store.Retention()
    with transaction(sessions, readonly=True) as s:
        points = store.query(s, node_id, "gpu:0", "gpu_util", T0, T0 + 120, 60, retention, T0 + 120)
        assert points == [(T0, 5.5), (T0 + 60, 17.5)]
        assert store.query(s, node_id, "gpu:0", "no_such_metric", T0, T0 + 120, 60, retention, T0 + 120) == []
        assert store.query(s, node_id, "gpu:1", "gpu_util", T0, T0 + 120, 60, retention, T0 + 120) == []
        with pytest.raises(ValueError, match="larger step"):
            store.query(s, node_id, "gpu:0", "gpu_util", T0, T0 + 86_400, 1, retention, T0 + 120)


def test_rollups_answer_for_data_older_than_the_raw_retention(
    sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    node_id = _node(sessions, clock)
    with transaction(sessions) as s:
        store.write_rows(s, store.sample_rows(node_id, [_sample(T0 + i * 5, float(i)) for i in range(24)]))
    with transaction(sessions) as s:
        assert store.rollup(s, until=T0 + 130) == 2  # 2 complete minutes of one node
    with transaction(sessions) as s:
        assert store.rollup(s, until=T0 + 130) == 0  # nothing rolled up twice
    retention = store.Retention(raw_s=3600, rollup_s=30 * 86_400)
    later = T0 + 7200
    with transaction(sessions) as s:
        store.prune(s, later, retention)
    with transaction(sessions, readonly=True) as s:
        assert s.scalar(select(func.count()).select_from(MetricSample)) == 0
        assert s.scalar(select(func.count()).select_from(MetricRollup)) == 2
        points = store.query(s, node_id, "gpu:0", "gpu_util", T0, T0 + 120, 120, retention, later)
    assert points == [(T0, pytest.approx(11.5))]  # the mean of 0..23, from the two roll-ups


def test_removing_a_node_removes_its_samples(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    node_id = _node(sessions, clock)
    with transaction(sessions) as s:
        store.write_rows(s, store.sample_rows(node_id, [_sample(T0, 1.0)]))
    with transaction(sessions) as s:
        inventory.remove_nodes(s, ["n1"])
    with transaction(sessions, readonly=True) as s:
        assert s.scalar(select(func.count()).select_from(MetricSample)) == 0
