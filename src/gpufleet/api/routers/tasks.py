"""Tasks: slow actions over many nodes, followed by id (GET /tasks/{id}) while they run."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from gpufleet.api.deps import Ctx, RowId, allow, tx
from gpufleet.auth.policy import Permission
from gpufleet.auth.schemas import Principal
from gpufleet.tasks import service as tasks
from gpufleet.tasks.schemas import TaskOut

router = APIRouter(tags=["tasks"])


@router.get("/tasks")
def list_tasks(
    _: Annotated[Principal, allow(Permission.NODES_READ)],
    ctx: Ctx,
    kind: Annotated[str | None, Query(max_length=64, description="power.on, or power. for every power task")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> list[TaskOut]:
    """The newest tasks first."""
    with tx(ctx, readonly=True) as db:
        return [TaskOut.of(t) for t in tasks.list_tasks(db, kind=kind, limit=limit)]


@router.get("/tasks/{task_id}")
def get_task(task_id: RowId, _: Annotated[Principal, allow(Permission.NODES_READ)], ctx: Ctx) -> TaskOut:
    """One task with every target's state and result."""
    with tx(ctx, readonly=True) as db:
        return TaskOut.of(tasks.get(db, task_id))
