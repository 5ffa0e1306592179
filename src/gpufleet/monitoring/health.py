"""Turn what the tracker holds into verdicts, store the ones that changed, and act on them.

One evaluation pass takes the nodes with news, runs the checks on each, and in one transaction
writes the verdicts that changed and drains or resumes nodes:

- a `failed` node that is not drained is drained with a reason starting `gpufleet:`;
- a node gpufleet drained is resumed once it has passed `resume_after_rounds` consecutive samples;
- a node a person drained is never resumed here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpufleet.core.clock import Clock, to_datetime
from gpufleet.inventory.models import Node
from gpufleet.jobs.ports import OWN_DRAIN_PREFIX, WorkloadManager
from gpufleet.monitoring.checks import HealthPolicy, NodeSnapshot, Verdict, evaluate
from gpufleet.monitoring.tracker import HealthTracker

GPUFLEET_ACTOR = "gpufleet"


@dataclass(frozen=True)
class HealthChange:
    node_id: int
    node: str
    before: str
    after: str
    reasons: tuple[str, ...]
    drained: str | None = None  # the drain reason when this pass drained the node
    resumed: bool = False


@dataclass
class HealthJudge:
    """Evaluates the nodes of one replica. `rounds` (consecutive healthy samples) lives in memory:
    counting it in the database would be a write per node per sample."""

    tracker: HealthTracker
    workload: WorkloadManager
    default_policy: HealthPolicy = field(default_factory=HealthPolicy)
    policies: dict[str, HealthPolicy] = field(default_factory=dict)  # by node category
    metrics_interval_s: float = 5.0
    resume_after_rounds: int = 3
    rounds: dict[int, int] = field(default_factory=dict)

    def policy_for(self, category: str | None) -> HealthPolicy:
        return self.policies.get(category or "", self.default_policy)

    def judge(self, node: Node, now: float) -> tuple[Verdict, int] | None:
        """The node's verdict and how many new samples it covers; None if this replica has no data."""
        view = self.tracker.view(node.id)
        if view is None:
            return None
        snapshot = NodeSnapshot(
            expected_gpus=node.expected_gpus,
            samples=view.samples,
            events=view.events,
            metrics_age_s=None if view.last_sample_at is None else now - view.last_sample_at,
            metrics_interval_s=self.metrics_interval_s,
        )
        return evaluate(snapshot, self.policy_for(node.category)), view.new_samples

    def run_pass(self, session: Session, clock: Clock, node_ids: set[int]) -> list[HealthChange]:
        """Evaluate `node_ids`; store changed verdicts and drain or resume. Never commits."""
        if not node_ids:
            return []
        now = clock.now()
        changes = []
        for node in session.scalars(select(Node).where(Node.id.in_(node_ids))):
            judged = self.judge(node, now)
            if judged is None:
                continue
            verdict, new_samples = judged
            rounds = self.rounds.get(node.id, 0) + new_samples if verdict.state == "healthy" else 0
            self.rounds[node.id] = rounds
            change = self._apply(session, node, verdict, rounds, now)
            if change is not None:
                changes.append(change)
        return changes

    def _apply(self, session: Session, node: Node, verdict: Verdict, rounds: int, now: float) -> HealthChange | None:
        before = node.health
        changed = before != verdict.state or tuple(node.health_reasons or ()) != verdict.reasons
        if changed:
            if before != verdict.state:
                node.health_since = to_datetime(now)
            node.health = verdict.state
            node.health_reasons = list(verdict.reasons)
        drained = None
        resumed = False
        if verdict.state == "failed" and node.drained_at is None:
            drained = f"{OWN_DRAIN_PREFIX} {verdict.reasons[0]}"[:512]
            self.workload.drain(session, node, drained, GPUFLEET_ACTOR)
        elif (
            verdict.state == "healthy"
            and node.drain_reason is not None
            and node.drain_reason.startswith(OWN_DRAIN_PREFIX)
            and rounds >= self.resume_after_rounds
        ):
            self.workload.resume(session, node, GPUFLEET_ACTOR)
            resumed = True
        if not (changed or drained or resumed):
            return None
        return HealthChange(node.id, node.name, before, verdict.state, verdict.reasons, drained, resumed)
