"""The Tasks page: the slow actions over many nodes (bulk power, image sync, package installs, Ansible
runs), newest first with their progress, and one task's per-node results. It reads what
`GET /api/v1/tasks` and `GET /api/v1/tasks/{id}` return."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from gpufleet.api.dashboard.pages import View, render
from gpufleet.api.deps import Ctx, RowId
from gpufleet.auth.policy import Permission
from gpufleet.tasks import service as tasks
from gpufleet.tasks.schemas import TaskOut

router = APIRouter(include_in_schema=False)
SHOWN = 100


def tasks_view(view: View) -> dict[str, Any]:
    kind = view.query.get("kind") or None
    rows = tasks.list_tasks(view.session, kind=kind, limit=SHOWN)
    return {"tasks": [TaskOut.of(t) for t in rows], "query": view.query}


@router.get("/tasks", response_class=HTMLResponse)
def tasks_page(request: Request, ctx: Ctx) -> Response:
    return render(request, ctx, "tasks", Permission.NODES_READ, tasks_view)


@router.get("/tasks/{task_id}", response_class=HTMLResponse)
def task_page(task_id: RowId, request: Request, ctx: Ctx) -> Response:
    def data(view: View) -> dict[str, Any]:
        return {"task": TaskOut.of(tasks.get(view.session, task_id))}

    return render(request, ctx, "task", Permission.NODES_READ, data, nav="tasks", title=f"Task {task_id}")
