"""The Network pages: every switch (its last poll, ports up, nodes behind it), and one switch with each port's
state, speed, traffic and errors and the node plugged into it, and the InfiniBand fabric the agents report
(each IB switch's cabled ports and who is behind them). They read what `GET /api/v1/switches`,
`GET /api/v1/switches/NAME` and `GET /api/v1/fabric` return; nothing here asks a switch."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from gpufleet.api.dashboard.pages import View, render
from gpufleet.api.deps import Ctx
from gpufleet.auth.policy import Permission
from gpufleet.network import fabric
from gpufleet.network import service as network

router = APIRouter(include_in_schema=False)


def switches_view(view: View) -> dict[str, Any]:
    return {"switches": network.list_switches(view.session)}


def switch_view(view: View, name: str) -> dict[str, Any]:
    switch = network.switch_detail(view.session, name)
    wanted = view.query.get("state")
    ports = [p for p in switch.ports if wanted is None or (p.oper_status if p.admin_up else "shut") == wanted]
    return {"switch": switch, "ports": ports, "query": view.query}


FABRIC_OPEN_UP_TO = 8  # switches whose port tables are shown unfolded; a larger fabric's are folded


def fabric_view(view: View) -> dict[str, Any]:
    return {"fabric": fabric.fabric_view(view.session), "open_up_to": FABRIC_OPEN_UP_TO}


@router.get("/switches", response_class=HTMLResponse)
def switches_page(request: Request, ctx: Ctx) -> Response:
    return render(request, ctx, "switches", Permission.NODES_READ, switches_view)


@router.get("/switches/{name}", response_class=HTMLResponse)
def switch_page(name: str, request: Request, ctx: Ctx) -> Response:
    return render(
        request, ctx, "switch", Permission.NODES_READ, lambda v: switch_view(v, name), nav="switches", title=name
    )


@router.get("/fabric", response_class=HTMLResponse)
def fabric_page(request: Request, ctx: Ctx) -> Response:
    return render(request, ctx, "fabric", Permission.NODES_READ, fabric_view, nav="switches", title="InfiniBand fabric")
