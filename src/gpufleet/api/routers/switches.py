"""Switches polled over SNMP and the topology: register a switch (its community or v3 keys write-only), list
switches, one switch's ports and who is behind each, where a node is plugged, and the InfiniBand fabric the
agents report (see docs/network.md)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Request, Response

from gpufleet.api.deps import Ctx, allow, tx
from gpufleet.auth.policy import Permission
from gpufleet.auth.schemas import Principal
from gpufleet.core.credentials import head_box
from gpufleet.inventory import service as inventory
from gpufleet.network import fabric
from gpufleet.network import service as network
from gpufleet.network.schemas import FabricOut, NodeLinkOut, SwitchDetail, SwitchIn, SwitchOut

router = APIRouter(tags=["network"])
Read = Annotated[Principal, allow(Permission.NODES_READ)]
Write = Annotated[Principal, allow(Permission.NETWORK_WRITE)]


@router.get("/switches")
def list_switches(_: Read, ctx: Ctx) -> list[SwitchOut]:
    """Every switch: where it is, what it said at its last poll, its ports up and the nodes behind them."""
    with tx(ctx, readonly=True) as db:
        return network.list_switches(db)


@router.post("/switches", status_code=201)
def add_switch(body: SwitchIn, request: Request, _: Write, ctx: Ctx) -> SwitchDetail:
    """Register a switch for the leader to poll. Its community or v3 keys are stored encrypted, never returned."""
    request.state.audit_target = f"{body.name}: {body.address}:{body.port} v{body.version}"
    box = head_box(ctx.settings)
    with tx(ctx) as db:
        network.add_switch(db, ctx.clock, box, body)
        return network.switch_detail(db, body.name)


@router.get("/switches/{name}")
def get_switch(name: str, _: Read, ctx: Ctx) -> SwitchDetail:
    """One switch with every port: state, speed, rates over the last interval, and the node behind it."""
    with tx(ctx, readonly=True) as db:
        return network.switch_detail(db, name)


@router.delete("/switches/{name}", status_code=204)
def remove_switch(name: str, request: Request, _: Write, ctx: Ctx) -> Response:
    """Stop polling a switch and forget it; its firing alerts are resolved."""
    request.state.audit_target = name
    with tx(ctx) as db:
        network.remove_switch(db, ctx.clock, name)
    return Response(status_code=204)


@router.get("/nodes/{name}/links")
def node_links(name: str, _: Read, ctx: Ctx) -> list[NodeLinkOut]:
    """Where a node is plugged: each of its ports, the switch and switch port at the other end."""
    with tx(ctx, readonly=True) as db:
        return network.node_links(db, inventory.get_node(db, name).id)


@router.get("/fabric")
def get_fabric(_: Read, ctx: Ctx) -> FabricOut:
    """The InfiniBand fabric as the newest agent report has it: its switches with each cabled port and what
    is behind it, its channel adapters and links, who reported it and when, and every reporting node."""
    with tx(ctx, readonly=True) as db:
        return fabric.fabric_view(db)
