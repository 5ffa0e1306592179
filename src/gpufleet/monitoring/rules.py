"""Alert rules and health policies as admins change them. Takes a session; never commits."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpufleet.core.clock import Clock, to_datetime
from gpufleet.core.errors import Conflict, InvalidInput, NotFound
from gpufleet.monitoring.alerts import RULE_NAME, RULES, SEVERITIES
from gpufleet.monitoring.checks import HealthPolicy
from gpufleet.monitoring.models import AlertRule, HealthPolicyRow
from gpufleet.monitoring.thresholds import BUILTIN_RULES, ENTITY_KINDS, OPS, ThresholdRule
from gpufleet.protocol.metrics import DISK_METRICS, GPU_METRICS, HOST_METRICS, IB_METRICS, NIC_METRICS

DEFAULT_POLICY = "default"  # the policy of every node whose category has none (health.DEFAULT_CATEGORY)

METRICS_BY_KIND = {"host": HOST_METRICS, "gpu": GPU_METRICS, "disk": DISK_METRICS, "nic": NIC_METRICS, "ib": IB_METRICS}


def list_rules(session: Session) -> list[tuple[ThresholdRule, str | None]]:
    """Built-in rules first, then the admins' (with who made each)."""
    custom: list[tuple[ThresholdRule, str | None]] = [
        (ThresholdRule(r.name, r.metric, r.entity_kind, r.op, r.threshold, r.for_s, r.severity), r.created_by)
        for r in session.scalars(select(AlertRule).order_by(AlertRule.name))
    ]
    builtin: list[tuple[ThresholdRule, str | None]] = [(r, None) for r in BUILTIN_RULES]
    return builtin + custom


def add_rule(session: Session, clock: Clock, rule: ThresholdRule, actor: str) -> AlertRule:
    """Raises InvalidInput for a bad name, kind, operator, severity or a metric that kind never
    reports (a typo would otherwise never fire); Conflict for a name in use."""
    if not RULE_NAME.match(rule.name):
        raise InvalidInput("a rule name is a letter, then letters, digits and '_' (at most 64)")
    if rule.entity_kind not in ENTITY_KINDS:
        raise InvalidInput(f"entity kind must be one of {', '.join(ENTITY_KINDS)}")
    if rule.metric not in METRICS_BY_KIND[rule.entity_kind]:
        known = ", ".join(sorted(METRICS_BY_KIND[rule.entity_kind]))
        raise InvalidInput(f"{rule.entity_kind} entities have no metric {rule.metric!r}; they have: {known}")
    if rule.op not in OPS:
        raise InvalidInput(f"operator must be one of {' '.join(OPS)}")
    if rule.severity not in SEVERITIES:
        raise InvalidInput(f"severity must be one of {', '.join(SEVERITIES)}")
    if rule.name in RULES or any(b.name == rule.name for b in BUILTIN_RULES):
        raise Conflict(f"{rule.name} is a built-in rule")
    if session.scalar(select(AlertRule.id).where(AlertRule.name == rule.name)) is not None:
        raise Conflict(f"rule already exists: {rule.name}")
    row = AlertRule(
        name=rule.name,
        metric=rule.metric,
        entity_kind=rule.entity_kind,
        op=rule.op,
        threshold=rule.threshold,
        for_s=rule.for_s,
        severity=rule.severity,
        created_by=actor,
        created_at=to_datetime(clock.now()),
    )
    session.add(row)
    session.flush()
    return row


def remove_rule(session: Session, name: str) -> None:
    """Raises Conflict for a built-in rule (silence it instead) and NotFound for an unknown one."""
    if name in RULES or any(b.name == name for b in BUILTIN_RULES):
        raise Conflict(f"{name} is built in and cannot be removed; silence it with `gpufleet alert silence`")
    row = session.scalar(select(AlertRule).where(AlertRule.name == name))
    if row is None:
        raise NotFound(f"no such rule: {name}")
    session.delete(row)


def list_policies(session: Session) -> list[HealthPolicyRow]:
    return list(session.scalars(select(HealthPolicyRow).order_by(HealthPolicyRow.category)))


def set_policy(session: Session, clock: Clock, category: str, policy: HealthPolicy, actor: str) -> HealthPolicyRow:
    """The policy for a node category (`default`: every node whose category has none). `disabled`
    names built-in checks (see `CHECKS`) or node-side ones (any name: the head cannot know the
    nodes' check files), so it is not checked against a list."""
    row = session.get(HealthPolicyRow, category)
    data: dict[str, Any] = policy.model_dump()
    now = to_datetime(clock.now())
    if row is None:
        row = HealthPolicyRow(category=category, policy=data, updated_by=actor, updated_at=now)
        session.add(row)
    else:
        row.policy, row.updated_by, row.updated_at = data, actor, now
    session.flush()
    return row


def policy_in_force(session: Session, category: str | None) -> tuple[HealthPolicy, str]:
    """The health policy a node of `category` is judged by, and its origin as node settings name it:
    "category" (the category's own policy) or "default" (the `default` policy, or the built-in one),
    the same choice as `HealthJudge.policy_for`."""
    row = session.get(HealthPolicyRow, category) if category else None
    if row is not None and category != DEFAULT_POLICY:
        return HealthPolicy.model_validate(row.policy), "category"
    fallback = session.get(HealthPolicyRow, DEFAULT_POLICY)
    return (HealthPolicy.model_validate(fallback.policy) if fallback else HealthPolicy()), "default"


def remove_policy(session: Session, category: str) -> None:
    row = session.get(HealthPolicyRow, category)
    if row is None:
        raise NotFound(f"no health policy for category {category}")
    session.delete(row)
