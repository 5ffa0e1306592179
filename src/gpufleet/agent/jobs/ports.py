"""What the agent's job supervisor needs from an executor: run one rank to its end.

Two executors exist: `agent.jobs.process.ProcessExecutor` runs real processes (as the submitting user,
in a container where asked, under cgroup limits where available), and `sim.jobs.SimulatedExecutor`
lets time pass and loads the simulated GPUs. The supervisor (`agent.jobs.supervisor`) owns the
messages, the idempotence and the reporting; an executor only runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from gpufleet.protocol.jobs import JobStart, Outcome, Stream

OnOutput = Callable[[Stream, str], None]  # called on the event loop, with text decoded as UTF-8 (errors replaced)
OnStarted = Callable[[], None]  # called once the processes run


@dataclass(frozen=True)
class RankResult:
    outcome: Outcome  # completed (exit 0), failed (exit != 0), cancelled, timeout, error (could not start)
    exit_code: int | None = None
    message: str = ""


class JobExecutor(Protocol):
    async def run(
        self, launch: JobStart, on_started: OnStarted, on_output: OnOutput, cancel: asyncio.Event
    ) -> RankResult:
        """Run one rank until it ends, `launch.time_limit_s` passes (outcome timeout) or `cancel` is set
        (outcome cancelled); in both of the latter the whole process tree is gone before this returns.
        Raises nothing: a rank that cannot start returns outcome "error" with the reason."""
        ...
