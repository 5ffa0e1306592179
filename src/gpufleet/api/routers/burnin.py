"""Burn-in: start and cancel runs on nodes, read their results, the fleet's figures per step, the profiles."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request

from gpufleet.api.deps import Ctx, RowId, allow, tx
from gpufleet.auth.policy import Permission
from gpufleet.auth.schemas import Principal
from gpufleet.core.errors import NotFound
from gpufleet.inventory import service as inventory
from gpufleet.lifecycle import burnin, views
from gpufleet.lifecycle.profiles import BUILTIN_DIR, get_profile, load_profiles
from gpufleet.lifecycle.schemas import BurnInCreate, BurnInOut, ProfileOut, ProfilesOut

router = APIRouter(tags=["burn-in"])


@router.post("/burn-ins", status_code=201)
def start_burnin(
    body: BurnInCreate, caller: Annotated[Principal, allow(Permission.NODES_WRITE)], ctx: Ctx, request: Request
) -> list[BurnInOut]:
    """Hold these nodes out of service and run the profile on them, as one batch (pair steps pair within
    it). All or nothing: an unknown node or profile, or a node with a run already, starts none."""
    request.state.audit_target = f"{','.join(body.nodes)}: {body.profile}"
    settings = ctx.settings
    profile = get_profile(body.profile, burnin.profile_dirs(settings.data_dir, settings.burnin_profiles_dir))
    with tx(ctx) as db:
        names = inventory.expand_names(body.nodes)
        nodes = inventory.list_nodes(db, body.nodes)
        missing = sorted(set(names) - {n.name for n in nodes})
        if missing:
            raise NotFound(f"no such node: {', '.join(missing[:20])}")
        runs = burnin.start(
            db, ctx.clock, ctx.monitoring.judge.workload, nodes, profile, caller.actor, resume_on_pass=body.resume
        )
        return [BurnInOut.of(r) for r in runs]


@router.get("/burn-ins")
def list_burnins(
    _: Annotated[Principal, allow(Permission.NODES_READ)],
    ctx: Ctx,
    node: Annotated[str | None, Query(max_length=64)] = None,
    state: Annotated[str | None, Query(pattern="^(queued|running|passed|failed|cancelled)$")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> list[views.RunSummary]:
    """Runs, newest first."""
    with tx(ctx, readonly=True) as db:
        return views.list_runs(db, node=node, state=state, limit=limit)


@router.get("/burn-ins/fleet")
def fleet(
    _: Annotated[Principal, allow(Permission.NODES_READ)],
    ctx: Ctx,
    step: Annotated[str | None, Query(max_length=64)] = None,
) -> list[views.Metric]:
    """Each step's latest value on every node, per GPU model, worst first, with the nodes that lie far
    from the fleet's median (outliers) whatever the thresholds say."""
    with tx(ctx, readonly=True) as db:
        return views.fleet_metrics(db, step=step)


@router.get("/burn-ins/held")
def held(_: Annotated[Principal, allow(Permission.NODES_READ)], ctx: Ctx) -> list[views.HeldNode]:
    """Nodes a workflow holds out of service (burn-in, a failed burn-in, maintenance), with why."""
    with tx(ctx, readonly=True) as db:
        return views.held_nodes(db)


@router.get("/burn-ins/{run_id}")
def get_burnin(run_id: RowId, _: Annotated[Principal, allow(Permission.NODES_READ)], ctx: Ctx) -> BurnInOut:
    with tx(ctx, readonly=True) as db:
        return BurnInOut.of(burnin.get_run(db, run_id))


@router.post("/burn-ins/{run_id}/cancel")
def cancel_burnin(run_id: RowId, caller: Annotated[Principal, allow(Permission.NODES_WRITE)], ctx: Ctx) -> BurnInOut:
    """Stop a run; its node stays drained (as a person's drain) until someone resumes it."""
    with tx(ctx) as db:
        return BurnInOut.of(burnin.cancel(db, ctx.clock, ctx.monitoring.judge.workload, run_id, caller.actor))


@router.get("/burn-in-profiles")
def list_profiles(_: Annotated[Principal, allow(Permission.NODES_READ)], ctx: Ctx) -> ProfilesOut:
    """The built-in profiles and the admins' (`burnin_profiles_dir`), with every file that failed to load."""
    settings = ctx.settings
    profiles, problems = load_profiles(burnin.profile_dirs(settings.data_dir, settings.burnin_profiles_dir))
    return ProfilesOut(
        profiles=[ProfileOut.of(p, str(BUILTIN_DIR)) for _, p in sorted(profiles.items())], problems=problems
    )
