"""The Environments page: the runtime environments with the driver each needs and how many nodes' drivers
run it (what `gpufleet env list` shows), each node's verdict on request, and the job templates on offer
(built in and the admins' own, with the files that could not be read)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from gpufleet.api.dashboard.pages import View, render
from gpufleet.api.deps import Ctx
from gpufleet.api.routers.templates import load as load_templates
from gpufleet.auth.policy import Permission
from gpufleet.jobs import environments

router = APIRouter(include_in_schema=False)


def environments_view(view: View, ctx: Ctx) -> dict[str, Any]:
    rows = []
    known = environments.fleet(view.session)
    for env in environments.listing(view.session):
        fits = environments.check(known, env)
        # The nodes that cannot run it, grouped by why (one line per driver, not one per node).
        blocked: dict[str, list[str]] = defaultdict(list)
        for fit in fits:
            if not (fit.ok and fit.takes_jobs):
                blocked[fit.reason].append(fit.node)
        rows.append({"env": env, "total": len(fits), "compatible": environments.runnable(fits), "blocked": blocked})
    loaded, problems = load_templates(ctx.settings)
    offered = [
        {
            "template": t,
            "origin": t.origin,
            "params": [p.name + ("" if p.required else "?") for p in t.params.values()],
        }
        for t in sorted(loaded.values(), key=lambda t: t.name)
    ]
    return {"environments": rows, "templates": offered, "problems": problems}


@router.get("/environments", response_class=HTMLResponse)
def environments_page(request: Request, ctx: Ctx) -> Response:
    return render(request, ctx, "environments", Permission.JOBS_READ, lambda view: environments_view(view, ctx))
