"""The plain status page at `/`: nodes and their state, for any logged-in user (see web_login).

The full dashboard (issue 5) replaces this page; until then it is deliberately plain HTML.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from gpufleet.api.deps import SESSION_COOKIE, Ctx, session_principal, tx
from gpufleet.api.templates import TEMPLATES
from gpufleet.auth import service as auth
from gpufleet.auth.policy import Permission, allowed
from gpufleet.core.errors import GpufleetError
from gpufleet.inventory import service as inventory
from gpufleet.inventory.states import NodeState

router = APIRouter(include_in_schema=False)


@router.get("/", response_class=HTMLResponse)
def status_page(request: Request, ctx: Ctx) -> Response:
    try:
        who = session_principal(request, ctx)
    except GpufleetError:
        return RedirectResponse("/login", status_code=303)
    if not allowed(who.role, Permission.NODES_READ, who.scope):
        return HTMLResponse("this account may not read the cluster", status_code=403)
    with tx(ctx, readonly=True) as session:
        nodes = [inventory.to_out(n) for n in inventory.list_nodes(session)]
    counts = {state.value: sum(1 for n in nodes if n.state is state) for state in NodeState}
    context = {
        "nodes": nodes,
        "counts": counts,
        "gpus": sum(n.gpu_count for n in nodes),
        "user": who.user,
        "csrf": auth.csrf_token(request.cookies[SESSION_COOKIE]),
    }
    return TEMPLATES.TemplateResponse(
        request, "status.html", context, headers={"Refresh": "5", "Cache-Control": "no-store"}
    )
