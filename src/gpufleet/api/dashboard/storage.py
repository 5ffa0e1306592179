"""The Storage page: each shared file system with its verdict, and every node's view of it (state, time per
operation against its own usual, fill). It shows what `GET /api/v1/storage` returns: this replica's nodes."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from gpufleet.api.dashboard.pages import View, render
from gpufleet.api.deps import Ctx
from gpufleet.auth.policy import Permission
from gpufleet.monitoring.storage import fleet_of_replica
from gpufleet.monitoring.storage_schemas import FileSystemOut

router = APIRouter(include_in_schema=False)
STATUSES = ("ok", "slow", "degraded", "down")


def storage_view(view: View) -> dict[str, Any]:
    judge = view.ctx.monitoring.judge
    systems = [FileSystemOut.of(fs) for fs in fleet_of_replica(view.session, judge.tracker, judge.storage)]
    counts = {s: sum(1 for fs in systems if fs.status == s) for s in STATUSES}
    wanted = view.query.get("status")
    if wanted:
        systems = [fs for fs in systems if fs.status == wanted]
    return {"systems": systems, "counts": counts, "query": view.query}


@router.get("/storage", response_class=HTMLResponse)
def storage_page(request: Request, ctx: Ctx) -> Response:
    return render(request, ctx, "storage", Permission.NODES_READ, storage_view)
