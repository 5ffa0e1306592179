"""The leader's maintenance pass: every `maintenance_interval_s`, move each campaign on (lifecycle.campaign_pass).

Only the leader runs it, inside its lease (like the scheduler: a stalled old leader must not drain or act
on nodes beside a new one). Each campaign is its own transaction, so one that cannot go on (Slurm away)
never holds up the others; the tasks a pass records are started on this head's task runner once that
transaction has committed, and a task that cannot start is failed (the campaign fails its node).
A campaign is nothing but rows, so a new leader carries on where the last one stopped.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from sqlalchemy.orm import Session, sessionmaker

from gpufleet.core.clock import Clock
from gpufleet.core.config import Settings
from gpufleet.core.db import transaction
from gpufleet.core.errors import Unavailable
from gpufleet.core.loops import run_periodic
from gpufleet.jobs.ports import WorkloadManager
from gpufleet.lifecycle import campaign_pass
from gpufleet.lifecycle.campaign_actions import ActionEnv, Launch
from gpufleet.power.service import Connect
from gpufleet.provisioning.runner import ProcessRunner, Runner
from gpufleet.tasks import service as tasks
from gpufleet.tasks.runner import TaskRunner

log = logging.getLogger(__name__)


@dataclass
class CampaignLoops:
    settings: Settings
    sessions: sessionmaker[Session]
    clock: Clock
    workload: WorkloadManager
    tasks: TaskRunner
    is_leader: Callable[[], bool]
    image_runner: Runner | None = None  # None: the real programs (tests give their own)
    power_connect: Connect | None = None  # None: the real Redfish and IPMI clients

    def env(self) -> ActionEnv:
        return ActionEnv(
            sessions=self.sessions,
            clock=self.clock,
            settings=self.settings,
            workload=self.workload,
            image_runner=self.image_runner or ProcessRunner(),
            power_connect=self.power_connect,
        )

    def advance_once(self) -> int:
        """One pass over every campaign with work left; returns how many tasks it started."""
        if not self.is_leader():
            return 0
        with transaction(self.sessions, readonly=True) as session:
            ids = campaign_pass.to_advance(session)
        env = self.env()
        started = 0
        for campaign_id in ids:
            try:
                with transaction(self.sessions) as session:
                    launches = campaign_pass.advance(session, env, campaign_id, self.tasks.running())
            except Unavailable as exc:
                log.warning("maintenance campaign %s waits: %s", campaign_id, exc)
                continue
            except Exception:
                log.exception("maintenance campaign %s: pass failed; the next one tries again", campaign_id)
                continue
            started += sum(self._start(launch) for launch in launches)
        return started

    def _start(self, launch: Launch) -> bool:
        try:
            self.tasks.start(launch.task_id, launch.work, launch.params)
        except Exception as exc:  # no thread to be had: the task fails, and with it the node's action
            log.exception("maintenance: task %s could not start", launch.task_id)
            with transaction(self.sessions) as session:
                tasks.finish(session, self.clock, launch.task_id, error=f"could not start: {exc}"[:1024], summary=None)
            return False
        return True

    async def run(self, stop: asyncio.Event) -> None:
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="maintenance")

        async def step() -> None:
            await asyncio.get_running_loop().run_in_executor(executor, self.advance_once)

        try:
            await run_periodic("maintenance", self.settings.maintenance_interval_s, step, stop)
        finally:
            executor.shutdown(wait=False)
