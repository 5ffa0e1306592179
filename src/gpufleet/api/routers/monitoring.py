"""Metrics, health, drains, simulator faults, alerts, silences and receivers over HTTP."""

from __future__ import annotations

import asyncio
import itertools
import math
import re
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import Response

from gpufleet.api import conditional
from gpufleet.api.deps import Ctx, RowId, allow, tx
from gpufleet.auth.policy import Permission
from gpufleet.auth.schemas import Principal
from gpufleet.core.durations import parse_duration
from gpufleet.core.errors import InvalidInput, Unavailable
from gpufleet.inventory import service as inventory
from gpufleet.inventory.models import Node
from gpufleet.jobs import service as jobs
from gpufleet.monitoring import alerts, fleet, node_series, receivers, rules, store
from gpufleet.monitoring.checks import HealthPolicy
from gpufleet.monitoring.models import HealthPolicyRow
from gpufleet.monitoring.schemas import (
    AlertOut,
    AlertRuleIn,
    AlertRuleOut,
    Chart,
    ChartSeries,
    DrainRequest,
    FaultOutcome,
    FaultRequest,
    HealthPolicyOut,
    MetricPoint,
    MetricSeries,
    NodeHealth,
    ReceiverOut,
    SilenceCreate,
    SilenceOut,
)
from gpufleet.monitoring.thresholds import ThresholdRule
from gpufleet.protocol.metrics import FaultCommand

router = APIRouter(tags=["monitoring"])
FAULT_ANSWER_TIMEOUT_S = 10.0
_command_ids = itertools.count(1)


def _health(node: Node) -> NodeHealth:
    return NodeHealth(
        node=node.name,
        state=node.state.value,
        health=node.health,
        reasons=list(node.health_reasons or ()),
        since=node.health_since,
        drained=node.drained_at is not None,
        drained_at=node.drained_at,
        drain_reason=node.drain_reason,
        drained_by=node.drained_by,
    )


@router.get("/nodes/{name}/metrics")
def node_metrics(
    name: str,
    _: Annotated[Principal, allow(Permission.NODES_READ)],
    ctx: Ctx,
    metric: Annotated[str, Query(max_length=64, description="e.g. gpu_util")],
    entity: Annotated[str, Query(max_length=256, description="host, gpu:N, disk:/, nic:IF, ib:DEV/PORT")] = "host",
    since: Annotated[str, Query(description="how far back, e.g. 1h")] = "1h",
    step: Annotated[str | None, Query(description="bucket width, e.g. 1m; default: about 120 points")] = None,
) -> MetricSeries:
    now = ctx.clock.now()
    span = parse_duration(since)
    step_s = float(parse_duration(step)) if step else max(span / 120, 1.0)
    with tx(ctx, readonly=True) as db:
        node = inventory.get_node(db, name)
        try:
            points = store.query(db, node.id, entity, metric, now - span, now, step_s, ctx.monitoring.retention, now)
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None
    return MetricSeries(
        node=name,
        entity=entity,
        metric=metric,
        step_s=step_s,
        points=[MetricPoint(ts=t, value=v) for t, v in points],
    )


FLEET_CHARTS = {
    "gpu_util": ("Fleet GPU utilization", "%"),
    "power_w": ("Fleet GPU power", "W"),
    "gpu_temp_c": ("Fleet GPU temperature", "C"),
}


@router.get("/fleet/metrics")
def fleet_metrics(
    _: Annotated[Principal, allow(Permission.NODES_READ)],
    ctx: Ctx,
    metric: Annotated[str, Query(description=", ".join(FLEET_CHARTS))] = "gpu_util",
    since: Annotated[str, Query(description="how far back, e.g. 1h")] = "1h",
    step: Annotated[str | None, Query(description="bucket width; default: about 120 points, 1m at least")] = None,
) -> Chart:
    """The whole fleet over time, from the one-minute fleet roll-ups: mean GPU utilization and
    temperature, total GPU power."""
    if metric not in FLEET_CHARTS:
        raise InvalidInput(f"no fleet series {metric!r}: one of {', '.join(FLEET_CHARTS)}")
    now = ctx.clock.now()
    span = parse_duration(since)
    step_s = float(parse_duration(step)) if step else max(span / 120, store.ROLLUP_BUCKET_S)
    with tx(ctx, readonly=True) as db:
        try:
            points = fleet.fleet_series(db, now - span, now, step_s).get(metric, [])
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None
    title, unit = FLEET_CHARTS[metric]
    return Chart(
        title=title,
        unit=unit,
        t=[t for t, _ in points],
        series=[ChartSeries(label=title, values=[v for _, v in points])],
    )


# The per-GPU charts: metric, title, unit. fb_used_pct is computed (monitoring.node_series.DERIVED).
GPU_CHARTS = {
    "gpu_util": ("GPU utilization", "%"),
    "fb_used_pct": ("GPU memory used", "%"),
    "gpu_temp_c": ("GPU temperature", "C"),
    "power_w": ("GPU power", "W"),
}
CHART_POINTS = 120  # about how many points a chart gets by default
_GPU_ENTITY = re.compile(r"^gpu:(\d+)$")


@router.get("/nodes/{name}/gpu-charts")
def gpu_charts(
    name: str,
    _: Annotated[Principal, allow(Permission.NODES_READ)],
    ctx: Ctx,
    metric: Annotated[str, Query(max_length=64, description=", ".join(GPU_CHARTS))] = "gpu_util",
    since: Annotated[str, Query(max_length=16, description="how far back, e.g. 1h or 1d")] = "1h",
    step: Annotated[
        str | None, Query(max_length=16, description="bucket width, e.g. 1m; default: about 120 points")
    ] = None,
) -> Chart:
    """One series per GPU of the node ("GPU 0", ...): the mean of `metric` in each step. Every step of
    the range has a time, with null where the GPU reported nothing, so a chart shows gaps as gaps."""
    if metric not in GPU_CHARTS:
        raise InvalidInput(f"no GPU chart {metric!r}: one of {', '.join(GPU_CHARTS)}")
    retention = ctx.monitoring.retention
    span = parse_duration(since)
    if span > retention.rollup_s:
        raise InvalidInput(f"metrics are kept {retention.rollup_s / 86_400:g} days: ask for less")
    step_s = float(parse_duration(step)) if step else max(span / CHART_POINTS, ctx.settings.metrics_interval_s)
    now = ctx.clock.now()
    start = math.floor((now - span) / step_s) * step_s  # steps on multiples of step_s: stable across fetches
    with tx(ctx, readonly=True) as db:
        node = inventory.get_node(db, name)
        try:
            found = node_series.gpu_series(db, node.id, metric, start, now, step_s, retention, now)
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None
        indexes = {g.index for g in node.gpus} | set(range(node.expected_gpus))
    by_index: dict[int, dict[float, float]] = {}
    for entity, points in found.items():
        matched = _GPU_ENTITY.match(entity)
        if matched is not None:
            by_index[int(matched.group(1))] = dict(points)
    times = [start + i * step_s for i in range(math.ceil((now - start) / step_s))]
    title, unit = GPU_CHARTS[metric]
    return Chart(
        title=title,
        unit=unit,
        t=times,
        series=[
            ChartSeries(label=f"GPU {i}", values=[by_index.get(i, {}).get(t) for t in times])
            for i in sorted(indexes | set(by_index))
        ],
    )


@router.get("/health")
def fleet_health(
    _: Annotated[Principal, allow(Permission.NODES_READ)],
    ctx: Ctx,
    names: Annotated[str | None, Query(description="hostlist filter")] = None,
) -> list[NodeHealth]:
    with tx(ctx, readonly=True) as db:
        return [_health(n) for n in inventory.list_nodes(db, [names] if names else None)]


@router.get("/nodes/{name}/health")
def node_health(name: str, _: Annotated[Principal, allow(Permission.NODES_READ)], ctx: Ctx) -> NodeHealth:
    """Is this node healthy, and if not, why."""
    with tx(ctx, readonly=True) as db:
        return _health(inventory.get_node(db, name))


@router.post("/nodes/{name}/drain")
def drain_node(
    name: str, body: DrainRequest, caller: Annotated[Principal, allow(Permission.NODES_WRITE)], ctx: Ctx
) -> NodeHealth:
    """Keep new work off a node. A drain made here is never undone automatically."""
    with tx(ctx) as db:
        return _health(jobs.drain(db, ctx.monitoring.judge.workload, name, body.reason, caller.actor))


@router.post("/nodes/{name}/resume")
def resume_node(name: str, caller: Annotated[Principal, allow(Permission.NODES_WRITE)], ctx: Ctx) -> NodeHealth:
    with tx(ctx) as db:
        return _health(jobs.resume(db, ctx.monitoring.judge.workload, name, caller.actor))


@router.post("/nodes/{name}/faults")
async def inject_fault(
    name: str, body: FaultRequest, _: Annotated[Principal, allow(Permission.NODES_WRITE)], ctx: Ctx, request: Request
) -> FaultOutcome:
    """Send a fault (or a heal) to a simulated node through its channel; real agents refuse."""
    if body.action == "inject" and body.kind is None:
        raise InvalidInput("inject needs a fault kind")
    request.state.audit_target = f"{name}: {body.action} {body.kind or ''} {'' if body.gpu is None else body.gpu}"

    def node_id() -> int:
        with tx(ctx, readonly=True) as db:
            return inventory.get_node(db, name).id

    nid = await asyncio.to_thread(node_id)
    command = FaultCommand(id=next(_command_ids), action=body.action, kind=body.kind, gpu=body.gpu)
    answer = ctx.hub.command(nid, command)
    try:
        result = await asyncio.wait_for(answer, FAULT_ANSWER_TIMEOUT_S)
    except TimeoutError:
        raise Unavailable(f"node {name} did not answer within {FAULT_ANSWER_TIMEOUT_S:.0f} s") from None
    if body.action == "heal" and result.ok:
        ctx.monitoring.tracker.clear_events(nid)  # the simulated GPU is whole again: its Xids are history
    return FaultOutcome(node=name, ok=result.ok, message=result.message)


@router.get("/alerts", response_model=list[AlertOut])
def list_alerts(
    _: Annotated[Principal, allow(Permission.ALERTS_READ)],
    ctx: Ctx,
    request: Request,
    status: Annotated[str | None, Query(pattern="^(firing|resolved)$")] = None,
    node: Annotated[str | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=5000)] = 500,
) -> Response:
    """Newest first, with an `ETag`: `If-None-Match` answers 304 while no alert fired, resolved or was
    acknowledged."""
    with tx(ctx, readonly=True) as db:
        found = [AlertOut.model_validate(a) for a in alerts.list_alerts(db, status, node, limit)]
    return conditional.answer(request, found)


@router.post("/alerts/{alert_id}/ack")
def ack_alert(alert_id: RowId, caller: Annotated[Principal, allow(Permission.ALERTS_WRITE)], ctx: Ctx) -> AlertOut:
    with tx(ctx) as db:
        return AlertOut.model_validate(alerts.acknowledge(db, ctx.clock, alert_id, caller.actor))


def _silence_out(s: Any) -> SilenceOut:
    return SilenceOut(
        id=s.id,
        rule=s.rule,
        node=s.node_name,
        author=s.author,
        comment=s.comment,
        created_at=s.created_at,
        expires_at=s.expires_at,
    )


@router.get("/silences")
def list_silences(_: Annotated[Principal, allow(Permission.ALERTS_READ)], ctx: Ctx) -> list[SilenceOut]:
    with tx(ctx, readonly=True) as db:
        return [_silence_out(s) for s in alerts.list_silences(db, ctx.clock)]


@router.post("/silences", status_code=201)
def add_silence(
    body: SilenceCreate, caller: Annotated[Principal, allow(Permission.ALERTS_WRITE)], ctx: Ctx
) -> SilenceOut:
    with tx(ctx) as db:
        silence = alerts.add_silence(db, ctx.clock, body.rule, body.node, body.duration_s, caller.actor, body.comment)
        return _silence_out(silence)


@router.get("/alert-receivers")
def list_receivers(_: Annotated[Principal, allow(Permission.ALERTS_WRITE)], ctx: Ctx) -> list[ReceiverOut]:
    with tx(ctx, readonly=True) as db:
        return [ReceiverOut(**r) for r in receivers.list_receivers(db)]


@router.post("/alert-receivers", status_code=201)
def add_receiver(
    body: dict[str, Any], _: Annotated[Principal, allow(Permission.ALERTS_WRITE)], ctx: Ctx, request: Request
) -> ReceiverOut:
    """A webhook, Slack or email receiver (fields: see docs/notifications.md). Secrets are stored, never shown."""
    request.state.audit_target = f"receiver {body.get('name')}"
    with tx(ctx) as db:
        return ReceiverOut(**receivers.add_receiver(db, ctx.clock, body))


@router.delete("/alert-receivers/{name}", status_code=204)
def remove_receiver(name: str, _: Annotated[Principal, allow(Permission.ALERTS_WRITE)], ctx: Ctx) -> None:
    with tx(ctx) as db:
        receivers.remove_receiver(db, name)


def _rule_out(rule: ThresholdRule, created_by: str | None) -> AlertRuleOut:
    return AlertRuleOut(
        name=rule.name,
        metric=rule.metric,
        entity_kind=rule.entity_kind,
        op=rule.op,
        threshold=rule.threshold,
        for_s=rule.for_s,
        severity=rule.severity,
        builtin=rule.builtin,
        created_by=created_by,
    )


@router.get("/alert-rules")
def list_alert_rules(_: Annotated[Principal, allow(Permission.ALERTS_READ)], ctx: Ctx) -> list[AlertRuleOut]:
    """Threshold rules: the built-in ones and the admins'. Node health and liveness alerts are not listed."""
    with tx(ctx, readonly=True) as db:
        return [_rule_out(rule, by) for rule, by in rules.list_rules(db)]


@router.post("/alert-rules", status_code=201)
def add_alert_rule(
    body: AlertRuleIn, caller: Annotated[Principal, allow(Permission.ALERTS_WRITE)], ctx: Ctx, request: Request
) -> AlertRuleOut:
    request.state.audit_target = f"rule {body.name}"
    rule = ThresholdRule(**body.model_dump())
    with tx(ctx) as db:
        rules.add_rule(db, ctx.clock, rule, caller.actor)
    return _rule_out(rule, caller.actor)


@router.delete("/alert-rules/{name}", status_code=204)
def remove_alert_rule(name: str, _: Annotated[Principal, allow(Permission.ALERTS_WRITE)], ctx: Ctx) -> None:
    with tx(ctx) as db:
        rules.remove_rule(db, name)


def _policy_out(row: HealthPolicyRow) -> HealthPolicyOut:
    return HealthPolicyOut(
        category=row.category, policy=row.policy, updated_by=row.updated_by, updated_at=row.updated_at
    )


@router.get("/health-policies")
def list_health_policies(_: Annotated[Principal, allow(Permission.NODES_READ)], ctx: Ctx) -> list[HealthPolicyOut]:
    """Health thresholds per node category; `default` for the rest. Categories without a row use the defaults."""
    with tx(ctx, readonly=True) as db:
        return [_policy_out(r) for r in rules.list_policies(db)]


@router.put("/health-policies/{category}")
def set_health_policy(
    category: Annotated[str, Path(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")],
    body: HealthPolicy,
    caller: Annotated[Principal, allow(Permission.NODES_WRITE)],
    ctx: Ctx,
) -> HealthPolicyOut:
    with tx(ctx) as db:
        return _policy_out(rules.set_policy(db, ctx.clock, category, body, caller.actor))


@router.delete("/health-policies/{category}", status_code=204)
def remove_health_policy(category: str, _: Annotated[Principal, allow(Permission.NODES_WRITE)], ctx: Ctx) -> None:
    with tx(ctx) as db:
        rules.remove_policy(db, category)
