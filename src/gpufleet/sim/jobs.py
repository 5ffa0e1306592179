"""Job ranks on a simulated node: no process runs, time passes and the allocated GPUs look busy.

How long a rank "runs": `argv` ["sleep", N] runs N seconds; otherwise the job's variable
GPUFLEET_SIM_SECONDS, else 60 s. A duration past the time limit ends at the limit with outcome timeout.
While it runs, its GPUs' load is GPUFLEET_SIM_UTIL (0..1, default 0.9; a low value lets a demo show
idle GPUs held by a job), and back to 0 when it ends, however it ends. Its exit code is
GPUFLEET_SIM_EXIT (default 0: completed; anything else: failed). A progress line goes to stdout every
`step_s` seconds.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable

from gpufleet.agent.jobs.ports import OnOutput, OnStarted, RankResult
from gpufleet.protocol.jobs import JobStart
from gpufleet.sim.nvml import SimulatedNvml

DEFAULT_SECONDS = 60.0
DEFAULT_UTIL = 0.9


class _BadJob(Exception):
    """The job asks the simulation for something it cannot do; the message says what."""


class SimulatedExecutor:
    """A `JobExecutor` for a simulated node, over that node's `SimulatedNvml`. `clock_sleep` is how time
    passes (a test passes a fake one); `step_s` is how often a progress line is written."""

    def __init__(
        self,
        nvml: SimulatedNvml,
        clock_sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        step_s: float = 5.0,
    ) -> None:
        self.nvml = nvml
        self.sleep = clock_sleep
        self.step_s = step_s

    async def run(
        self, launch: JobStart, on_started: OnStarted, on_output: OnOutput, cancel: asyncio.Event
    ) -> RankResult:
        """Let the rank's time pass; see JobExecutor.run. Never raises."""
        try:
            seconds, util, exit_code = _plan(launch, len(self.nvml.gpus))
        except _BadJob as exc:
            return RankResult("error", message=str(exc))
        ends_after = min(seconds, launch.time_limit_s)
        steps = max(1, math.ceil(seconds / self.step_s))
        try:
            for index in launch.gpu_indexes:
                self.nvml.set_load(index, util)
            on_started()
            elapsed, step = 0.0, 0
            while elapsed < ends_after:
                wait = min(self.step_s, ends_after - elapsed)
                if await self._sleep_unless_cancelled(wait, cancel):
                    return RankResult("cancelled", message="cancelled")
                elapsed += wait
                step += 1
                on_output("stdout", f"simulated job {launch.job_id} rank {launch.rank}: step {step}/{steps}\n")
            if seconds > launch.time_limit_s:
                return RankResult("timeout", message=f"time limit of {launch.time_limit_s:g} s reached")
            if exit_code == 0:
                return RankResult("completed", 0)
            return RankResult("failed", exit_code, f"exited with code {exit_code}")
        finally:
            for index in launch.gpu_indexes:
                self.nvml.set_load(index, 0.0)

    async def _sleep_unless_cancelled(self, seconds: float, cancel: asyncio.Event) -> bool:
        """Let `seconds` pass; True when the rank was cancelled first (at once, not at the step's end)."""
        sleeping = asyncio.ensure_future(self.sleep(seconds))
        cancelled = asyncio.ensure_future(cancel.wait())
        try:
            await asyncio.wait({sleeping, cancelled}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeping.cancel()
            cancelled.cancel()
        return cancel.is_set()


def _plan(launch: JobStart, gpu_count: int) -> tuple[float, float, int]:
    """The rank's duration, GPU load and exit code, from its argv and variables. Raises _BadJob."""
    for index in launch.gpu_indexes:
        if not 0 <= index < gpu_count:
            raise _BadJob(f"GPU {index} is not on this simulated node ({gpu_count} GPUs)")
    if len(launch.argv) == 2 and launch.argv[0] == "sleep":
        seconds = _number(launch.argv[1], "sleep's argument")
    else:
        seconds = _number(launch.env.get("GPUFLEET_SIM_SECONDS", str(DEFAULT_SECONDS)), "GPUFLEET_SIM_SECONDS")
    util = _number(launch.env.get("GPUFLEET_SIM_UTIL", str(DEFAULT_UTIL)), "GPUFLEET_SIM_UTIL")
    if not 0.0 <= util <= 1.0:
        raise _BadJob(f"GPUFLEET_SIM_UTIL must be between 0 and 1, not {util:g}")
    try:
        exit_code = int(launch.env.get("GPUFLEET_SIM_EXIT", "0"))
    except ValueError:
        raise _BadJob("GPUFLEET_SIM_EXIT must be an integer") from None
    return seconds, util, exit_code


def _number(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise _BadJob(f"{what} must be a number, 0 or more, not {text!r}")
    return value
