"""The Burn-in and Maintenance pages: burn-in runs, the nodes held out of service and why, the fleet's
latest value of each step with the nodes far from the rest marked (`/burn-in`), one run's steps against
their thresholds (`/burn-in/{id}`), maintenance campaigns with their progress (`/maintenance`) and one
campaign's nodes, phase by phase (`/maintenance/{name}`).

Every number comes from lifecycle.views, the same functions the REST API answers with. The pages only
read: burn-ins are started and campaigns paused, resumed or cancelled with the CLI or the API.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from gpufleet.api.dashboard.pages import View, render
from gpufleet.api.deps import Ctx, RowId
from gpufleet.auth.policy import Permission
from gpufleet.core.errors import InvalidInput
from gpufleet.lifecycle import burnin, profiles, views

router = APIRouter(include_in_schema=False)
RUNS_SHOWN = 50
CAMPAIGNS_SHOWN = 100


def num(value: float | None) -> str:
    """A measurement as people read it: three or four significant figures, thousands grouped."""
    if value is None:
        return ""
    size = abs(value)
    if size >= 100:
        return f"{value:,.0f}"
    if size >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}"


def signed(value: float) -> str:
    """One decimal with its sign, a true minus, and no "−0.0" for what rounds to nothing."""
    if round(value, 1) == 0:
        return "0.0"
    return f"{value:+.1f}".replace("-", "\u2212")


def pct_from(value: float, median: float) -> str:
    """How far `value` lies from `median`, in per cent of it, signed ("−12.5 %")."""
    if median == 0:
        return ""
    return f"{signed((value - median) / abs(median) * 100)} %"


# A campaign's policy as the page words it (lifecycle.campaigns keeps it as CampaignIn's fields).
POLICY_LABELS = {
    "max_unavailable": "max unavailable",
    "wait_jobs_s": "wait for jobs",
    "overdue": "jobs still running after that",
    "keep": "keep serving, per category",
    "failure_budget": "failure budget",
    "canary": "canary first",
    "boot_timeout_s": "boot timeout",
}


def duration(seconds: float) -> str:
    """Seconds as the largest whole unit that fits: 3600 → "1 h", 90 → "90 s"."""
    for unit, size in (("d", 86_400), ("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:g} s"


def policy_rows(policy: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, value) of each policy field, known ones worded, others as they are."""
    rows = []
    for key, value in policy.items():
        if isinstance(value, bool):
            text = "yes" if value else "no"
        elif key.endswith("_s") and isinstance(value, int | float):
            text = duration(float(value))
        else:
            text = str(value)
        rows.append((POLICY_LABELS.get(key, key.replace("_", " ")), text))
    return rows


def _run_id(query: dict[str, str], key: str) -> int | None:
    text = query.get(key)
    if text is None:
        return None
    if not text.isdigit() or not 0 < int(text) < 2**63:
        raise InvalidInput(f"{key} must be a run id, not {text!r}")
    return int(text)


def burnin_view(view: View) -> dict[str, Any]:
    query = view.query
    node, state, step = query.get("node"), query.get("state"), query.get("step")
    before = _run_id(query, "before")
    runs = views.list_runs(view.session, node=node, state=state, before=before, limit=RUNS_SHOWN)
    metrics = views.fleet_metrics(view.session)
    settings = view.ctx.settings
    admin_dirs = burnin.profile_dirs(settings.data_dir, settings.burnin_profiles_dir)
    found, problems = profiles.load_profiles(admin_dirs)
    return {
        "query": query,
        "runs": runs,
        "older": runs[-1].id if len(runs) == RUNS_SHOWN else None,
        "states": views.RUN_STATES,
        "held": views.held_nodes(view.session),
        "metrics": metrics,
        "step": step,
        "chosen": [m for m in metrics if m.step == step],
        "admission": view.ctx.settings.burnin_admission,
        "profiles": sorted(found.values(), key=lambda p: p.name),
        "admin_dirs": [str(d) for d in admin_dirs],
        "problems": problems,
        "num": num,
        "pct_from": pct_from,
        "signed": signed,
        "spreads": views.OUTLIER_SPREADS,
        "min_nodes": views.MIN_NODES_FOR_OUTLIERS,
    }


def burnin_run_view(view: View, run_id: int) -> dict[str, Any]:
    detail = views.get_run(view.session, run_id)
    return {"detail": detail, "run": detail.run, "steps": detail.steps, "num": num, "signed": signed}


def maintenance_view(view: View) -> dict[str, Any]:
    state = view.query.get("state")
    return {
        "query": view.query,
        "campaigns": views.list_campaigns(view.session, state=state, limit=CAMPAIGNS_SHOWN),
        "states": views.CAMPAIGN_STATES,
        "phases": views.PHASES,
    }


def campaign_view(view: View, name: str) -> dict[str, Any]:
    detail = views.get_campaign(view.session, name)
    return {
        "campaign": detail.campaign,
        "nodes": detail.nodes,
        "phases": views.PHASES,
        "policy": policy_rows(dict(detail.campaign.policy)),
    }


@router.get("/burn-in", response_class=HTMLResponse)
def burnin_page(request: Request, ctx: Ctx) -> Response:
    return render(request, ctx, "burnin", Permission.NODES_READ, burnin_view, nav="burn-in")


@router.get("/burn-in/{run_id}", response_class=HTMLResponse)
def burnin_run_page(run_id: RowId, request: Request, ctx: Ctx) -> Response:
    return render(
        request,
        ctx,
        "burnin_run",
        Permission.NODES_READ,
        lambda view: burnin_run_view(view, run_id),
        nav="burn-in",
        title=f"Burn-in run {run_id}",
    )


@router.get("/maintenance", response_class=HTMLResponse)
def maintenance_page(request: Request, ctx: Ctx) -> Response:
    return render(request, ctx, "maintenance", Permission.NODES_READ, maintenance_view)


@router.get("/maintenance/{name}", response_class=HTMLResponse)
def campaign_page(name: str, request: Request, ctx: Ctx) -> Response:
    return render(
        request,
        ctx,
        "maintenance_campaign",
        Permission.NODES_READ,
        lambda view: campaign_view(view, name),
        nav="maintenance",
        title=f"Campaign {name}",
    )
