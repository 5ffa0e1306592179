"""Node lifecycle endpoints (admin only)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from gpufleet.api import conditional
from gpufleet.api.deps import Ctx, allow, tx
from gpufleet.api.routers.categories import health_policy_setting
from gpufleet.auth.policy import Permission
from gpufleet.auth.schemas import Principal
from gpufleet.inventory import listing
from gpufleet.inventory import service as inventory
from gpufleet.inventory.schemas import GpuOut, NodeClone, NodeDetail, NodeOut, NodesCreate, NodeSettings
from gpufleet.lifecycle import burnin
from gpufleet.lifecycle.schemas import BurnInOut
from gpufleet.power import service as power
from gpufleet.protocol.messages import CLOSE_NODE_GONE
from gpufleet.provisioning import networks

router = APIRouter(prefix="/nodes", tags=["nodes"])
gpus = APIRouter(prefix="/gpus", tags=["nodes"])


@router.get("", response_model=list[NodeOut])
def list_nodes(
    _: Annotated[Principal, allow(Permission.NODES_READ)],
    ctx: Ctx,
    request: Request,
    names: Annotated[str | None, Query(description="hostlist filter, e.g. gpu[001-004]")] = None,
    after: Annotated[str | None, Query(max_length=64, description="only nodes whose name sorts after this")] = None,
    limit: Annotated[int, Query(ge=1, le=listing.MAX_PAGE, description="at most this many nodes")] = listing.MAX_PAGE,
) -> Response:
    """Nodes by name, a page at a time: when more follow, the `Link` header names the next page
    (`rel="next"`). The `ETag` is weak: it changes when anything about a node changes but the heartbeat
    time of a node that stays up, and `If-None-Match` with it answers 304 while nothing did."""
    with tx(ctx, readonly=True) as db:
        page = listing.node_page(db, [names] if names else None, after, limit)
        if page.rows:
            states = power.power_states(db, [r["id"] for r in page.rows])
            for row in page.rows:
                row["power_state"] = states.get(row.pop("id"))
    return conditional.answer(
        request, page.rows, version=listing.heartbeat_free(page.rows), headers=_next(request, page.next_after, limit)
    )


def _next(request: Request, after: str | None, limit: int) -> dict[str, str]:
    """The `Link` header to the next page, when there is one."""
    if after is None:
        return {}
    url = request.url.include_query_params(after=after, limit=limit)
    return {"Link": f'<{url.path}?{url.query}>; rel="next"'}


@gpus.get("", response_model=list[GpuOut])
def list_gpus(
    _: Annotated[Principal, allow(Permission.NODES_READ)],
    ctx: Ctx,
    request: Request,
    nodes: Annotated[str | None, Query(description="only the GPUs of these nodes (a hostlist)")] = None,
    after: Annotated[
        str | None, Query(pattern=r"^[^:]{1,64}:[0-9]{1,4}$", description="NODE:INDEX, the last GPU already read")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=listing.MAX_PAGE, description="at most this many GPUs")] = listing.MAX_PAGE,
) -> Response:
    """Every GPU of the fleet by node name and index, with its node's state and its inventory; paged and
    tagged as the node list is (the `ETag` here is strong: nothing in a GPU's row moves by itself)."""
    key = None
    if after is not None:
        node, _sep, index = after.rpartition(":")
        key = (node, int(index))
    with tx(ctx, readonly=True) as db:
        page = listing.gpu_page(db, [nodes] if nodes else None, key, limit)
    return conditional.answer(request, page.rows, headers=_next(request, page.next_after, limit))


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
        detail.power_state = power.power_states(db, [node.id]).get(node.id)
        detail.hold = node.hold
        latest = burnin.latest_runs(db, [node.id]).get(node.id)
        if latest is not None:
            detail.burn_in = BurnInOut.of(latest).model_dump(mode="json")
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
