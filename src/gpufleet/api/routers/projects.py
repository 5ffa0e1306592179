"""Projects: members and GPU quotas."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter

from gpufleet.api.deps import Ctx, allow, tx
from gpufleet.auth import projects
from gpufleet.auth.policy import Permission
from gpufleet.auth.schemas import Principal, ProjectCreate, ProjectMemberChange, ProjectOut, ProjectQuota

router = APIRouter(prefix="/projects", tags=["projects"])
Read = Annotated[Principal, allow(Permission.PROJECTS_READ)]
Write = Annotated[Principal, allow(Permission.PROJECTS_WRITE)]


def _out(project: projects.Project) -> ProjectOut:
    return ProjectOut(
        name=project.name,
        description=project.description,
        members=sorted(m.user.username for m in project.members),
        max_gpus=project.max_gpus,
        gpu_hours_budget=project.gpu_hours_budget,
        budget_period=project.budget_period.value,
        created_at=project.created_at,
    )


@router.get("")
def list_projects(_: Read, ctx: Ctx) -> list[ProjectOut]:
    with tx(ctx, readonly=True) as db:
        return [_out(p) for p in projects.list_projects(db)]


@router.post("", status_code=201)
def create_project(body: ProjectCreate, _: Write, ctx: Ctx) -> ProjectOut:
    with tx(ctx) as db:
        return _out(projects.create_project(db, ctx.clock, body.name, body.description))


@router.get("/{name}")
def show_project(name: str, _: Read, ctx: Ctx) -> ProjectOut:
    with tx(ctx, readonly=True) as db:
        return _out(projects.get_project(db, name))


@router.delete("/{name}", status_code=204)
def delete_project(name: str, _: Write, ctx: Ctx) -> None:
    with tx(ctx) as db:
        projects.delete_project(db, name)


@router.post("/{name}/members")
def add_member(name: str, body: ProjectMemberChange, _: Write, ctx: Ctx) -> ProjectOut:
    with tx(ctx) as db:
        return _out(projects.add_member(db, ctx.clock, name, body.user))


@router.delete("/{name}/members/{user}")
def remove_member(name: str, user: str, _: Write, ctx: Ctx) -> ProjectOut:
    with tx(ctx) as db:
        return _out(projects.remove_member(db, name, user))


@router.put("/{name}/quota")
def set_quota(name: str, body: ProjectQuota, _: Write, ctx: Ctx) -> ProjectOut:
    period = projects.BudgetPeriod(body.budget_period) if body.budget_period else None
    with tx(ctx) as db:
        return _out(
            projects.set_quota(
                db, name, max_gpus=body.max_gpus, gpu_hours_budget=body.gpu_hours_budget, budget_period=period
            )
        )
