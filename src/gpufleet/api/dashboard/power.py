"""The Power page: every node with its BMC's protocol and the power state the BMC reported last (and
when, and the last error), a count per state, and the newest power tasks. It reads what
`GET /api/v1/power` and `GET /api/v1/tasks?kind=power.` return; nothing here asks a BMC."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from gpufleet.api.dashboard.pages import View, render
from gpufleet.api.deps import Ctx
from gpufleet.auth.policy import Permission
from gpufleet.power import service as power
from gpufleet.tasks import service as tasks
from gpufleet.tasks.schemas import TaskOut

router = APIRouter(include_in_schema=False)
TASKS_SHOWN = 10
STATES = ("on", "off", "unknown", "not read", "no BMC")


def power_view(view: View) -> dict[str, Any]:
    nodes = view.query.get("nodes")
    rows = power.power_table(view.session, [nodes] if nodes else None)
    wanted = view.query.get("power")
    counts = dict.fromkeys(STATES, 0)
    for row in rows:
        row_state = row.power_state or ("not read" if row.bmc else "no BMC")
        counts[row_state] = counts.get(row_state, 0) + 1
    if wanted:
        rows = [r for r in rows if (r.power_state or ("not read" if r.bmc else "no BMC")) == wanted]
    recent = tasks.list_tasks(view.session, kind="power.", limit=TASKS_SHOWN)
    return {"rows": rows, "counts": counts, "tasks": [TaskOut.of(t) for t in recent], "query": view.query}


@router.get("/power", response_class=HTMLResponse)
def power_page(request: Request, ctx: Ctx) -> Response:
    return render(request, ctx, "power", Permission.POWER_READ, power_view)
