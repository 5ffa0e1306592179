"""The Alerts page: firing and resolved alerts, with acknowledge and silence for those who may."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from gpufleet.api.dashboard.pages import View, render
from gpufleet.api.deps import Ctx
from gpufleet.auth.policy import Permission
from gpufleet.core.errors import InvalidInput
from gpufleet.monitoring import alerts

router = APIRouter(include_in_schema=False)
SHOWN = 200


def alerts_view(view: View) -> dict[str, Any]:
    status = view.query.get("status")
    if status not in (None, "firing", "resolved"):
        raise InvalidInput("status is firing or resolved")
    return {
        "alerts": alerts.list_alerts(view.session, status=status, node=view.query.get("node"), limit=SHOWN),
        "silences": alerts.list_silences(view.session, view.ctx.clock),
        "status": status or "",
    }


@router.get("/alerts", response_class=HTMLResponse)
def alerts_page(request: Request, ctx: Ctx) -> Response:
    return render(request, ctx, "alerts", Permission.ALERTS_READ, alerts_view)
