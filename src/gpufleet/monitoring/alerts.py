"""Alerts: fire, resolve, acknowledge, silence. Takes a session and a clock; never commits.

An alert is identified by its fingerprint (rule, node, GPU): while one is firing, firing it again
only updates its summary (deduplication), so a flapping check does not page twice. Resolving ends
it. Each new firing or resolution becomes a notice for the receivers unless a silence matches.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from gpufleet.core.clock import Clock, to_datetime
from gpufleet.core.errors import Conflict, InvalidInput, NotFound
from gpufleet.monitoring.health import HealthChange
from gpufleet.monitoring.models import Alert, Silence

SEVERITIES = ("critical", "warning", "info")
RULE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")


@dataclass(frozen=True)
class Rule:
    name: str
    severity: str
    description: str


RULES: dict[str, Rule] = {
    r.name: r
    for r in (
        Rule("NodeFailed", "critical", "a node's health verdict is failed: it has been drained"),
        Rule("NodeDegraded", "warning", "a node's health verdict is degraded"),
        Rule("NodeDown", "critical", "a node stopped sending heartbeats"),
        Rule("GpuStraggler", "warning", "a GPU of a running multi-GPU job works well below its peers in the job"),
        Rule("LogTemplateBurst", "warning", "a log template is written far more often than it usually is"),
        Rule("CriticalVulnerability", "critical", "a critical advisory newly affects installed software"),
        Rule("StorageMountHung", "critical", "a shared file system is hung, stale or gone on a node"),
        Rule("StorageAlmostFull", "warning", "a shared file system's space or inodes are nearly used up"),
        Rule("StorageSlow", "warning", "a shared mount's time per operation is well above its own baseline"),
        Rule("SwitchUnreachable", "warning", "a switch does not answer SNMP"),
        Rule("SwitchPortDown", "critical", "a switch port that was up went down (not shut by an admin)"),
        Rule("SwitchPortErrors", "warning", "a switch port's error counters are rising"),
        Rule("SwitchPortSlow", "warning", "a switch port with a node behind it runs below its expected speed"),
        Rule("SwitchSensor", "warning", "a switch's temperature, fan or power supply sensor is not ok"),
    )
}


def fingerprint(rule: str, node: str, gpu: int | None = None, entity: str | None = None) -> str:
    return hashlib.sha256(f"{rule}\0{node}\0{entity if entity is not None else gpu}".encode()).hexdigest()[:16]


def _firing(session: Session, fp: str) -> Alert | None:
    return session.scalar(select(Alert).where(Alert.fingerprint == fp, Alert.status == "firing"))


def silenced(session: Session, now: datetime, rule: str, node: str) -> bool:
    return (
        session.scalar(
            select(Silence.id)
            .where(
                Silence.expires_at > now,
                or_(Silence.rule.is_(None), Silence.rule == rule),
                or_(Silence.node_name.is_(None), Silence.node_name == node),
            )
            .limit(1)
        )
        is not None
    )


def fire(
    session: Session,
    clock: Clock,
    rule: str,
    node_id: int | None,
    node: str,
    summary: str,
    gpu: int | None = None,
    *,
    severity: str | None = None,
    entity: str | None = None,
    labels: Mapping[str, str] | None = None,
) -> Alert | None:
    """Fire `rule` for a node (and a GPU or other entity). Returns the new alert, or None when it was
    already firing (its summary is brought up to date). Built-in rules know their severity. `labels` are
    added to the alert's own (a switch's alert names the switch, the port and the node behind it)."""
    severity = severity or RULES[rule].severity
    fp = fingerprint(rule, node, gpu, entity)
    current = _firing(session, fp)
    if current is not None:
        current.summary = summary[:512]
        return None
    now = to_datetime(clock.now())
    own = {**(labels or {}), "alertname": rule, "severity": severity, "node": node}
    if gpu is not None:
        own["gpu"] = str(gpu)
    if entity is not None:
        own["entity"] = entity
    alert = Alert(
        fingerprint=fp,
        rule=rule,
        severity=severity,
        status="firing",
        node_id=node_id,
        node_name=node,
        gpu=gpu,
        summary=summary[:512],
        labels=own,
        starts_at=now,
        silenced=silenced(session, now, rule, node),
    )
    session.add(alert)
    session.flush()
    return alert


def resolve(
    session: Session, clock: Clock, rule: str, node: str, gpu: int | None = None, entity: str | None = None
) -> Alert | None:
    """Resolve the firing alert of `rule` for a node; None if none was firing."""
    alert = _firing(session, fingerprint(rule, node, gpu, entity))
    return end(clock, alert) if alert is not None else None


def end(clock: Clock, alert: Alert) -> Alert:
    """Resolve a firing alert in hand."""
    alert.status = "resolved"
    alert.ends_at = to_datetime(clock.now())
    return alert


def on_health_change(session: Session, clock: Clock, change: HealthChange) -> list[Alert]:
    """The alerts a changed verdict fires and resolves, in that order."""
    out: list[Alert | None] = []
    summary = "; ".join(change.reasons) or change.after
    if change.after == "failed":
        out += [fire(session, clock, "NodeFailed", change.node_id, change.node, summary)]
        out += [resolve(session, clock, "NodeDegraded", change.node)]
    elif change.after == "degraded":
        out += [fire(session, clock, "NodeDegraded", change.node_id, change.node, summary)]
        out += [resolve(session, clock, "NodeFailed", change.node)]
    else:
        out += [
            resolve(session, clock, "NodeFailed", change.node),
            resolve(session, clock, "NodeDegraded", change.node),
        ]
    return [a for a in out if a is not None]


def on_liveness_change(
    session: Session, clock: Clock, node_id: int, node: str, to_state: str, reason: str
) -> list[Alert]:
    if to_state == "down":
        alert = fire(session, clock, "NodeDown", node_id, node, reason)
    else:
        alert = resolve(session, clock, "NodeDown", node)
    return [alert] if alert is not None else []


def list_alerts(session: Session, status: str | None = None, node: str | None = None, limit: int = 500) -> list[Alert]:
    query = select(Alert).order_by(Alert.id.desc()).limit(limit)
    if status is not None:
        query = query.where(Alert.status == status)
    if node is not None:
        query = query.where(Alert.node_name == node)
    return list(session.scalars(query))


def acknowledge(session: Session, clock: Clock, alert_id: int, actor: str) -> Alert:
    """Mark an alert as being handled. Raises NotFound, or Conflict for one already resolved."""
    alert = session.get(Alert, alert_id)
    if alert is None:
        raise NotFound(f"no such alert: {alert_id}")
    if alert.status != "firing":
        raise Conflict(f"alert {alert_id} is already resolved")
    alert.acked_by = actor
    alert.acked_at = to_datetime(clock.now())
    return alert


def add_silence(
    session: Session, clock: Clock, rule: str | None, node: str | None, duration_s: int, author: str, comment: str
) -> Silence:
    """Silence notifications of matching alerts for `duration_s`. Raises InvalidInput for a silence
    that matches nothing in particular or an unknown rule."""
    if rule is None and node is None:
        raise InvalidInput("a silence needs a rule or a node (or both)")
    if rule is not None and not RULE_NAME.match(rule):
        raise InvalidInput(f"invalid rule name {rule!r}")
    now = clock.now()
    silence = Silence(
        rule=rule,
        node_name=node,
        author=author,
        comment=comment,
        created_at=to_datetime(now),
        expires_at=to_datetime(now + duration_s),
    )
    session.add(silence)
    session.flush()
    return silence


def list_silences(session: Session, clock: Clock) -> list[Silence]:
    now = to_datetime(clock.now())
    return list(session.scalars(select(Silence).where(Silence.expires_at > now).order_by(Silence.id)))
