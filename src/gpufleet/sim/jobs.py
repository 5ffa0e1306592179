"""Job ranks on a simulated node: no process runs, time passes and the allocated GPUs look busy.

How long a rank "runs": `argv` ["sleep", N] runs N seconds; otherwise the job's variable
GPUFLEET_SIM_SECONDS, else 60 s. A duration past the time limit ends at the limit with outcome timeout.
While it runs, its GPUs' load is GPUFLEET_SIM_UTIL (0..1, default 0.9; a low value lets a demo show
idle GPUs held by a job), and back to 0 when it ends, however it ends. Its exit code is
GPUFLEET_SIM_EXIT (default 0: completed; anything else: failed). A progress line goes to stdout every
`step_s` seconds.

A burn-in step (argv `gpufleet-burnin KIND --seconds N ...`, see sim.burnin) runs for its N seconds times
`burnin_time_scale` (0.005 by default: a 60 s step takes 0.3 s), at most `burnin_max_s` (0.5 s), its GPUs
busy meanwhile; then it prints a line per figure and the result line the head reads, and exits 0, or 1
when the result says ok=False, or 2 for a bad command line, as the real runner does.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable

from gpufleet.agent.burnin.common import PROGRAM, Run, Usage
from gpufleet.agent.jobs.ports import OnOutput, OnStarted, RankResult
from gpufleet.protocol.burnin import format_result
from gpufleet.protocol.jobs import JobStart
from gpufleet.sim import burnin
from gpufleet.sim.nvml import SimulatedNvml

DEFAULT_SECONDS = 60.0
DEFAULT_UTIL = 0.9
# A simulated burn-in step lasts its seconds times this, at most BURNIN_MAX_S: well under a second, so a
# whole profile over a simulated fleet runs in a test.
BURNIN_TIME_SCALE = 0.005
BURNIN_MAX_S = 0.5
_BURNIN_TICKS = 4  # progress lines while a step runs


class _BadJob(Exception):
    """The job asks the simulation for something it cannot do; the message says what."""


class SimulatedExecutor:
    """A `JobExecutor` for a simulated node, over that node's `SimulatedNvml`. `clock_sleep` is how time
    passes (a test passes a fake one); `step_s` is how often a progress line is written. `burnin_faults`
    are the node's weak parts that burn-in steps measure (shared with its fault target; default: none);
    `burnin_time_scale` and `burnin_max_s` set how long a simulated step lasts. Raises ValueError for a
    negative scale or limit."""

    def __init__(
        self,
        nvml: SimulatedNvml,
        clock_sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        step_s: float = 5.0,
        *,
        burnin_faults: burnin.BurninFaults | None = None,
        burnin_time_scale: float = BURNIN_TIME_SCALE,
        burnin_max_s: float = BURNIN_MAX_S,
    ) -> None:
        if not (math.isfinite(burnin_time_scale) and burnin_time_scale >= 0):
            raise ValueError(f"the burn-in time scale must be a number, 0 or more, not {burnin_time_scale}")
        if not (math.isfinite(burnin_max_s) and burnin_max_s >= 0):
            raise ValueError(f"the burn-in step limit must be a number of seconds, 0 or more, not {burnin_max_s}")
        self.nvml = nvml
        self.sleep = clock_sleep
        self.step_s = step_s
        self.burnin_faults = burnin_faults or burnin.BurninFaults(len(nvml.gpus))
        self.burnin_time_scale = burnin_time_scale
        self.burnin_max_s = burnin_max_s

    async def run(
        self, launch: JobStart, on_started: OnStarted, on_output: OnOutput, cancel: asyncio.Event
    ) -> RankResult:
        """Let the rank's time pass; see JobExecutor.run. Never raises."""
        if launch.argv and launch.argv[0] == PROGRAM:
            return await self._burnin(launch, on_started, on_output, cancel)
        try:
            seconds, util, exit_code = _plan(launch, len(self.nvml.gpus))
            _check_devices(launch, self.nvml)
        except _BadJob as exc:
            return RankResult("error", message=str(exc))
        ends_after = min(seconds, launch.time_limit_s)
        steps = max(1, math.ceil(seconds / self.step_s))
        try:
            self.nvml.attach(launch.gpu_uuids)
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
            self.nvml.detach(launch.gpu_uuids)
            for index in launch.gpu_indexes:
                self.nvml.set_load(index, 0.0)

    async def _burnin(
        self, launch: JobStart, on_started: OnStarted, on_output: OnOutput, cancel: asyncio.Event
    ) -> RankResult:
        """Run one rank of a burn-in step: busy GPUs for a scaled time, then its figures and result line."""
        try:
            _check_gpus(launch, len(self.nvml.gpus))
        except _BadJob as exc:
            return RankResult("error", message=str(exc))
        try:
            step = burnin.parse_step(launch.argv)
        except Usage as exc:
            on_started()  # the real runner starts, then refuses its command line
            return _usage_error(exc, on_output)
        duration = min(step.seconds * self.burnin_time_scale, self.burnin_max_s)
        ends_after = min(duration, launch.time_limit_s)
        load = 1.0 if burnin.uses_gpus(step, launch.gpu_indexes) else 0.0
        gpus = f", {len(launch.gpu_indexes)} GPU(s)" if load else ""
        try:
            for index in launch.gpu_indexes:
                self.nvml.set_load(index, load)
            on_started()
            on_output(
                "stdout",
                f"{PROGRAM} {step.kind} on {self.nvml.node_name}, rank {launch.rank} of"
                f" {launch.world_size}{gpus}: {step.seconds:g} s, simulated in {duration:.3g} s\n",
            )
            for tick in range(1, _BURNIN_TICKS + 1):
                if await self._sleep_unless_cancelled(ends_after / _BURNIN_TICKS, cancel):
                    return RankResult("cancelled", message="cancelled")
                on_output("stdout", f"{step.kind}: {100 * tick // _BURNIN_TICKS}%\n")
            if duration > launch.time_limit_s:
                return RankResult("timeout", message=f"time limit of {launch.time_limit_s:g} s reached")
            return self._burnin_result(step, launch, on_output)
        finally:
            for index in launch.gpu_indexes:
                self.nvml.set_load(index, 0.0)

    def _burnin_result(self, step: Run, launch: JobStart, on_output: OnOutput) -> RankResult:
        """What the step measured, printed with its result line, and how the rank ends."""
        try:
            measured = burnin.measure(
                step, self.nvml, self.burnin_faults, launch.gpu_indexes, rank=launch.rank, world_size=launch.world_size
            )
        except Usage as exc:
            return _usage_error(exc, on_output)
        on_output("stdout", "".join(measured.lines) + format_result(measured.result))
        if measured.exit_code == 0:
            return RankResult("completed", 0)
        message = f"exited with code {measured.exit_code}: {measured.result.detail}"
        return RankResult("failed", measured.exit_code, message[:512])

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


def _usage_error(exc: Usage, on_output: OnOutput) -> RankResult:
    """A step that cannot run as asked says why on stderr and exits 2."""
    on_output("stderr", f"{PROGRAM}: {exc}\n")
    return RankResult("failed", burnin.USAGE_EXIT, f"exited with code {burnin.USAGE_EXIT}: {exc}"[:512])


def _check_gpus(launch: JobStart, gpu_count: int) -> None:
    for index in launch.gpu_indexes:
        if not 0 <= index < gpu_count:
            raise _BadJob(f"GPU {index} is not on this simulated node ({gpu_count} GPUs)")


def _check_devices(launch: JobStart, nvml: SimulatedNvml) -> None:
    """CUDA fails on a device its node does not have, such as a MIG UUID of a layout since changed."""
    unknown = sorted({u for u in launch.gpu_uuids if u} - nvml.device_uuids())
    if unknown:
        raise _BadJob(f"no GPU or MIG device {', '.join(unknown)} on this simulated node"[:512])


def _plan(launch: JobStart, gpu_count: int) -> tuple[float, float, int]:
    """The rank's duration, GPU load and exit code, from its argv and variables. Raises _BadJob."""
    _check_gpus(launch, gpu_count)
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
