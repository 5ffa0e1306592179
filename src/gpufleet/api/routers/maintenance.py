"""Maintenance campaigns: create (or plan), list, show with each node's progress, pause, resume, cancel.

A campaign is recorded here and carried out by the leader's pass (workers.campaign_loops); see
lifecycle.campaigns for the policy. Creating one needs maintenance:write and, for each kind of action
in it, the permission that action needs on its own (images:write to sync, power:write to reboot,
ansible:run for packages and playbooks, nodes:write for burn-in): a campaign does nothing its creator
could not do by hand.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request

from gpufleet.api.deps import Ctx, PermissionCheck, allow, tx
from gpufleet.auth.policy import Permission
from gpufleet.auth.schemas import Principal
from gpufleet.lifecycle import campaigns
from gpufleet.lifecycle.campaign_schemas import CampaignDetailOut, CampaignIn, CampaignOut, CampaignPlanOut

router = APIRouter(prefix="/maintenance", tags=["maintenance"])
Read = Annotated[Principal, allow(Permission.NODES_READ)]
Write = Annotated[Principal, allow(Permission.MAINTENANCE_WRITE)]
# The dry run needs what creating needs (it answers the refusals create would give), so a read-scope token,
# which can never hold maintenance:write, is refused it like any write.
DryRun = Write
# What each kind of action needs beyond maintenance:write.
ACTION_PERMISSIONS = {
    "sync-image": Permission.IMAGES_WRITE,
    "packages": Permission.ANSIBLE_RUN,
    "ansible": Permission.ANSIBLE_RUN,
    "reboot": Permission.POWER_WRITE,
    "power-cycle": Permission.POWER_WRITE,
    "burn-in": Permission.NODES_WRITE,
}


def _check_actions(request: Request, who: Principal, body: CampaignIn) -> None:
    """Forbidden unless the caller may do every kind of action the campaign names (unknown kinds are
    refused with the syntax later, by the campaign's own checks)."""
    for text in body.actions:
        permission = ACTION_PERMISSIONS.get(text.strip().partition(":")[0])
        if permission is not None:
            PermissionCheck(permission).check(request, who)


@router.post("/plans")
def plan_campaign(body: CampaignIn, request: Request, who: DryRun, ctx: Ctx) -> CampaignPlanOut:
    """What a campaign would do (the CLI's --dry-run): refused exactly as creating it would be, and
    otherwise its nodes in order, its canary and its limit in nodes. Nothing is recorded."""
    request.state.audit_target = f"dry run: campaign {body.name}"
    _check_actions(request, who, body)
    with tx(ctx, readonly=True) as db:
        return campaigns.plan(db, ctx.settings, body).out()


@router.post("/campaigns", status_code=201)
def create_campaign(body: CampaignIn, request: Request, who: Write, ctx: Ctx) -> CampaignDetailOut:
    """Record a campaign; the leader's pass starts it at once. All or nothing: an unknown node,
    category, image or profile, a bad action or policy, or a node in another campaign records nothing."""
    where = f"nodes {body.nodes}" if body.nodes is not None else f"category {body.category}"
    request.state.audit_target = f"campaign {body.name} on {where}: {' '.join(body.actions)}"[:400]
    _check_actions(request, who, body)
    with tx(ctx) as db:
        campaigns.create(db, ctx.clock, ctx.settings, body, who.actor)
        return campaigns.detail_out(db, body.name)


@router.get("/campaigns")
def list_campaigns(_: Read, ctx: Ctx, limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> list[CampaignOut]:
    """Campaigns, newest first, with their nodes counted per phase."""
    with tx(ctx, readonly=True) as db:
        return campaigns.list_out(db, limit)


@router.get("/campaigns/{name}")
def show_campaign(name: str, _: Read, ctx: Ctx) -> CampaignDetailOut:
    """One campaign and each node's progress, in the order the campaign takes them."""
    with tx(ctx, readonly=True) as db:
        return campaigns.detail_out(db, name)


@router.post("/campaigns/{name}/pause")
def pause_campaign(name: str, request: Request, who: Write, ctx: Ctx) -> CampaignDetailOut:
    """Take no new node: nodes waiting for their jobs are given back, nodes being acted on finish."""
    request.state.audit_target = f"campaign {name}"
    with tx(ctx) as db:
        campaigns.pause(db, ctx.clock, name, who.actor)
        return campaigns.detail_out(db, name)


@router.post("/campaigns/{name}/resume")
def resume_campaign(name: str, request: Request, who: Write, ctx: Ctx) -> CampaignDetailOut:
    """Go on after a pause or a stop; failed nodes are tried again and the failure count starts anew."""
    request.state.audit_target = f"campaign {name}"
    with tx(ctx) as db:
        campaigns.resume(db, ctx.clock, name, who.actor)
        return campaigns.detail_out(db, name)


@router.post("/campaigns/{name}/cancel")
def cancel_campaign(name: str, request: Request, who: Write, ctx: Ctx) -> CampaignDetailOut:
    """End the campaign: nodes not started are skipped, failed ones given back to people (drained, with
    why), waiting ones given back; nodes being acted on finish first."""
    request.state.audit_target = f"campaign {name}"
    with tx(ctx) as db:
        campaigns.cancel(db, ctx.clock, ctx.monitoring.judge.workload, name, who.actor)
        return campaigns.detail_out(db, name)
