"""The leader's asset pass: re-evaluate findings whenever advisories or any node's software changed,
and alert on problems that newly reach a node at critical severity.

Every `cve_evaluate_interval_s` the leader reads what the evaluation depends on (a cheap query); when
it changed since the last pass, it re-evaluates (assets.evaluate) on a thread of its own. A problem
(CVE) that opens or reopens at critical severity on any node fires `CriticalVulnerability`, one alert
per problem naming its nodes, not one per node: a glibc CVE across a thousand nodes is one page, not
a thousand. The alert resolves once no active (open) critical finding of that problem is left.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.assets.evaluate import Evaluation, Evaluator
from gpufleet.assets.models import FindingRecord
from gpufleet.core.clock import Clock
from gpufleet.core.db import transaction
from gpufleet.core.hostlist import collect
from gpufleet.core.loops import run_periodic
from gpufleet.inventory.models import Node
from gpufleet.monitoring import alerts
from gpufleet.monitoring.models import Alert

log = logging.getLogger(__name__)
RULE = "CriticalVulnerability"
FLEET = "fleet"  # the alert's node: a problem spans nodes


@dataclass
class AssetLoops:
    sessions: sessionmaker[Session]
    clock: Clock
    is_leader: Callable[[], bool]
    on_alerts: Callable[[list[Alert]], None] = lambda _alerts: None
    interval_s: float = 10.0
    evaluator: Evaluator = field(default_factory=Evaluator)
    _state: Any = None
    last: Evaluation | None = None

    def evaluate_once(self, force: bool = False) -> Evaluation | None:
        """Re-evaluate if anything changed (or `force`); None when there was nothing to do."""
        if not self.is_leader():
            return None
        with transaction(self.sessions, readonly=True) as session:
            state = self.evaluator.state(session)
        if state == self._state and not force:
            return None
        fired: list[Alert] = []
        with transaction(self.sessions) as session:
            result = self.evaluator.evaluate(session, self.clock)
            fired = self._alerts(session, result)
        self._state, self.last = state, result
        if result.changed:
            log.info(
                "findings re-evaluated in %.2f s: %d opened, %d reopened, %d updated, %d fixed (%d nodes, %d sets)",
                result.seconds,
                result.opened,
                result.reopened,
                result.updated,
                result.fixed,
                result.nodes,
                result.sets,
            )
        if fired:
            self.on_alerts(fired)
        return result

    def _alerts(self, session: Session, result: Evaluation) -> list[Alert]:
        fired = []
        for problem in result.critical:
            rows = session.execute(
                select(Node.name)
                .join(FindingRecord, FindingRecord.node_id == Node.id)
                .where(FindingRecord.problem == problem, FindingRecord.status == "open")
            ).scalars()
            names = sorted(set(rows))
            summary = (
                f"{problem} (critical) affects {len(names)} node{'s' if len(names) != 1 else ''}: {collect(names)}"
            )
            alert = alerts.fire(session, self.clock, RULE, None, FLEET, summary, severity="critical", entity=problem)
            if alert is not None:
                fired.append(alert)
        firing = session.scalars(select(Alert).where(Alert.rule == RULE, Alert.status == "firing")).all()
        for alert in firing:
            still = session.scalar(
                select(FindingRecord.id)
                .where(
                    FindingRecord.problem == alert.labels.get("entity"),
                    FindingRecord.status == "open",
                    FindingRecord.severity == "critical",
                )
                .limit(1)
            )
            if still is None:
                fired.append(alerts.end(self.clock, alert))
        return fired

    async def run(self, stop: asyncio.Event) -> None:
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="assets")

        async def step() -> None:
            await asyncio.get_running_loop().run_in_executor(executor, self.evaluate_once)

        try:
            await run_periodic("asset-evaluation", self.interval_s, step, stop)
        finally:
            executor.shutdown(wait=False)
