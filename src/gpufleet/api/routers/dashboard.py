"""The web dashboard's pages: Overview at `/`, Nodes, Alerts, each with a fragment that htmx polls.

Server-rendered (Jinja2, templates in gpufleet/web/templates): a page is its layout around a
fragment, and `/fragments/<page>` renders the fragment alone, which the page's htmx element swaps in
every few seconds, so pages stay live without a reload and without client-side rendering. Pages
need a logged-in browser (see web_login); a fragment request whose session has ended is sent to
the login page (`HX-Redirect`). Anything that changes something goes through `session_principal`,
which wants the session's CSRF token: the layout carries it in a <meta>, and static/app.js adds it
to every htmx request as X-CSRF-Token.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from sqlalchemy.orm import Session

from gpufleet.api.deps import SESSION_COOKIE, Ctx, session_principal, tx
from gpufleet.api.templates import TEMPLATES
from gpufleet.auth import service as auth
from gpufleet.auth.policy import Permission, allowed
from gpufleet.core.errors import GpufleetError
from gpufleet.inventory import service as inventory
from gpufleet.inventory.states import NodeState
from gpufleet.monitoring import alerts

router = APIRouter(include_in_schema=False)
REFRESH_S = 5  # how often a page's fragment is fetched again (the issue allows at most 5 s)
HEALTHS = ("healthy", "degraded", "failed", "unknown")
ALERTS_SHOWN = 50


def _overview(session: Session, may_read_alerts: bool) -> dict[str, Any]:
    nodes = [inventory.to_out(n) for n in inventory.list_nodes(session)]
    firing = alerts.list_alerts(session, status="firing", limit=ALERTS_SHOWN) if may_read_alerts else []
    states = Counter(n.state.value for n in nodes)
    healths = Counter(n.health for n in nodes)
    return {
        "nodes": nodes,
        "node_count": len(nodes),
        "states": {state.value: states.get(state.value, 0) for state in NodeState},
        "healths": {health: healths.get(health, 0) for health in HEALTHS},
        "drained": sum(1 for n in nodes if n.drain_reason is not None),
        "gpus": sum(n.gpu_count for n in nodes),
        "firing": firing,
        "may_read_alerts": may_read_alerts,
    }


def _nodes(session: Session, _may_read_alerts: bool) -> dict[str, Any]:
    return {"nodes": [inventory.to_out(n) for n in inventory.list_nodes(session)]}


def _alerts(session: Session, _may_read_alerts: bool) -> dict[str, Any]:
    return {"alerts": alerts.list_alerts(session, limit=ALERTS_SHOWN * 4)}


@dataclass(frozen=True)
class Page:
    title: str
    path: str
    permission: Permission
    data: Callable[[Session, bool], dict[str, Any]]


PAGES: dict[str, Page] = {
    "overview": Page("Overview", "/", Permission.NODES_READ, _overview),
    "nodes": Page("Nodes", "/nodes", Permission.NODES_READ, _nodes),
    "alerts": Page("Alerts", "/alerts", Permission.ALERTS_READ, _alerts),
}


def _render(request: Request, ctx: Ctx, name: str, fragment: bool) -> Response:
    page = PAGES[name]
    try:
        who = session_principal(request, ctx)
    except GpufleetError:
        if fragment:
            return Response(status_code=401, headers={"HX-Redirect": "/login"})
        return RedirectResponse("/login", status_code=303)
    if not allowed(who.role, page.permission, who.scope):
        return HTMLResponse(f"this account may not read {page.title.lower()}", status_code=403)
    may_read_alerts = allowed(who.role, Permission.ALERTS_READ, who.scope)
    with tx(ctx, readonly=True) as session:
        data = page.data(session, may_read_alerts)
    context = data | {
        "page": name,
        "pages": {key: p for key, p in PAGES.items() if allowed(who.role, p.permission, who.scope)},
        "refresh_s": REFRESH_S,
        "fragment": f"fragments/{name}.html",
        "fragment_url": f"/fragments/{name}",
        "user": who.user,
        "role": who.role,
        "csrf": auth.csrf_token(request.cookies[SESSION_COOKIE]),
    }
    template = context["fragment"] if fragment else "page.html"
    return TEMPLATES.TemplateResponse(request, template, context, headers={"Cache-Control": "no-store"})


@router.get("/", response_class=HTMLResponse)
def overview_page(request: Request, ctx: Ctx) -> Response:
    return _render(request, ctx, "overview", fragment=False)


@router.get("/nodes", response_class=HTMLResponse)
def nodes_page(request: Request, ctx: Ctx) -> Response:
    return _render(request, ctx, "nodes", fragment=False)


@router.get("/alerts", response_class=HTMLResponse)
def alerts_page(request: Request, ctx: Ctx) -> Response:
    return _render(request, ctx, "alerts", fragment=False)


@router.get("/fragments/{name}", response_class=HTMLResponse)
def fragment(name: str, request: Request, ctx: Ctx) -> Response:
    """A page's live part alone, for htmx to swap in."""
    if name not in PAGES:
        return HTMLResponse("no such page", status_code=404)
    return _render(request, ctx, name, fragment=True)
