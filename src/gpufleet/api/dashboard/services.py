"""The Services page: every inference service (what `gpufleet service list` shows) with its endpoint on
the head, project, model, how many of its replicas are ready of those wanted, revision, restarts and
its problem if it has one (a crash loop's back-off, a replica the cluster refuses); the calls this head
proxied to it in the last minute (`ServiceProxy.stats`: requests a second, p50 and p99 latency, share
of 5xx); and under it each replica: its job, revision, state, node and health checks.

`inference.out` reads each replica's job one by one, as the API does: a cluster runs a handful of
services with a few replicas each, not thousands."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from gpufleet.api.dashboard.pages import View, render
from gpufleet.api.deps import Ctx
from gpufleet.auth.policy import Permission
from gpufleet.jobs import inference

router = APIRouter(include_in_schema=False)


def services_view(view: View) -> dict[str, Any]:
    rows = [
        {"service": inference.out(view.session, s), "stats": view.ctx.services.stats(s.name)}
        for s in inference.listing(view.session)
    ]
    return {"services": rows}


@router.get("/services", response_class=HTMLResponse)
def services_page(request: Request, ctx: Ctx) -> Response:
    return render(request, ctx, "services", Permission.JOBS_READ, services_view)
