"""Slurm accounts: gpufleet's projects synced to Slurm's accounts, associations and GPU limits (slurmdbd)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, Field

from gpufleet.api.deps import Ctx, allow, tx
from gpufleet.auth.policy import Permission
from gpufleet.auth.schemas import Principal
from gpufleet.core.config import Settings
from gpufleet.core.errors import Conflict
from gpufleet.jobs.slurm.accounts import Outcome, SlurmAccountSync, SyncResult, desired_accounts
from gpufleet.jobs.slurm.commands import SlurmCommands

router = APIRouter(prefix="/slurm/accounts", tags=["slurm"])
Write = Annotated[Principal, allow(Permission.PROJECTS_WRITE)]


class AccountStepOut(BaseModel):
    action: str = Field(description="add-account, set-gpu-limit, add-user, set-default-account, remove-user, ...")
    account: str
    user: str | None
    argv: list[str] = Field(description="the sacctmgr command, as run (no shell)")
    why: str
    status: str = Field(description="planned (dry run), done, unchanged, failed or not run")
    error: str | None = None


class AccountSyncOut(BaseModel):
    cluster: str
    dry_run: bool
    steps: list[AccountStepOut]
    notes: list[str] = Field(description="accounts left alone, and why")
    warnings: list[str] = Field(description="Slurm settings that keep GPU quotas from working")
    failed: int = Field(description="steps that failed or did not run; running the sync again retries them")


def slurm_commands(settings: Settings) -> SlurmCommands:
    """Slurm's programs for the configured cluster. Raises Conflict when gpufleet does not drive Slurm."""
    if settings.workload_manager != "slurm":
        raise Conflict(f"Slurm accounts need workload_manager = 'slurm' (this head uses {settings.workload_manager!r})")
    conf = str(settings.slurm_conf) if settings.slurm_conf is not None else None
    return SlurmCommands(conf, timeout_s=settings.slurm_timeout_s)


def _step(outcome: Outcome) -> AccountStepOut:
    step = outcome.step
    return AccountStepOut(
        action=step.action,
        account=step.account,
        user=step.user,
        argv=list(step.argv),
        why=step.why,
        status=outcome.status,
        error=outcome.error,
    )


def _out(result: SyncResult, dry_run: bool) -> AccountSyncOut:
    return AccountSyncOut(
        cluster=result.plan.cluster,
        dry_run=dry_run,
        steps=[_step(o) for o in result.outcomes],
        notes=list(result.plan.notes),
        warnings=list(result.plan.warnings),
        failed=result.failed,
    )


@router.post("/sync")
def sync_accounts(
    request: Request,
    _: Write,
    ctx: Ctx,
    dry_run: Annotated[bool, Query(description="only show the sacctmgr commands a sync would run")] = False,
) -> AccountSyncOut:
    """Make Slurm's accounts match gpufleet's projects: one account per project, an association per
    member, `GrpTRES=gres/gpu=N` per GPU quota. Accounts gpufleet did not make are left alone. Without
    slurmdbd the answer is 409, saying the accounts part is off."""
    commands = slurm_commands(ctx.settings)
    with tx(ctx, readonly=True) as db:
        desired = desired_accounts(db)
    # Slurm's commands run outside the transaction: they may take seconds, and hold no database lock.
    result = SlurmAccountSync(commands).sync(desired, dry_run=dry_run)
    what = "would run" if dry_run else "ran"
    request.state.audit_target = (
        f"Slurm accounts of cluster {result.plan.cluster}: {what} {len(result.outcomes)} sacctmgr commands"
        + (f", {result.failed} failed" if result.failed else "")
    )
    return _out(result, dry_run)
