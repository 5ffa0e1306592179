"""Turn what the tracker holds into verdicts, store the ones that changed, and act on them.

One evaluation pass takes the nodes with news and runs the checks on each, in memory. Only a node
whose verdict changed, or that must be drained or resumed, costs a database write:

- a `failed` node that is not drained is drained with a reason starting `gpufleet:`;
- a node gpufleet drained is resumed once it has passed `resume_after_rounds` consecutive samples;
- a node a person drained is never resumed here.

What the pass needs to know of each node (expected GPUs, category, its own settings, GPU models,
stored verdict, drain) is read in one query and kept for `FACTS_TTL_S`, so a manual drain or a new
category is seen within that. What a node must have comes from its `expected_gpus` and `gpu_model`
settings (inventory.categories: defaults < category < node), read with the health policies; without
an `expected_gpus` setting, the most GPUs the node ever reported.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpufleet.core.clock import Clock, to_datetime
from gpufleet.core.errors import GpufleetError
from gpufleet.inventory import categories
from gpufleet.inventory.categories import Resolved
from gpufleet.inventory.models import Gpu, Node
from gpufleet.jobs.ports import OWN_DRAIN_PREFIX, WorkloadManager
from gpufleet.monitoring.anomalies import AnomalyWatch
from gpufleet.monitoring.checks import HealthPolicy, NodeSnapshot, Verdict, evaluate
from gpufleet.monitoring.models import AlertRule, HealthPolicyRow
from gpufleet.monitoring.storage import StorageWatch
from gpufleet.monitoring.thresholds import BUILTIN_RULES, ThresholdRule, ThresholdState, Transition
from gpufleet.monitoring.tracker import HealthTracker

log = logging.getLogger(__name__)

GPUFLEET_ACTOR = "gpufleet"
FACTS_TTL_S = 5.0  # also how soon a changed health policy or alert rule is in force
DEFAULT_CATEGORY = "default"  # the policy row that applies to nodes whose category has none


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
class NodeFacts:
    name: str
    category: str | None
    expected_gpus: int
    health: str
    reasons: tuple[str, ...]
    drain_reason: str | None
    drained: bool
    read_at: float
    settings: dict[str, Any] = field(default_factory=dict)  # the node's own setting values (inventory.categories)
    gpu_models: tuple[str, ...] = ()  # as inventoried

    @classmethod
    def of(cls, node: Any, now: float, gpu_models: tuple[str, ...] = ()) -> NodeFacts:
        """From a Node, or a row of its columns (same attribute names)."""
        return cls(
            node.name,
            node.category,
            node.expected_gpus,
            node.health,
            tuple(node.health_reasons or ()),
            node.drain_reason,
            node.drained_at is not None,
            now,
            dict(node.settings or {}),
            gpu_models,
        )


@dataclass
class _Decision:
    node_id: int
    verdict: Verdict
    drain: str | None
    resume: bool


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
    facts: dict[int, NodeFacts] = field(default_factory=dict)
    rules: list[ThresholdRule] = field(default_factory=lambda: list(BUILTIN_RULES))
    thresholds: ThresholdState = field(default_factory=ThresholdState)
    anomalies: AnomalyWatch = field(default_factory=AnomalyWatch)  # each GPU series against its own baseline
    storage: StorageWatch = field(default_factory=StorageWatch)  # shared mounts: hung, full, slow (per node)
    config_read_at: float | None = None
    category_settings: dict[str, dict[str, Any]] = field(default_factory=dict)  # by category, as stored

    def policy_for(self, category: str | None) -> HealthPolicy:
        return self.policies.get(category or "", self.policies.get(DEFAULT_CATEGORY, self.default_policy))

    def expected(self, facts: NodeFacts) -> dict[str, Resolved]:
        """What the node must have: its `expected_gpus` and `gpu_model` settings (defaults < category <
        node); without an `expected_gpus` setting, the most GPUs it ever reported."""
        resolved = categories.resolve_values(self.category_settings.get(facts.category or ""), facts.settings)
        if resolved["expected_gpus"].value is None:
            resolved["expected_gpus"] = Resolved(facts.expected_gpus, "default")
        return resolved

    def config_stale(self, now: float) -> bool:
        return self.config_read_at is None or now - self.config_read_at > FACTS_TTL_S

    def refresh_config(self, session: Session, now: float) -> list[Transition]:
        """Read the health policies and alert rules. Returns resolutions for alerts of removed rules."""
        self.policies = {
            row.category: HealthPolicy.model_validate(row.policy) for row in session.scalars(select(HealthPolicyRow))
        }
        self.category_settings = categories.category_settings(session)
        custom = [
            ThresholdRule(r.name, r.metric, r.entity_kind, r.op, r.threshold, r.for_s, r.severity)
            for r in session.scalars(select(AlertRule).order_by(AlertRule.name))
        ]
        rules = list(BUILTIN_RULES) + custom
        gone = {r.name for r in self.rules} - {r.name for r in rules}
        resolutions = []
        for old in (r for r in self.rules if r.name in gone):
            for node_id, entity in self.thresholds.forget_rule(old.name):
                resolutions.append(Transition(old, node_id, entity, False))
        self.rules = rules
        self.config_read_at = now
        return resolutions

    def stale_facts(self, node_ids: set[int], now: float) -> list[int]:
        return [i for i in node_ids if i not in self.facts or now - self.facts[i].read_at > FACTS_TTL_S]

    def refresh_facts(self, session: Session, stale: list[int], now: float) -> None:
        """Read what the checks need of these nodes (see `stale_facts`)."""
        columns = (
            Node.id,
            Node.name,
            Node.category,
            Node.expected_gpus,
            Node.health,
            Node.health_reasons,
            Node.drain_reason,
            Node.drained_at,
            Node.settings,
        )
        models: dict[int, list[str]] = {}
        for node_id, model in session.execute(
            select(Gpu.node_id, Gpu.model).where(Gpu.node_id.in_(stale)).order_by(Gpu.node_id, Gpu.index)
        ):
            models.setdefault(node_id, []).append(model)
        found = set()
        for row in session.execute(select(*columns).where(Node.id.in_(stale))):
            found.add(row.id)
            self.facts[row.id] = NodeFacts.of(row, now, tuple(models.get(row.id, ())))
        for gone in set(stale) - found:  # removed meanwhile
            self.facts.pop(gone, None)
            self.tracker.forget(gone)
            self.anomalies.forget(gone)
            self.storage.forget(gone)

    def decide(self, node_ids: set[int], now: float) -> tuple[list[_Decision], list[Transition]]:
        """In memory: the nodes whose stored verdict or drain must change, and the threshold alerts
        to fire or resolve."""
        decisions = []
        transitions: list[Transition] = []
        for node_id in node_ids:
            facts = self.facts.get(node_id)
            view = self.tracker.view(node_id)
            if facts is None or view is None:
                continue
            if view.new_samples:
                fresh = list(zip(view.times[: view.new_samples], view.samples[: view.new_samples], strict=True))
                transitions += self.thresholds.observe(node_id, fresh[::-1], self.rules)
                transitions += self.anomalies.observe(node_id, fresh[::-1])
                transitions += self.storage.observe(node_id, fresh[::-1], self.tracker.mounts(node_id))
            expected = self.expected(facts)
            snapshot = NodeSnapshot(
                expected_gpus=expected["expected_gpus"].value,
                gpu_model=expected["gpu_model"].value,
                gpu_models=facts.gpu_models,
                samples=view.samples,
                events=view.events,
                metrics_age_s=None if view.last_sample_at is None else now - view.last_sample_at,
                metrics_interval_s=self.metrics_interval_s,
                checks=view.checks,
            )
            verdict = evaluate(snapshot, self.policy_for(facts.category))
            rounds = self.rounds.get(node_id, 0) + view.new_samples if verdict.state == "healthy" else 0
            self.rounds[node_id] = rounds
            drain = None
            if verdict.state == "failed" and not facts.drained:
                drain = f"{OWN_DRAIN_PREFIX} {verdict.reasons[0]}"[:512]
            resume = (
                verdict.state == "healthy"
                and facts.drain_reason is not None
                and facts.drain_reason.startswith(OWN_DRAIN_PREFIX)
                and rounds >= self.resume_after_rounds
            )
            if drain or resume or (verdict.state, verdict.reasons) != (facts.health, facts.reasons):
                decisions.append(_Decision(node_id, verdict, drain, resume))
        return decisions, transitions

    def apply(self, session: Session, clock: Clock, decisions: list[_Decision]) -> list[HealthChange]:
        """Store the decisions (re-checked against the rows, which a person may have just changed)."""
        now = clock.now()
        changes = []
        nodes = {n.id: n for n in session.scalars(select(Node).where(Node.id.in_([d.node_id for d in decisions])))}
        for decision in decisions:
            node = nodes.get(decision.node_id)
            if node is None:
                continue
            verdict = decision.verdict
            before = node.health
            if before != verdict.state:
                node.health_since = to_datetime(now)
            node.health = verdict.state
            node.health_reasons = list(verdict.reasons)
            drained = None
            resumed = False
            # One node's workload manager error (Slurm away, Slurm refusing) must not undo the pass for
            # the others: its verdict is stored, its drain retried on the next pass that judges it.
            try:
                if decision.drain and node.drained_at is None:
                    self.workload.drain(session, node, decision.drain, GPUFLEET_ACTOR)
                    drained = decision.drain if node.drain_reason == decision.drain else None
                # A node held by a workflow (burn-in, maintenance) is resumed only by that workflow.
                if decision.resume and node.hold is None and (node.drain_reason or "").startswith(OWN_DRAIN_PREFIX):
                    self.workload.resume(session, node, GPUFLEET_ACTOR)
                    resumed = True
            except GpufleetError as exc:
                log.warning("%s: %s: %s", node.name, "drain" if decision.drain else "resume", exc)
            old = self.facts.get(node.id)
            self.facts[node.id] = NodeFacts.of(node, now, old.gpu_models if old is not None else ())
            changes.append(HealthChange(node.id, node.name, before, verdict.state, verdict.reasons, drained, resumed))
        return changes
