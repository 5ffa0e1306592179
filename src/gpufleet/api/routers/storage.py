"""The shared file systems as every node sees them: GET /api/v1/storage."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from gpufleet.api.deps import Ctx, allow, tx
from gpufleet.auth.policy import Permission
from gpufleet.auth.schemas import Principal
from gpufleet.monitoring.storage import fleet_of_replica
from gpufleet.monitoring.storage_schemas import FileSystemOut

router = APIRouter(tags=["storage"])


@router.get("/storage")
def list_storage(
    _: Annotated[Principal, allow(Permission.NODES_READ)],
    ctx: Ctx,
    status: Annotated[
        str | None, Query(description="only file systems in this status: ok, slow, degraded, down")
    ] = None,
) -> list[FileSystemOut]:
    """Each shared file system, each node's view of it (state, time per operation, fill) and a verdict that
    tells trouble on some nodes from trouble everywhere. From the nodes whose channels this replica holds."""
    judge = ctx.monitoring.judge
    with tx(ctx, readonly=True) as db:
        systems = [FileSystemOut.of(fs) for fs in fleet_of_replica(db, judge.tracker, judge.storage)]
    return [fs for fs in systems if status is None or fs.status == status]
