"""The agent rollout: install, configure and start the agent on nodes over SSH, as an Ansible run
(see docs/deploy-agents.md)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from gpufleet.api.deps import Ctx, allow, tx
from gpufleet.auth.policy import Permission
from gpufleet.auth.schemas import Principal
from gpufleet.deploy import units
from gpufleet.provisioning import agent_deploy, ansible
from gpufleet.tasks.schemas import TaskOut

router = APIRouter(prefix="/agent-deploys", tags=["ansible"])
# Installing an agent runs a playbook as root on the nodes and mints a join token: admins only.
Deploy = Annotated[Principal, allow(Permission.ANSIBLE_RUN)]


class DeployIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    nodes: str = Field(max_length=4096, description="the nodes (a hostlist), reached as the Ansible inventory says")
    server: str = Field(max_length=512, description="the head's URL as the nodes reach it")
    ssh_user: str | None = Field(None, max_length=32, description="the SSH user (default: Ansible's)")
    become: bool | None = Field(None, description="become root with sudo (default: when ssh_user is not root)")
    join_token: str | None = Field(
        None, max_length=256, description="the join token the agents use (default: one minted, a use per node)"
    )
    zipapp: str | None = Field(
        None, max_length=1024, description="the agent's zipapp on the head (default: data_dir/agent/)"
    )
    python: str = Field(units.DEFAULT_PYTHON, max_length=1024, description="the nodes' Python for the zipapp")
    start: Literal["systemd", "detached", "none"] = Field("systemd", description="how the agent is started")
    root: str | None = Field(
        None, max_length=1024, description="install under this directory instead of / ({node}: the node's name)"
    )
    wait_s: float = Field(60.0, ge=0, le=600, description="how long each agent may take to join")
    token_expires_s: int = Field(agent_deploy.TOKEN_EXPIRES_S, ge=60, le=7 * 86400)

    def request(self) -> agent_deploy.DeployRequest:
        return agent_deploy.DeployRequest(**(self.model_dump() | {"start": agent_deploy.Start(self.start)}))


class DeployPlanOut(BaseModel):
    """What a rollout would do: its hosts, the command, and the first host's unit and control spec."""

    hosts: list[str]
    argv: list[str]
    zipapp: str
    unit: str
    spec: dict[str, object]


def _target(deploy: agent_deploy.DeployPlan) -> str:
    return f"agent {deploy.zipapp.name} ({deploy.request.start.value}) on nodes {deploy.params()['hosts']}"


def _plan(body: DeployIn, ctx: Ctx) -> agent_deploy.DeployPlan:
    with tx(ctx, readonly=True) as db:
        return agent_deploy.plan(
            db,
            body.request(),
            agent_deploy.default_zipapp(ctx.settings.data_dir),
            allow_local=ctx.settings.ansible_local_connection,
        )


@router.post("/plans")
def plan_deploy(body: DeployIn, request: Request, _: Deploy, ctx: Ctx) -> DeployPlanOut:
    """Check a rollout and say what it would do (the CLI's --dry-run); starts nothing, mints no token."""
    deploy = _plan(body, ctx)
    request.state.audit_target = f"dry run: {_target(deploy)}"
    first = deploy.hosts[0]
    return DeployPlanOut(
        hosts=deploy.hosts,
        argv=deploy.run.argv(),
        zipapp=str(deploy.zipapp),
        unit=deploy.unit(first).render("gpufleet node deploy-agent"),
        spec=deploy.spec(first),
    )


@router.post("", status_code=202)
def start_deploy(body: DeployIn, request: Request, who: Deploy, ctx: Ctx) -> TaskOut:
    """Install the agent on the nodes, as a task with one target per node. Everything that can refuse it
    does so before the task (and the join token) is recorded."""
    ansible.playbook_program()  # 503 on a head without Ansible
    deploy = _plan(body, ctx)
    with tx(ctx) as db:
        task, token = agent_deploy.create(db, ctx.clock, deploy, who.actor, ctx.ca_fingerprint)
        out = TaskOut.of(task)
        request.state.audit_target = f"task {out.id}: {_target(deploy)}"
    ctx.tasks.start(out.id, agent_deploy.work(deploy, token, ansible.RunnerSettings.of(ctx.settings)), out.params)
    return out
