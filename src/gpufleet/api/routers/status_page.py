"""The plain status page at `/`: nodes and their state. Login is by API token, kept in an HttpOnly cookie.

The full dashboard (issue 5) replaces this page; until then it is deliberately plain HTML.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from gpufleet.api.deps import SESSION_COOKIE, Ctx, authenticate, tx
from gpufleet.auth.models import TokenKind
from gpufleet.auth.schemas import Principal
from gpufleet.core.errors import GpufleetError
from gpufleet.inventory import service as inventory
from gpufleet.inventory.states import NodeState

TEMPLATES = Jinja2Templates(directory=str(Path(__file__).resolve().parents[2] / "web" / "templates"))
router = APIRouter(include_in_schema=False)


def _admin(ctx: Ctx, token: str | None) -> Principal | None:
    if not token:
        return None
    try:
        who = authenticate(ctx, token)
    except GpufleetError:
        return None
    return who if who.kind is TokenKind.ADMIN else None


@router.get("/", response_class=HTMLResponse)
def status_page(request: Request, ctx: Ctx) -> Response:
    if _admin(ctx, request.cookies.get(SESSION_COOKIE)) is None:
        return RedirectResponse("/login", status_code=303)
    with tx(ctx, readonly=True) as session:
        nodes = [inventory.to_out(n) for n in inventory.list_nodes(session)]
    counts = {state.value: sum(1 for n in nodes if n.state is state) for state in NodeState}
    return TEMPLATES.TemplateResponse(
        request,
        "status.html",
        {"nodes": nodes, "counts": counts, "gpus": sum(n.gpu_count for n in nodes)},
        headers={"Refresh": "5", "Cache-Control": "no-store"},
    )


@router.get("/login", response_class=HTMLResponse)
def login_form(request: Request) -> Response:
    return TEMPLATES.TemplateResponse(request, "login.html", {"error": None})


@router.post("/login", response_class=HTMLResponse)
def login(request: Request, ctx: Ctx, token: Annotated[str, Form(max_length=512)]) -> Response:
    request.state.audit_target = "status page"
    who = _admin(ctx, token.strip())
    if who is None:
        return TEMPLATES.TemplateResponse(request, "login.html", {"error": "unknown or expired token"}, status_code=401)
    request.state.actor = who.actor
    response = RedirectResponse("/", status_code=303)
    response.set_cookie(
        SESSION_COOKIE,
        token.strip(),
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        max_age=12 * 3600,
    )
    return response


@router.post("/logout")
def logout() -> Response:
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(SESSION_COOKIE)
    return response
