"""MIG layouts: each GPU's declared and actual layout, and declaring one for a node or a category
(sharing.service; applied by sharing.reconcile). Reads need `nodes:read`, declaring `nodes:write`."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from gpufleet.api.deps import Ctx, allow, tx
from gpufleet.auth.policy import Permission
from gpufleet.auth.schemas import Principal
from gpufleet.protocol.mig import LAYOUT_MAX_CHARS
from gpufleet.sharing import service
from gpufleet.sharing.service import NodeMig

router = APIRouter(tags=["mig"])


class GpuMigOut(BaseModel):
    index: int
    declared: str | None = Field(description="the node's mig_layout; null: unset, the GPU is left as it is")
    actual: str = Field(description='"whole", or its MIG instances ("7x1g.18gb")')
    in_sync: bool
    problem: str | None = Field(description="why the declared layout cannot apply to this GPU")
    error: str | None = Field(description="why the agent could not apply it, when it tried")


class NodeMigOut(BaseModel):
    node: str
    category: str | None
    in_sync: bool
    asked: bool = Field(description="a change was sent and is unanswered, or refused and will be asked again")
    gpus: list[GpuMigOut]


class LayoutIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    layout: str | None = Field(
        max_length=LAYOUT_MAX_CHARS, description="none, all-1g.18gb, 3g.71gb+4g.71gb; null unsets"
    )
    node: str | None = Field(None, max_length=64)
    category: str | None = Field(None, max_length=64)
    now: bool = Field(False, description="refuse (409) rather than wait when running jobs hold GPUs it changes")


def _out(found: list[NodeMig]) -> list[NodeMigOut]:
    return [
        NodeMigOut(
            node=n.node,
            category=n.category,
            in_sync=n.in_sync,
            asked=n.asked,
            gpus=[
                GpuMigOut(
                    index=g.index,
                    declared=g.declared,
                    actual=g.actual,
                    in_sync=g.in_sync,
                    problem=g.problem,
                    error=n.errors.get(str(g.index)),
                )
                for g in n.gpus
            ],
        )
        for n in found
    ]


@router.get("/mig")
def mig_status(
    _: Annotated[Principal, allow(Permission.NODES_READ)],
    ctx: Ctx,
    node: Annotated[str | None, Query(max_length=64)] = None,
    category: Annotated[str | None, Query(max_length=64)] = None,
) -> list[NodeMigOut]:
    """Every node's GPUs: declared layout, actual layout, and whether they agree."""
    with tx(ctx, readonly=True) as db:
        return _out(service.status(db, node, category))


@router.put("/mig/layout")
def declare_layout(
    body: LayoutIn, _: Annotated[Principal, allow(Permission.NODES_WRITE)], ctx: Ctx, request: Request
) -> list[NodeMigOut]:
    """Declare a node's or a category's MIG layout; each GPU gets it once idle (or, with `now`, 409 while
    jobs hold GPUs it changes). The nodes' state after."""
    request.state.audit_target = (
        f"{'node ' + body.node if body.node else 'category ' + str(body.category)}: {body.layout}"
    )
    with tx(ctx) as db:
        return _out(service.declare(db, ctx.clock, body.layout, node=body.node, category=body.category, now=body.now))
