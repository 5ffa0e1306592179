"""Slurm's jobs on a node's GPUs, from its samples to the head's Prometheus labels: what the tracker
keeps of them, and which GPU gets which `hpc_job` (the whole scrape: tests/api/test_prometheus_metrics.py)."""

from __future__ import annotations

from gpufleet.monitoring.prometheus import add_job_info, label_slurm_jobs
from gpufleet.monitoring.tracker import HealthTracker
from gpufleet.prometheus.exposition import Families, GpuFacts
from gpufleet.protocol.metrics import EntityValues, GpuJob, Sample

ALICE = GpuJob(gpu=0, job="40", user="alice", account="vision")
BOB = GpuJob(gpu=1, job="41", user="bob", account="physics")


def _sample(ts: float, *jobs: GpuJob, gpu: int = 0) -> Sample:
    return Sample(ts=ts, entities=[EntityValues(entity=f"gpu:{gpu}", values={"gpu_util": 1.0})], gpu_jobs=list(jobs))


def test_the_tracker_keeps_the_latest_samples_gpu_jobs() -> None:
    tracker = HealthTracker()
    assert tracker.gpu_jobs(1) == []  # a node never heard from

    tracker.add_samples(1, [_sample(10.0, ALICE)], received_at=10.0)
    assert tracker.gpu_jobs(1) == [ALICE]
    tracker.add_samples(1, [_sample(15.0, BOB)], received_at=15.0)
    assert tracker.gpu_jobs(1) == [BOB]  # replaced, not added: ALICE's job ended
    tracker.add_samples(1, [_sample(12.0, ALICE)], received_at=16.0)
    assert tracker.gpu_jobs(1) == [BOB]  # a late duplicate after a reconnect changes nothing
    tracker.add_samples(1, [_sample(20.0)], received_at=20.0)
    assert tracker.gpu_jobs(1) == []
    tracker.forget(1)
    assert tracker.gpu_jobs(1) == []


def test_the_parts_of_a_split_sample_are_merged() -> None:
    tracker = HealthTracker()
    # The outbox sends the GPU jobs in the first part only; the later parts carry none.
    tracker.add_samples(1, [_sample(10.0, ALICE, BOB, gpu=0), _sample(10.0, gpu=1)], received_at=10.0)
    assert tracker.gpu_jobs(1) == [ALICE, BOB]
    assert set(tracker.latest(1)) == {"gpu:0", "gpu:1"}


def test_a_gpu_no_gpufleet_job_holds_is_labelled_with_its_slurm_job() -> None:
    gpus = {0: GpuFacts(uuid="GPU-0", job="7"), 1: GpuFacts(uuid="GPU-1"), 2: GpuFacts(uuid="GPU-2")}
    shared = GpuJob(gpu=1, job="42", user="carol", account="")

    owners = label_slurm_jobs(gpus, [ALICE, BOB, shared, GpuJob(gpu=5, job="43", user="dan", account="x")])

    assert gpus == {
        0: GpuFacts(uuid="GPU-0", job="7"),  # gpufleet's own job holds it: its label stays
        1: GpuFacts(uuid="GPU-1", job="41"),  # shared by two Slurm jobs: the first listed
        2: GpuFacts(uuid="GPU-2"),  # no job at all
        5: GpuFacts(job="43"),  # a GPU the inventory does not list yet still gets its job
    }
    assert owners == {
        "40": ("alice", "vision"),
        "41": ("bob", "physics"),
        "42": ("carol", ""),
        "43": ("dan", "x"),
    }


def test_each_job_has_one_info_series_and_gpufleets_own_record_wins() -> None:
    families = Families()
    ours = [("12", "alice", "vision")]
    slurm = {"12": ("mallory", "other"), "9001": ("bob", "physics")}

    add_job_info(families, ours, slurm)

    (info,) = families.collect()
    assert [s.labels for s in info.samples] == [
        {"hpc_job": "12", "user": "alice", "project": "vision"},
        {"hpc_job": "9001", "user": "bob", "project": "physics"},
    ]
