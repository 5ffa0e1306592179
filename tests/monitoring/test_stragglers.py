"""Stragglers: a GPU of a multi-GPU job well below its peers is flagged (after two passes), named with
its job, and the alert resolves when it keeps up again."""

from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.core.clock import FakeClock
from gpufleet.core.db import transaction
from gpufleet.monitoring import store, stragglers
from gpufleet.monitoring.attribution import HeldGpu, held_gpus
from gpufleet.monitoring.models import Alert
from gpufleet.protocol.metrics import EntityValues, Sample
from tests.jobs.helpers import cluster, node_id, ranks, report, submit, tick, users

SINCE = datetime(2026, 1, 1, tzinfo=UTC)


def held(job_id: int, node: str, index: int, util: float, power: float | None = None) -> HeldGpu:
    job: Any = SimpleNamespace(id=job_id, name=f"job{job_id}")
    return HeldGpu(job, node, index, util, SINCE, power)


def test_a_gpu_well_below_its_busy_peers_is_a_straggler() -> None:
    gpus = [held(1, "n1", i, 95.0, 650.0) for i in range(4)] + [held(1, "n2", i, 94.0, 640.0) for i in range(3)]
    gpus.append(held(1, "n2", 3, 19.0, 210.0))
    found = stragglers.find(gpus)
    assert [(s.node, s.index, s.util, s.peers_util) for s in found] == [("n2", 3, 19.0, 95.0)]
    # The median of the seven others: four at 650 W, three at 640 W.
    expected = "GPU 3 of job 1 (job1) at 19 % utilization; its peers' median 95 %, 210 W against 650 W"
    assert found[0].summary() == expected


def test_power_alone_can_name_a_straggler_and_idle_or_single_gpu_jobs_have_none() -> None:
    weak = [held(2, "n1", 0, 90.0, 600.0), held(2, "n1", 1, 88.0, 180.0), held(2, "n1", 2, 91.0, 610.0)]
    assert [(s.index, s.power_w) for s in stragglers.find(weak)] == [(1, 180.0)]
    idle = [held(3, "n1", 0, 20.0), held(3, "n1", 1, 2.0)]  # the peers are not busy: nothing to lag behind
    alone = [held(4, "n1", 0, 3.0)]
    even = [held(5, "n1", i, 60.0 + i) for i in range(4)]
    assert stragglers.find(idle + alone + even) == []
    two = [held(6, "n1", 0, 100.0), held(6, "n2", 0, 20.0)]  # a two-GPU job: the slow one, not the fast
    assert [(s.node, s.index) for s in stragglers.find(two)] == [("n2", 0)]


def _sample(sessions: sessionmaker[Session], node: int, utils: dict[int, float], ts: float) -> None:
    entities = [EntityValues(entity=f"gpu:{i}", values={"gpu_util": u}) for i, u in utils.items()]
    with transaction(sessions) as s:
        store.write_rows(s, store.sample_rows(node, [Sample(ts=ts, entities=entities)]))


def _firing(sessions: sessionmaker[Session]) -> list[tuple[str, int | None, str]]:
    with transaction(sessions, readonly=True) as s:
        rows = s.scalars(select(Alert).where(Alert.rule == "GpuStraggler", Alert.status == "firing"))
        return [(a.node_name, a.gpu, a.labels["entity"]) for a in rows]


def test_the_leaders_pass_fires_after_two_passes_and_resolves_when_it_keeps_up(
    sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    cluster(sessions, clock, nodes=2, gpus=2)
    users(sessions, clock, "alice")
    job_id = submit(sessions, clock, nodes=2, gpus_per_node=2)
    tick(sessions, clock)
    for rank in ranks(sessions, job_id):
        report(sessions, clock, job_id, state="running", rank=rank.rank, node=rank.node)
    watch = stragglers.StragglerWatch()

    def one_pass(n2_gpu1: float) -> list[Alert]:
        clock.advance(10)
        _sample(sessions, node_id(sessions, "n1"), {0: 97.0, 1: 96.0}, clock.now())
        _sample(sessions, node_id(sessions, "n2"), {0: 95.0, 1: n2_gpu1}, clock.now())
        with transaction(sessions) as s:
            return watch.check(s, clock, list(held_gpus(s, clock.now(), metrics_interval_s=5.0)))

    assert one_pass(15.0) == []  # suspect once: not yet
    assert [a.summary for a in one_pass(14.0)] == [
        f"GPU 1 of job {job_id} (sleep) at 14 % utilization; its peers' median 96 %"  # named after its command
    ]
    assert _firing(sessions) == [("n2", 1, f"job:{job_id}/gpu:1")]
    assert one_pass(13.0) == []  # still firing: nothing new to notify
    resolved = one_pass(94.0)
    assert [(a.status, a.gpu) for a in resolved] == [("resolved", 1)]
    assert _firing(sessions) == []
