"""The node page (`/nodes/{name}`): inventory, state and health, GPUs with their latest values, what its
artifact cache holds (jobs.artifacts.node_cache), charts and the node's recent events. The charts draw
`GET /api/v1/nodes/{name}/gpu-charts` (api.routers.monitoring).

The live part (everything but the charts) is re-fetched every few seconds like every page. The charts
sit outside it, so a refresh does not redraw them: static/charts.js fetches their JSON itself, once a
minute. A chart's JSON reads each sample row once for all the node's GPUs (`monitoring.node_series`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response
from sqlalchemy import select
from sqlalchemy.orm import Session

from gpufleet.api.dashboard.gpu_usage import FRESH_INTERVALS, gpu_reasons
from gpufleet.api.dashboard.pages import View, render
from gpufleet.api.deps import Ctx
from gpufleet.api.routers.categories import health_policy_setting
from gpufleet.api.routers.monitoring import GPU_CHARTS
from gpufleet.auth.audit import AuditRecord
from gpufleet.auth.policy import Permission
from gpufleet.core.clock import to_datetime
from gpufleet.core.errors import InvalidInput
from gpufleet.inventory import categories
from gpufleet.inventory import service as inventory
from gpufleet.inventory.models import Gpu, Node, NodeTransition
from gpufleet.inventory.schemas import SettingOut
from gpufleet.jobs import artifacts
from gpufleet.lifecycle import views as lifecycle
from gpufleet.monitoring import node_series
from gpufleet.monitoring.models import Alert
from gpufleet.network import service as network

router = APIRouter(include_in_schema=False)

EVENTS_SHOWN = 50
# Audit records whose target contains the node's name, read to find EVENTS_SHOWN that name it as a
# whole word ("gpu01" is in "gpu011" too).
AUDIT_CANDIDATES = 4 * EVENTS_SHOWN
# The chart ranges the page offers: query value, what the links say, what the headings say.
RANGES = {"1h": ("1 hour", "last hour"), "1d": ("1 day", "last day")}


@dataclass(frozen=True)
class GpuRow:
    """One row of the GPU table: a GPU of the inventory, or one the node should have and lacks."""

    index: int
    gpu: Gpu | None  # None: missing from the inventory
    status: str  # ok | faulty | missing
    note: str
    util: float | None
    temp_c: float | None
    power_w: float | None
    mem_used_pct: float | None


@dataclass(frozen=True)
class Event:
    """One line of "Recent events": a state transition, an alert firing or resolving, an audit record."""

    at: datetime
    kind: str  # state | alert | resolved | audit
    what: str
    detail: str
    who: str
    tone: str  # a CSS class: up, down, warn, new, muted


def _ago(then: datetime | None, now: float) -> str:
    if then is None:
        return ""
    seconds = max(0.0, now - then.timestamp())
    for unit, size in (("d", 86_400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{int(seconds // size)} {unit} ago"
    return f"{int(seconds)} s ago"


def gpu_rows(node: Node, latest: dict[str, dict[str, Any]]) -> list[GpuRow]:
    """The inventory's GPUs and the missing ones (`expected_gpus` says more than the inventory has),
    each with its health and its values in the sample `latest`."""
    named = gpu_reasons(node.health_reasons) if node.health in ("failed", "degraded") else {}
    by_index = {g.index: g for g in node.gpus}
    rows = []
    for index in sorted(set(by_index) | set(range(node.expected_gpus))):
        values = latest.get(f"gpu:{index}", {})
        used, free = values.get("fb_used_mib"), values.get("fb_free_mib")
        gpu = by_index.get(index)
        if gpu is None:
            status, note = "missing", named.get(index, f"not in the inventory ({node.expected_gpus} expected)")
        elif index in named:
            status, note = "faulty", named[index]
        else:
            status, note = "ok", ""
        rows.append(
            GpuRow(
                index=index,
                gpu=gpu,
                status=status,
                note=note,
                util=values.get("gpu_util"),
                temp_c=values.get("gpu_temp_c"),
                power_w=values.get("power_w"),
                mem_used_pct=100 * used / (used + free)
                if used is not None and free is not None and used + free > 0
                else None,
            )
        )
    return rows


def _names(name: str) -> re.Pattern[str]:
    """Matches `name` as a whole node name inside a longer text (a path, "gpu01: inject xid")."""
    return re.compile(rf"(?<![\w.-]){re.escape(name)}(?![\w.-])")


def node_events(session: Session, node: Node, *, alerts: bool, audit: bool) -> list[Event]:
    """The node's state transitions, alerts (if `alerts`) and the audit records naming it (if `audit`),
    newest first, at most EVENTS_SHOWN."""
    events: list[Event] = []
    transitions = session.scalars(
        select(NodeTransition)
        .where(NodeTransition.node_id == node.id)
        .order_by(NodeTransition.at.desc(), NodeTransition.id.desc())
        .limit(EVENTS_SHOWN)
    )
    for t in transitions:
        tone = {"up": "up", "down": "down"}.get(t.to_state.value, "new")
        events.append(Event(t.at, "state", f"{t.from_state.value} → {t.to_state.value}", t.reason, "", tone))
    if alerts:
        # The newest by start and the newest by end: an old alert may have resolved a moment ago.
        started = select(Alert).where(Alert.node_name == node.name).order_by(Alert.id.desc()).limit(EVENTS_SHOWN)
        ended = (
            select(Alert)
            .where(Alert.node_name == node.name, Alert.ends_at.is_not(None))
            .order_by(Alert.ends_at.desc())
            .limit(EVENTS_SHOWN)
        )
        found = {a.id: a for a in session.scalars(started)} | {a.id: a for a in session.scalars(ended)}
        for a in found.values():
            gpu = f"GPU {a.gpu}: " if a.gpu is not None else ""
            firing = " (firing)" if a.status == "firing" else ""
            tone = "down" if a.severity == "critical" else "warn"
            events.append(Event(a.starts_at, "alert", f"{a.rule} fired{firing}", f"{gpu}{a.summary}", "", tone))
            if a.ends_at is not None:
                events.append(Event(a.ends_at, "resolved", f"{a.rule} resolved", f"{gpu}{a.summary}", "", "up"))
    if audit:
        names = _names(node.name)
        records = session.scalars(
            select(AuditRecord)
            .where(AuditRecord.target.contains(node.name, autoescape=True))
            .order_by(AuditRecord.at.desc(), AuditRecord.id.desc())
            .limit(AUDIT_CANDIDATES)
        )
        for r in records:
            if names.search(r.target):
                tone = "down" if r.result >= 400 else "muted"
                detail = r.target if r.result < 400 else f"{r.target} (refused: {r.result})"
                events.append(Event(r.at, "audit", r.action, detail, r.actor, tone))
    events.sort(key=lambda e: e.at, reverse=True)
    return events[:EVENTS_SHOWN]


def node_view(view: View, name: str) -> dict[str, Any]:
    chart_range = view.query.get("range", "1h")
    if chart_range not in RANGES:
        raise InvalidInput(f"range is one of {', '.join(RANGES)}")
    node = inventory.get_node(view.session, name)
    now = view.ctx.clock.now()
    sample = node_series.latest(view.session, node.id, now - FRESH_INTERVALS * view.ctx.settings.metrics_interval_s)
    return {
        "node": node,
        "gpus": gpu_rows(node, sample[1] if sample else {}),
        "sampled_at": to_datetime(sample[0]) if sample else None,
        "events": node_events(
            view.session, node, alerts=view.may(Permission.ALERTS_READ), audit=view.may(Permission.AUDIT_READ)
        ),
        "audit_shown": view.may(Permission.AUDIT_READ),
        "ago": {
            "state": _ago(node.state_since, now),
            "health": _ago(node.health_since, now),
            "last_seen": _ago(node.last_seen, now),
            "drained": _ago(node.drained_at, now),
        },
        "chart_range": chart_range,
        "ranges": RANGES,
        "charts": GPU_CHARTS,
        "settings": node_settings(view.session, node),
        "cache": artifacts.node_cache(view.session, node.id),
        "burnin": lifecycle.node_burnin(view.session, node),
        "links": network.node_links(view.session, node.id),
    }


def node_settings(session: Session, node: Node) -> dict[str, SettingOut]:
    """The node's settings with their origin (defaults < category < node), the health policy included."""
    out = {k: SettingOut(value=r.value, origin=r.origin) for k, r in categories.resolve(session, node).items()}
    out["health_policy"] = health_policy_setting(session, node.category)
    return out


@router.get("/nodes/{name}", response_class=HTMLResponse)
def node_page(name: str, request: Request, ctx: Ctx) -> Response:
    return render(
        request, ctx, "node", Permission.NODES_READ, lambda view: node_view(view, name), nav="nodes", title=name
    )
