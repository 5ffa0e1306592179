"""GPU samples charged to the jobs holding the GPUs: mean utilization per job, idle GPUs held."""

import pytest
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.core.clock import FakeClock, to_datetime
from gpufleet.core.db import transaction
from gpufleet.jobs.models import Job, JobState
from gpufleet.monitoring import attribution, store
from gpufleet.protocol.metrics import EntityValues, Sample
from tests.jobs.helpers import cluster, job, node_id, ranks, report, submit, tick, users
from tests.sharing.helpers import H200, SEVEN_1G, add_node


def _sample(sessions: sessionmaker[Session], node: int, utils: dict[int, float], ts: float) -> None:
    entities = [EntityValues(entity=f"gpu:{i}", values={"gpu_util": u}) for i, u in utils.items()]
    with transaction(sessions) as s:
        store.write_rows(s, store.sample_rows(node, [Sample(ts=ts, entities=entities)]))


def test_samples_of_a_jobs_own_gpus_make_its_utilization_and_idle_ones_are_listed(
    sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    cluster(sessions, clock, nodes=1, gpus=4)
    users(sessions, clock, "alice")
    busy = submit(sessions, clock, gpus_per_node=2)
    idle = submit(sessions, clock, gpus_per_node=1)
    tick(sessions, clock)
    for job_id in (busy, idle):
        report(sessions, clock, job_id, state="running")
    n1 = node_id(sessions, "n1")
    busy_gpus = ranks(sessions, busy)[0].gpu_indexes
    idle_gpu = ranks(sessions, idle)[0].gpu_indexes[0]
    free_gpu = ({0, 1, 2, 3} - set(busy_gpus) - {idle_gpu}).pop()
    # The free GPU is busy (someone else's process): it must not count for any job.
    utils = {busy_gpus[0]: 90.0, busy_gpus[1]: 50.0, idle_gpu: 1.0, free_gpu: 100.0}
    _sample(sessions, n1, utils, clock.now())
    with transaction(sessions) as s:
        assert attribution.attribute(s, clock.now(), 10.0, metrics_interval_s=5.0) == 3
    assert job(sessions, busy).mean_gpu_util == pytest.approx(70.0)
    assert job(sessions, idle).mean_gpu_util == pytest.approx(1.0)
    with transaction(sessions, readonly=True) as s:
        held = attribution.idle_gpus(s, clock.now(), metrics_interval_s=5.0)
    assert [(g.job_id, g.node, g.gpu, g.user) for g in held] == [(idle, "n1", idle_gpu, "alice")]

    clock.advance(60)  # the sample is stale now: nothing is charged, nothing is called idle
    with transaction(sessions) as s:
        assert attribution.attribute(s, clock.now(), 10.0, metrics_interval_s=5.0) == 0
        assert attribution.idle_gpus(s, clock.now(), metrics_interval_s=5.0) == []
    assert job(sessions, busy).sampled_gpu_seconds == pytest.approx(20.0)


def test_a_job_slurm_runs_is_charged_for_the_gpus_slurm_gave_it(
    sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    cluster(sessions, clock, nodes=2, gpus=4)
    with transaction(sessions) as s:
        row = Job(
            user="alice",
            submitted_by="slurm",
            state=JobState.RUNNING,
            nodes=2,
            gpus_per_node=1,
            time_limit_s=600,
            argv=[],
            env={},
            backend="slurm",
            external_id="812",
            allocation={"n1": [2], "n2": [0]},
            submitted_at=to_datetime(clock.now()),
            started_at=to_datetime(clock.now()),
        )
        s.add(row)
        s.flush()
        slurm_job = row.id
    _sample(sessions, node_id(sessions, "n1"), {0: 100.0, 2: 80.0}, clock.now())
    _sample(sessions, node_id(sessions, "n2"), {0: 2.0, 1: 100.0}, clock.now())
    with transaction(sessions) as s:
        assert attribution.attribute(s, clock.now(), 10.0, metrics_interval_s=5.0) == 2
        held = attribution.idle_gpus(s, clock.now(), metrics_interval_s=5.0)
    assert job(sessions, slurm_job).mean_gpu_util == pytest.approx(41.0)
    assert [(g.job_id, g.node, g.gpu) for g in held] == [(slurm_job, "n2", 0)]


def test_a_mig_device_weighs_its_share_of_its_gpus_utilization(
    sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    node = add_node(sessions, clock, "m1", [(H200, SEVEN_1G), (H200, None)])
    users(sessions, clock, "alice")
    slice_job = submit(sessions, clock, gpu_profile="1g.18gb", gpus_per_node=2)
    whole = submit(sessions, clock, gpus_per_node=1)
    tick(sessions, clock)
    for job_id in (slice_job, whole):
        report(sessions, clock, job_id, state="running")
    _sample(sessions, node, {0: 40.0, 1: 80.0}, clock.now())

    with transaction(sessions) as s:
        assert attribution.attribute(s, clock.now(), 70.0, metrics_interval_s=5.0) == 3

    # Two 1g devices of GPU 0: 2/7 of 70 s sampled, at GPU 0's 40 %; the whole GPU all 70 s at 80 %.
    assert job(sessions, slice_job).sampled_gpu_seconds == pytest.approx(20.0)
    assert job(sessions, slice_job).mean_gpu_util == pytest.approx(40.0)
    assert job(sessions, whole).sampled_gpu_seconds == pytest.approx(70.0)
