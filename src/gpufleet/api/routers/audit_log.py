"""Reading the audit log (admin only). There are deliberately no routes that change it."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict

from gpufleet.api.deps import Ctx, allow, tx
from gpufleet.auth import audit
from gpufleet.auth.policy import Permission
from gpufleet.auth.schemas import Principal

router = APIRouter(prefix="/audit", tags=["audit"])


class AuditOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    at: datetime
    actor: str
    action: str
    target: str
    source: str
    result: int


@router.get("")
def list_audit(
    _: Annotated[Principal, allow(Permission.AUDIT_READ)],
    ctx: Ctx,
    since: Annotated[datetime | None, Query(description="only records at or after this time (ISO 8601)")] = None,
    until: Annotated[datetime | None, Query(description="only records at or before this time (ISO 8601)")] = None,
    actor: Annotated[str | None, Query(max_length=160)] = None,
    action: Annotated[str | None, Query(max_length=128, description="only actions containing this (any case)")] = None,
    offset: Annotated[int, Query(ge=0, le=10_000_000, description="skip this many matching records")] = 0,
    limit: Annotated[int, Query(ge=1, le=audit.MAX_LISTED)] = 1000,
) -> list[AuditOut]:
    with tx(ctx, readonly=True) as db:
        found = audit.list_records(db, since=since, until=until, actor=actor, action=action, offset=offset, limit=limit)
        return [AuditOut.model_validate(r) for r in found]
