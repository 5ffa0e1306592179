"""The leader's burn-in pass: every second, move each queued or running burn-in on (lifecycle.burnin).

A pass starts the step jobs that are due, judges those that ended and ends runs. Only the leader runs
it, inside its lease (like the scheduler: a stalled old leader must not place step jobs beside a new
one). Each run that ends is in the audit log (actor gpufleet:burn-in, action burnin.passed or
burnin.failed) and a failed one fires a BurnInFailed alert for its node, resolved when the node passes a
later run.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.auth import audit
from gpufleet.core.clock import Clock
from gpufleet.core.db import transaction
from gpufleet.core.loops import run_periodic
from gpufleet.jobs.ports import WorkloadManager
from gpufleet.lifecycle import burnin, placement
from gpufleet.monitoring import alerts
from gpufleet.monitoring.models import Alert

log = logging.getLogger(__name__)
PASS_S = 1.0
RULE = "BurnInFailed"


@dataclass
class BurnInLoops:
    sessions: sessionmaker[Session]
    clock: Clock
    workload: WorkloadManager
    is_leader: Callable[[], bool]
    user: str = "root"
    on_alerts: Callable[[list[Alert]], None] = lambda _alerts: None
    interval_s: float = PASS_S

    def advance_once(self) -> list[burnin.Ended]:
        if not self.is_leader():
            return []
        fired: list[Alert] = []
        with transaction(self.sessions) as session:
            ended = burnin.advance(session, self.clock, self.workload, self.user)
            for run in ended:
                audit.record(
                    session,
                    self.clock,
                    actor=placement.ACTOR,
                    action=f"burnin.{run.state}",
                    target=f"{run.node}: burn-in {run.run_id}" + (f": {run.reason}" if run.reason else ""),
                    source="head",
                    result=200 if run.state == "passed" else 409,
                )
                fired += self._alert(session, run)
        for run in ended:
            log.info("burn-in %d of %s %s%s", run.run_id, run.node, run.state, f": {run.reason}" if run.reason else "")
        if fired:
            self.on_alerts(fired)
        return ended

    def _alert(self, session: Session, run: burnin.Ended) -> list[Alert]:
        if run.state == "failed":
            summary = f"{run.node} failed burn-in: {run.reason}"
            alert = alerts.fire(session, self.clock, RULE, None, run.node, summary, severity="warning")
            return [alert] if alert is not None else []
        if run.state == "passed":
            firing = session.scalars(
                select(Alert).where(Alert.rule == RULE, Alert.node_name == run.node, Alert.status == "firing")
            )
            return [alerts.end(self.clock, a) for a in firing]
        return []

    async def run(self, stop: asyncio.Event) -> None:
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="burn-in")

        async def step() -> None:
            await asyncio.get_running_loop().run_in_executor(executor, self.advance_once)

        try:
            await run_periodic("burn-in", self.interval_s, step, stop)
        finally:
            executor.shutdown(wait=False)
