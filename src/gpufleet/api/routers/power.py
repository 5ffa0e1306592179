"""Nodes' BMCs and their power: set a BMC (its password write-only), read power states, and power
actions over many nodes as tasks (see docs/power.md)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from sqlalchemy.orm import Session

from gpufleet.api.context import HeadContext
from gpufleet.api.deps import Ctx, allow, tx
from gpufleet.auth.policy import Permission
from gpufleet.auth.schemas import Principal
from gpufleet.core import hostlist
from gpufleet.core.credentials import CredentialBox, head_box
from gpufleet.core.errors import InvalidInput
from gpufleet.power import service as power
from gpufleet.power.schemas import BmcIn, BmcOut, NodePowerOut, PlanIn, PowerAction, PowerPlanOut, PowerRequest
from gpufleet.tasks.schemas import TaskOut

router = APIRouter(tags=["power"])
Read = Annotated[Principal, allow(Permission.POWER_READ)]
DryRun = Annotated[Principal, allow(Permission.POWER_READ, reads_only=True)]  # sends nothing, records nothing
Write = Annotated[Principal, allow(Permission.POWER_WRITE)]


def _box(ctx: HeadContext) -> CredentialBox:
    return head_box(ctx.settings)


def _connect(request: Request, settings: power.PowerSettings) -> power.Connect:
    """The real Redfish and IPMI clients; a test may put its own in `app.state.power_connect`."""
    custom: power.Connect | None = getattr(request.app.state, "power_connect", None)
    return custom or power.connector(settings)


@router.get("/nodes/{name}/bmc")
def get_bmc(name: str, _: Read, ctx: Ctx) -> BmcOut:
    """A node's BMC: how it is reached and the power state it reported last, never its password."""
    with tx(ctx, readonly=True) as db:
        return power.bmc_out(*power.get_bmc(db, name))


@router.put("/nodes/{name}/bmc")
def set_bmc(name: str, body: BmcIn, request: Request, _: Write, ctx: Ctx) -> BmcOut:
    """Set or replace a node's BMC. The password is stored encrypted and never returned."""
    # Redacted: an address with credentials in it is refused, but its audit record must not keep them.
    request.state.audit_target = f"{name}: {body.protocol} {power.redact_address(body.address)[:200]}"
    spec = power.BmcSpec(
        protocol=body.protocol,
        address=body.address,
        username=body.username,
        password=body.password.get_secret_value(),
        port=body.port,
        system_id=body.system_id,
        verify_tls=body.verify_tls,
    )
    box = _box(ctx)
    with tx(ctx) as db:
        power.set_bmc(db, ctx.clock, box, name, spec)
        return power.bmc_out(*power.get_bmc(db, name))


@router.delete("/nodes/{name}/bmc", status_code=204)
def remove_bmc(name: str, request: Request, _: Write, ctx: Ctx) -> Response:
    """Forget a node's BMC and its credentials."""
    request.state.audit_target = name
    with tx(ctx) as db:
        power.remove_bmc(db, name)
    return Response(status_code=204)


@router.get("/power")
def power_states(
    _: Read,
    ctx: Ctx,
    nodes: Annotated[str | None, Query(max_length=4096, description="a hostlist; default: every node")] = None,
) -> list[NodePowerOut]:
    """Every node's power state as its BMC last reported it (nothing is asked of the BMCs: POST
    /power/status reads them)."""
    with tx(ctx, readonly=True) as db:
        return power.power_table(db, [nodes] if nodes else None)


def _plan(db: Session, ctx: HeadContext, action: PowerAction, body: PowerRequest) -> power.PowerPlan:
    return power.plan(
        db,
        _box(ctx),
        power.power_settings(ctx.settings),
        action,
        [body.nodes],
        force=body.force,
        limit=body.limit,
        stagger_s=body.stagger_s,
    )


@router.post("/power/plans")
def plan_power(body: PlanIn, request: Request, _: DryRun, ctx: Ctx) -> PowerPlanOut:
    """What a power action would do (the CLI's --dry-run): refused exactly as the action would be,
    and otherwise every BMC's request, in order. Nothing is sent to a BMC."""
    request.state.audit_target = f"dry run: power {body.action.value} {body.nodes[:200]}"
    with tx(ctx, readonly=True) as db:
        found = _plan(db, ctx, body.action, body)
    return found.out(power.power_settings(ctx.settings))


def _start(request: Request, ctx: HeadContext, who: Principal, action: PowerAction, body: PowerRequest) -> TaskOut:
    settings = power.power_settings(ctx.settings)
    with tx(ctx) as db:
        found = _plan(db, ctx, action, body)
        out = TaskOut.of(power.create_task(db, ctx.clock, found, who.actor))
        forced = f" (forced over jobs on {hostlist.collect(sorted(found.forced))})" if found.forced else ""
        request.state.audit_target = f"task {out.id}: power {action.value} {hostlist.collect(found.nodes)}{forced}"
    work = power.work(
        found, sessions=ctx.sessions, clock=ctx.clock, settings=settings, connect=_connect(request, settings)
    )
    ctx.tasks.start(out.id, work, out.params)
    return out


@router.post("/power/status", status_code=202)
def read_power(body: PowerRequest, request: Request, who: Read, ctx: Ctx) -> TaskOut:
    """Ask the nodes' BMCs for their power state, as a task (one result per node); each state read
    is kept for GET /power."""
    return _start(request, ctx, who, PowerAction.STATUS, body)


@router.post("/power/{action}", status_code=202)
def power_action(action: str, body: PowerRequest, request: Request, who: Write, ctx: Ctx) -> TaskOut:
    """Power nodes on, off, cycle or reset them, as a task: at most `limit` BMCs at once, power-ons
    `stagger_s` apart, each node's result once its power state shows it done. Off, cycle and reset are
    refused (409) for nodes that run jobs unless `force` is set."""
    if action not in ("on", "off", "cycle", "reset"):
        raise InvalidInput("the power action is one of on, off, cycle, reset (status: POST /power/status)")
    return _start(request, ctx, who, PowerAction(action), body)
