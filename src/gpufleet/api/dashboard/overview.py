"""The Overview page (`/`): nodes by state and health, GPUs in use / idle / failed, jobs running and
pending, fleet charts and the alerts that are firing."""

from __future__ import annotations

from collections import Counter
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from gpufleet.api.dashboard import gpu_usage
from gpufleet.api.dashboard.jobs import job_counts
from gpufleet.api.dashboard.pages import View, render
from gpufleet.api.deps import Ctx
from gpufleet.auth.policy import Permission
from gpufleet.inventory.states import NodeState
from gpufleet.jobs.models import JobState
from gpufleet.monitoring import alerts

router = APIRouter(include_in_schema=False)
HEALTHS = ("healthy", "degraded", "failed", "unknown")
ALERTS_SHOWN = 50


def overview(view: View) -> dict[str, Any]:
    nodes, gpus = gpu_usage.counts(view.session, view.ctx)
    may_read_alerts = view.may(Permission.ALERTS_READ)
    firing = alerts.list_alerts(view.session, status="firing", limit=ALERTS_SHOWN) if may_read_alerts else []
    states = Counter(n.state.value for n in nodes)
    healths = Counter(n.current_health for n in nodes)
    jobs = job_counts(view.session) if view.may(Permission.JOBS_READ) else None
    return {
        "nodes": nodes,
        "node_count": len(nodes),
        "states": {state.value: states.get(state.value, 0) for state in NodeState},
        "healths": {health: healths.get(health, 0) for health in HEALTHS},
        "drained": sum(1 for n in nodes if n.drained_at is not None),
        "gpus": gpus,
        "gpu_total": sum(gpus.values()),
        "firing": firing,
        "may_read_alerts": may_read_alerts,
        "jobs": {"running": jobs[JobState.RUNNING], "pending": jobs[JobState.PENDING]} if jobs else None,
    }


@router.get("/", response_class=HTMLResponse)
def overview_page(request: Request, ctx: Ctx) -> Response:
    return render(request, ctx, "overview", Permission.NODES_READ, overview)
