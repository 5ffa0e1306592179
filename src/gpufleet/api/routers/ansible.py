"""Ansible: the dynamic inventory, and playbooks run on nodes as tasks (see docs/ansible.md)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from gpufleet.api.deps import Ctx, allow, tx
from gpufleet.auth.policy import Permission
from gpufleet.auth.schemas import Principal
from gpufleet.provisioning import ansible
from gpufleet.tasks.schemas import TaskOut

router = APIRouter(prefix="/ansible", tags=["ansible"])
# The run's body carries the playbook (at most 1 MiB of text, up to twice that once JSON-escaped).
MAX_RUN_BYTES = 3 * ansible.PLAYBOOK_MAX_BYTES
Run = Annotated[Principal, allow(Permission.ANSIBLE_RUN)]


class RunIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    playbook: str = Field(description="the playbook file's text: a YAML list of plays")
    name: str = Field("playbook.yml", max_length=100, description="the playbook's file name, e.g. site.yml")
    category: str | None = Field(None, max_length=64, description="run on every node of this category")
    nodes: str | None = Field(None, max_length=4096, description="or on these nodes (a hostlist)")
    check: bool = Field(False, description="Ansible's check mode: report what would change, change nothing")
    extra_vars: dict[str, Any] = Field(
        default_factory=dict, max_length=64, description="variables for every play (ansible-playbook -e)"
    )

    def request(self) -> ansible.RunRequest:
        return ansible.RunRequest(**self.model_dump())


class PlanOut(BaseModel):
    """What a run would do: its hosts and the command ansible-runner would start."""

    playbook: str
    sha256: str
    plays: int
    hosts: list[str]
    argv: list[str]


@router.get("/inventory")
def inventory(
    _: Annotated[Principal, allow(Permission.NODES_READ)],
    ctx: Ctx,
    host: Annotated[str | None, Query(max_length=64, description="one host's variables only")] = None,
) -> dict[str, Any]:
    """Every node as Ansible's dynamic inventory (`--list`), or one host's variables (`--host`)."""
    with tx(ctx, readonly=True) as db:
        script = ansible.build_inventory(db, allow_local=ctx.settings.ansible_local_connection)
    return script if host is None else ansible.host_of(script, host)


def _target(plan: ansible.RunPlan) -> str:
    where = f"category {plan.request.category}" if plan.request.category else "nodes"
    check = " in check mode" if plan.request.check else ""
    return f"{plan.request.name} (sha256 {plan.digest[:12]}){check} on {where} {plan.params()['hosts']}"


@router.post("/plans")
def plan_run(body: RunIn, request: Request, _: Run, ctx: Ctx) -> PlanOut:
    """Check a run and say what it would do (the CLI's --dry-run); starts nothing."""
    with tx(ctx, readonly=True) as db:
        plan = ansible.plan_run(db, body.request(), allow_local=ctx.settings.ansible_local_connection)
    request.state.audit_target = f"dry run: {_target(plan)}"
    return PlanOut(playbook=plan.request.name, sha256=plan.digest, plays=plan.plays, hosts=plan.hosts, argv=plan.argv())


@router.post("/runs", status_code=202)
def start_run(body: RunIn, request: Request, who: Run, ctx: Ctx) -> TaskOut:
    """Run a playbook on a category's nodes or a node list, as a task with one target per host.
    Everything that can refuse it does so here, before the task is recorded."""
    ansible.playbook_program()  # 503 on a head without Ansible, before anything is recorded
    with tx(ctx) as db:
        plan = ansible.plan_run(db, body.request(), allow_local=ctx.settings.ansible_local_connection)
        task = ansible.create_run(db, ctx.clock, plan, created_by=who.actor)
        out = TaskOut.of(task)
        request.state.audit_target = f"task {out.id}: {_target(plan)}"
    ctx.tasks.start(out.id, ansible.work(plan, ansible.RunnerSettings.of(ctx.settings)), out.params)
    return out
