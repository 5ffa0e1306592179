"""Node lifecycle endpoints (admin only)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

from fastapi import APIRouter, Query, Request
from sqlalchemy.orm import Session

from gpufleet.api.deps import Ctx, allow, tx
from gpufleet.api.routers.categories import health_policy_setting
from gpufleet.auth.policy import Permission
from gpufleet.auth.schemas import Principal
from gpufleet.inventory import service as inventory
from gpufleet.inventory.schemas import NodeClone, NodeDetail, NodeOut, NodesCreate, NodeSettings
from gpufleet.power import service as power
from gpufleet.protocol.messages import CLOSE_NODE_GONE
from gpufleet.provisioning import networks

router = APIRouter(prefix="/nodes", tags=["nodes"])


@router.get("")
def list_nodes(
    _: Annotated[Principal, allow(Permission.NODES_READ)],
    ctx: Ctx,
    names: Annotated[str | None, Query(description="hostlist filter, e.g. gpu[001-004]")] = None,
) -> list[NodeOut]:
    with tx(ctx, readonly=True) as db:
        nodes = [inventory.to_out(n) for n in inventory.list_nodes(db, [names] if names else None)]
        _with_power(db, nodes, [names] if names else None)
        return nodes


def _with_power(db: Session, nodes: Sequence[NodeOut], expressions: list[str] | None) -> None:
    """The power state each node's BMC reported last: power sits above inventory, so it is added here."""
    states = {row.node: row.power_state for row in power.power_table(db, expressions)}
    for node in nodes:
        node.power_state = states.get(node.name)


@router.post("", status_code=201)
def add_nodes(
    body: NodesCreate, _: Annotated[Principal, allow(Permission.NODES_WRITE)], ctx: Ctx, request: Request
) -> list[NodeOut]:
    request.state.audit_target = ",".join(body.names)
    settings = NodeSettings(category=body.category, labels=body.labels)
    with tx(ctx) as db:
        added = inventory.add_nodes(db, ctx.clock, body.names, settings)
        if body.network is not None:  # all or nothing: a range too small refuses the nodes too
            networks.assign(db, added, networks.get_network(db, body.network))
        return [inventory.to_out(n) for n in added]


@router.delete("")
def remove_nodes(
    _: Annotated[Principal, allow(Permission.NODES_WRITE)],
    ctx: Ctx,
    names: Annotated[str, Query(description="node names or a hostlist expression")],
) -> list[str]:
    with tx(ctx) as db:
        removed = inventory.remove_nodes(db, [names])
    ids = list(removed.values())
    for node_id in ids:
        ctx.loops.book.forget(node_id)
    ctx.hub.disconnect(ids, CLOSE_NODE_GONE, "node removed from gpufleet")
    return list(removed)


@router.get("/{name}")
def show_node(name: str, _: Annotated[Principal, allow(Permission.NODES_READ)], ctx: Ctx) -> NodeDetail:
    with tx(ctx, readonly=True) as db:
        node = inventory.get_node(db, name)
        detail = inventory.to_detail(db, node)
        detail.settings["health_policy"] = health_policy_setting(db, node.category)
        _with_power(db, [detail], [name])
        return detail


@router.post("/{name}/clone", status_code=201)
def clone_node(
    name: str, body: NodeClone, _: Annotated[Principal, allow(Permission.NODES_WRITE)], ctx: Ctx, request: Request
) -> list[NodeOut]:
    request.state.audit_target = f"{name} -> {','.join(body.names)}"
    with tx(ctx) as db:
        source = inventory.get_node(db, name)
        added = inventory.clone_node(db, ctx.clock, name, body.names)
        for network in networks.networks_of(db, source.id):  # the clones get addresses of their own
            networks.assign(db, added, network)
        return [inventory.to_out(n) for n in added]
