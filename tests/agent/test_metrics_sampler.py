"""The sampler: a failing collector costs its own values only and is reported once per distinct error."""

from __future__ import annotations

from gpufleet.agent.metrics.gpu import GpuCollector
from gpufleet.agent.metrics.ports import Collected, CollectorError
from gpufleet.agent.metrics.sampler import Sampler
from gpufleet.protocol.metrics import MAX_GPU_JOBS_PER_SAMPLE, GpuJob
from gpufleet.sim.nvml import SimulatedNvml


class Fixed:
    def __init__(self, name: str, collected: Collected) -> None:
        self.name = name
        self.collected = collected

    def collect(self) -> Collected:
        return self.collected


class Failing:
    name = "broken"

    def __init__(self, error: Exception) -> None:
        self.error = error

    def collect(self) -> Collected:
        raise self.error


def test_one_failing_collector_never_stops_the_others() -> None:
    failing = Failing(CollectorError("NVML unavailable: nvmlInit failed: Driver Not Loaded"))
    sampler = Sampler([failing, GpuCollector(SimulatedNvml("n1", gpu_count=2))], clock=lambda: 1000.0)

    sample, events = sampler.collect()
    again, events_again = sampler.collect()

    assert sample.ts == 1000.0
    assert sorted(e.entity for e in sample.entities) == ["gpu:0", "gpu:1", "host"]
    assert [(e.kind, e.message) for e in events] == [
        ("collector_failed", "broken: NVML unavailable: nvmlInit failed: Driver Not Loaded")
    ]
    assert events_again == []  # the same failure is reported once
    assert sorted(e.entity for e in again.entities) == ["gpu:0", "gpu:1", "host"]

    failing.error = RuntimeError("a bug")
    assert [e.message for e in sampler.collect()[1]] == ["broken: a bug"]  # a new failure is news


def test_a_collector_bug_is_caught_like_any_failure() -> None:
    _, events = Sampler([Failing(ZeroDivisionError())]).collect()

    assert [e.message for e in events] == ["broken: ZeroDivisionError"]


def test_problems_are_reported_once_and_the_round_keeps_the_rest() -> None:
    partial = Fixed("gpu", Collected(entities={"gpu:0": {"gpu_util": 5.0}}, problems=["GPU 1: sm_clock: Unknown"]))
    sampler = Sampler([partial])

    sample, events = sampler.collect()

    assert [e.message for e in events] == ["gpu: GPU 1: sm_clock: Unknown"]
    assert sampler.collect()[1] == []
    assert {e.entity: e.values for e in sample.entities}["gpu:0"] == {"gpu_util": 5.0}


def test_every_sample_says_how_long_it_took() -> None:
    sample, _ = Sampler([]).collect()

    assert [e.entity for e in sample.entities] == ["host"]
    assert 0 <= sample.entities[0].values["metrics_collect_s"] < 1


def test_values_the_wire_cannot_carry_are_dropped_not_the_sample() -> None:
    odd = Collected(
        entities={
            "gpu:0": {"gpu_util": float("nan"), "power_w": float("inf"), "gpu_temp_c": 40.0},
            "nic:has space": {"net_up": 1.0},  # the protocol's entity names have no spaces
            "host": {"Bad-Metric": 1.0},
        }
    )

    sample, events = Sampler([Fixed("odd", odd)]).collect()

    assert {e.entity: e.values for e in sample.entities} == {"gpu:0": {"gpu_temp_c": 40.0}}
    assert sorted(e.message.split(":")[0] for e in events) == ["sampler", "sampler"]
    assert all(e.kind == "collector_failed" for e in events)


def test_gpu_jobs_from_the_collectors_go_with_the_sample_bounded() -> None:
    jobs = [GpuJob(gpu=i % 64, job=str(i)) for i in range(MAX_GPU_JOBS_PER_SAMPLE + 5)]
    sampler = Sampler(
        [Fixed("gpu", Collected(entities={"gpu:0": {"gpu_util": 5.0}})), Fixed("slurm", Collected(gpu_jobs=jobs))]
    )

    sample, events = sampler.collect()

    assert sample.gpu_jobs == jobs[:MAX_GPU_JOBS_PER_SAMPLE]
    assert [e.message for e in events] == [
        f"sampler: {MAX_GPU_JOBS_PER_SAMPLE + 5} GPU jobs, only {MAX_GPU_JOBS_PER_SAMPLE} sent"
    ]
    assert Sampler([Fixed("gpu", Collected())]).collect()[0].gpu_jobs == []
