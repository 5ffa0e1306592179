"""The directory: where users come from, each source's last sync and mapping problems; a sync on demand."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter

from gpufleet.api.deps import Ctx, allow, tx
from gpufleet.auth.policy import Permission
from gpufleet.auth.schemas import Principal
from gpufleet.core.errors import InvalidInput, Unavailable
from gpufleet.directory import views
from gpufleet.directory.schemas import DirectoryStatus, SyncOut
from gpufleet.directory.settings import mappings

router = APIRouter(prefix="/directory", tags=["directory"])
Read = Annotated[Principal, allow(Permission.USERS_READ)]
Write = Annotated[Principal, allow(Permission.USERS_WRITE)]


@router.get("")
def directory_status(_: Read, ctx: Ctx) -> DirectoryStatus:
    with tx(ctx, readonly=True) as db:
        return views.status(
            db,
            identity_provider=ctx.settings.identity_provider,
            sso=ctx.settings.oidc_issuer is not None,
            mappings=mappings(ctx.settings),
        )


@router.post("/sync")
def sync_now(_: Write, ctx: Ctx) -> SyncOut:
    """Read every directory user now, as the leader does every `ldap_sync_interval_s`."""
    if ctx.directory is None:
        raise InvalidInput("no directory is configured (identity_provider is local)")
    report = ctx.directory.sync_once()
    if report is None:
        raise Unavailable("the directory cannot be reached; see GET /api/v1/directory for the error")
    return SyncOut(
        users=report.users,
        created=report.created,
        changed=report.changed,
        disabled=report.disabled,
        problems=report.problems,
    )
