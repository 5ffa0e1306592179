"""The Software page: the CVE impact report (problems most severe first, with their nodes and fixes),
the version matrix of the software that defines a GPU node, and the nodes that drift from their
category. It reads what `GET /api/v1/cve/report`, `/assets/matrix` and `/assets/drift` return."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from gpufleet.api.dashboard.pages import View, render
from gpufleet.api.deps import Ctx
from gpufleet.assets import report, store, views
from gpufleet.assets.models import FINDING_STATUSES
from gpufleet.assets.records import SEVERITIES
from gpufleet.auth.policy import Permission
from gpufleet.core.errors import InvalidInput

router = APIRouter(include_in_schema=False)
SHOWN = 200


def software_view(view: View) -> dict[str, Any]:
    query = view.query
    severity = query.get("severity")
    status = query.get("status")
    if status is not None and status not in FINDING_STATUSES:
        raise InvalidInput(f"status must be one of {', '.join(FINDING_STATUSES)}")
    problems = report.problems(view.session, severity=severity, statuses=(status,) if status else None)
    software = store.node_software(view.session)
    nodes = {name: v.packages for name, v in software.items()}
    return {
        "problems": problems[:SHOWN],
        "more": max(0, len(problems) - SHOWN),
        "matrix": views.version_matrix(nodes),
        "drift": views.drift(nodes, {name: v.category for name, v in software.items()}),
        "reported": len(software),
        "query": query,
        "severities": SEVERITIES[:4],
        "statuses": FINDING_STATUSES,
    }


@router.get("/software", response_class=HTMLResponse)
def software_page(request: Request, ctx: Ctx) -> Response:
    return render(request, ctx, "software", Permission.ASSETS_READ, software_view)
