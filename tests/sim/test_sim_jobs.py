"""SimulatedExecutor: durations, the time limit, cancel, the GPUs' load and exit codes, on a fake clock."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gpufleet.agent.gpu.nvml import NvmlReader
from gpufleet.agent.jobs.ports import JobExecutor, RankResult
from gpufleet.protocol.jobs import JobStart
from gpufleet.sim.jobs import SimulatedExecutor
from gpufleet.sim.nvml import SimulatedNvml


class FakeTime:
    """An asyncio.sleep stand-in: time moves by what is slept, at once."""

    def __init__(self) -> None:
        self.now = 0.0

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)


def launch(**fields: Any) -> JobStart:
    base: dict[str, Any] = {"job_id": 12, "run": 1, "rank": 0, "world_size": 1, "user": "alice", "time_limit_s": 3600}
    return JobStart(**(base | fields))


class Run:
    """One rank run on a fresh simulated node, with what it said and what the GPUs' load was meanwhile."""

    def __init__(self, **fields: Any) -> None:
        self.nvml = SimulatedNvml("node-001", gpu_count=4)
        self.time = FakeTime()
        self.executor: JobExecutor = SimulatedExecutor(self.nvml, clock_sleep=self.time.sleep, step_s=5)
        self.launch = launch(**fields)
        self.lines: list[str] = []
        self.loads: list[tuple[float, ...]] = []
        self.started = 0
        self.cancel = asyncio.Event()

    def on_output(self, stream: str, text: str) -> None:
        assert stream == "stdout"
        self.lines.append(text)
        self.loads.append(tuple(gpu.load for gpu in self.nvml.gpus))

    def on_started(self) -> None:
        self.started += 1

    async def run(self) -> RankResult:
        return await self.executor.run(self.launch, self.on_started, self.on_output, self.cancel)

    def __call__(self) -> RankResult:
        return asyncio.run(self.run())

    def final_loads(self) -> tuple[float, ...]:
        return tuple(gpu.load for gpu in self.nvml.gpus)


def test_sleep_argv_sets_the_duration_and_loads_the_allocated_gpus() -> None:
    run = Run(argv=["sleep", "12"], gpu_indexes=[1, 3])

    assert run() == RankResult("completed", 0)
    assert run.time.now == 12
    assert run.started == 1
    assert run.lines == [f"simulated job 12 rank 0: step {step}/3\n" for step in (1, 2, 3)]
    assert set(run.loads) == {(0.0, 0.9, 0.0, 0.9)}
    assert run.final_loads() == (0.0, 0.0, 0.0, 0.0)


def test_seconds_and_util_from_the_environment() -> None:
    run = Run(
        argv=["python", "train.py"], env={"GPUFLEET_SIM_SECONDS": "7", "GPUFLEET_SIM_UTIL": "0.05"}, gpu_indexes=[0]
    )

    assert run().outcome == "completed"
    assert run.time.now == 7
    assert set(run.loads) == {(0.05, 0.0, 0.0, 0.0)}
    assert run.final_loads() == (0.0, 0.0, 0.0, 0.0)


def test_sixty_seconds_by_default() -> None:
    run = Run(script="python train.py")

    assert run().outcome == "completed"
    assert run.time.now == 60
    assert len(run.lines) == 12


def test_a_duration_past_the_time_limit_ends_at_the_limit() -> None:
    run = Run(argv=["sleep", "100"], time_limit_s=30, gpu_indexes=[2])

    result = run()

    assert result.outcome == "timeout"
    assert "30 s" in result.message
    assert run.time.now == 30
    assert run.final_loads() == (0.0, 0.0, 0.0, 0.0)


def test_exit_code_from_the_environment() -> None:
    assert Run(argv=["sleep", "1"], env={"GPUFLEET_SIM_EXIT": "3"})() == RankResult("failed", 3, "exited with code 3")
    assert Run(argv=["sleep", "0"])() == RankResult("completed", 0)


def test_cancel_ends_the_rank_at_once_and_frees_the_gpus() -> None:
    nvml = SimulatedNvml("node-001", gpu_count=2)
    executor = SimulatedExecutor(nvml)  # the real asyncio.sleep: a step of 5 s
    cancel = asyncio.Event()
    loads: list[float] = []

    async def scenario() -> RankResult:
        def started() -> None:
            loads.append(nvml.gpus[1].load)
            asyncio.get_running_loop().call_later(0.05, cancel.set)

        return await asyncio.wait_for(
            executor.run(launch(argv=["sleep", "3600"], gpu_indexes=[1]), started, lambda s, t: None, cancel), 2
        )

    assert asyncio.run(scenario()).outcome == "cancelled"
    assert loads == [0.9]
    assert nvml.gpus[1].load == 0.0


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"gpu_indexes": [4]}, "GPU 4 is not on this simulated node"),
        ({"env": {"GPUFLEET_SIM_SECONDS": "soon"}}, "GPUFLEET_SIM_SECONDS"),
        ({"env": {"GPUFLEET_SIM_UTIL": "2"}}, "GPUFLEET_SIM_UTIL"),
        ({"env": {"GPUFLEET_SIM_EXIT": "x"}}, "GPUFLEET_SIM_EXIT"),
        ({"argv": ["sleep", "-1"]}, "sleep's argument"),
    ],
)
def test_what_the_simulation_cannot_do_is_an_error(fields: dict[str, Any], words: str) -> None:
    run = Run(**fields)

    result = run()

    assert result.outcome == "error"
    assert words in result.message
    assert run.started == 0


def test_a_rank_runs_on_its_mig_device_and_fails_on_one_its_node_lacks() -> None:
    run = Run(argv=["sleep", "5"], gpu_indexes=[0], gpu_uuids=["MIG-00000000-0000-0000-0000-000000000000"])
    assert run().outcome == "error"
    assert run.started == 0  # CUDA would fail at once: nothing ran

    reader = NvmlReader(run.nvml, source="simulated")
    reader.apply_mig(0, "all-1g.18gb")
    device = reader.read()[0].mig[2].uuid
    held = Run(argv=["sleep", "5"], gpu_indexes=[0], gpu_uuids=[device])
    held.nvml, held.executor = run.nvml, run.executor
    held.time = run.time

    assert held() == RankResult("completed", 0)
    reader.apply_mig(0, "none")  # raises MigError (in use) had the ended rank kept its device
