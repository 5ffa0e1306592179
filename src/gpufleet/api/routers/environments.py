"""Runtime environments (jobs.environments): the catalog, and which nodes can run each.

Reading needs `jobs:read` (whoever sees the queue sees what jobs may run in); adding and removing need
`environments:write`. Changes are audited by the audit middleware with the environment as target.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Request

from gpufleet.api.deps import Ctx, allow, tx
from gpufleet.auth.policy import Permission
from gpufleet.auth.schemas import Principal
from gpufleet.jobs import environments
from gpufleet.jobs.environments import NodeFit
from gpufleet.jobs.models import Environment
from gpufleet.jobs.schemas import EnvironmentCheck, EnvironmentIn, EnvironmentOut, NodeFitOut

router = APIRouter(tags=["environments"])


def _out(env: Environment, fits: list[NodeFit]) -> EnvironmentOut:
    return EnvironmentOut.model_validate(env).model_copy(update={"compatible_nodes": environments.runnable(fits)})


@router.get("/environments")
def list_environments(_: Annotated[Principal, allow(Permission.JOBS_READ)], ctx: Ctx) -> list[EnvironmentOut]:
    """Every environment, with how many nodes have a driver that runs it."""
    with tx(ctx, readonly=True) as db:
        known = environments.fleet(db)
        return [_out(env, environments.check(known, env)) for env in environments.listing(db)]


@router.post("/environments", status_code=201)
def add_environment(
    body: EnvironmentIn,
    who: Annotated[Principal, allow(Permission.ENVIRONMENTS_WRITE)],
    ctx: Ctx,
    request: Request,
) -> EnvironmentOut:
    request.state.audit_target = f"environment {body.name}:{body.version}"
    with tx(ctx) as db:
        env = environments.add(db, ctx.clock, who.actor, body)
        return _out(env, environments.check(environments.fleet(db), env))


@router.get("/environments/{ref}")
def show_environment(ref: str, _: Annotated[Principal, allow(Permission.JOBS_READ)], ctx: Ctx) -> EnvironmentOut:
    """`name:version`, or `name` for the version added last."""
    with tx(ctx, readonly=True) as db:
        env = environments.get(db, ref)
        return _out(env, environments.check(environments.fleet(db), env))


@router.get("/environments/{ref}/check")
def check_environment(ref: str, _: Annotated[Principal, allow(Permission.JOBS_READ)], ctx: Ctx) -> EnvironmentCheck:
    """Every GPU node: whether its driver runs the environment, and why not."""
    with tx(ctx, readonly=True) as db:
        env = environments.get(db, ref)
        fits = environments.check(environments.fleet(db), env)
        return EnvironmentCheck(environment=_out(env, fits), nodes=[NodeFitOut(**vars(f)) for f in fits])


@router.delete("/environments/{ref}", status_code=204)
def remove_environment(
    ref: str, _: Annotated[Principal, allow(Permission.ENVIRONMENTS_WRITE)], ctx: Ctx, request: Request
) -> None:
    """One version (`name:version`). Queued jobs keep the image and driver they were given."""
    request.state.audit_target = f"environment {ref}"
    with tx(ctx) as db:
        environments.remove(db, ref)
