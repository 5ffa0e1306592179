"""The Network pages: every switch (its last poll, ports up, nodes behind it), and one switch with each port's
state, speed, traffic and errors and the node plugged into it. They read what `GET /api/v1/switches` and
`GET /api/v1/switches/NAME` return; nothing here asks a switch."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from gpufleet.api.dashboard.pages import View, render
from gpufleet.api.deps import Ctx
from gpufleet.auth.policy import Permission
from gpufleet.network import service as network

router = APIRouter(include_in_schema=False)


def switches_view(view: View) -> dict[str, Any]:
    return {"switches": network.list_switches(view.session)}


def switch_view(view: View, name: str) -> dict[str, Any]:
    switch = network.switch_detail(view.session, name)
    wanted = view.query.get("state")
    ports = [p for p in switch.ports if wanted is None or (p.oper_status if p.admin_up else "shut") == wanted]
    return {"switch": switch, "ports": ports, "query": view.query}


@router.get("/switches", response_class=HTMLResponse)
def switches_page(request: Request, ctx: Ctx) -> Response:
    return render(request, ctx, "switches", Permission.NODES_READ, switches_view)


@router.get("/switches/{name}", response_class=HTMLResponse)
def switch_page(name: str, request: Request, ctx: Ctx) -> Response:
    return render(
        request, ctx, "switch", Permission.NODES_READ, lambda v: switch_view(v, name), nav="switches", title=name
    )
