"""Token endpoints: join tokens for new nodes (admin only)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Request

from gpufleet.api.deps import Ctx, allow, tx
from gpufleet.auth import service as auth
from gpufleet.auth.policy import Permission
from gpufleet.auth.schemas import JoinTokenCreate, JoinTokenCreated, Principal, TokenOut
from gpufleet.core.clock import to_datetime

router = APIRouter(prefix="/tokens", tags=["tokens"])
whoami_router = APIRouter(tags=["tokens"])


@whoami_router.get("/whoami")
def whoami(caller: Annotated[Principal, allow(Permission.SELF_READ)]) -> dict[str, object]:
    """Who the presented token belongs to (used by `gpufleet login` to check a token)."""
    return {"kind": caller.kind, "token_id": caller.token_id, "node_id": caller.node_id}


@router.post("/join", status_code=201)
def create_join_token(
    body: JoinTokenCreate, _: Annotated[Principal, allow(Permission.TOKENS_WRITE)], ctx: Ctx, request: Request
) -> JoinTokenCreated:
    with tx(ctx) as db:
        token, row = auth.create_join_token(db, ctx.clock, body.expires_in_s, body.uses)
    request.state.audit_target = f"join token #{row.id} (uses {body.uses}, expires in {body.expires_in_s}s)"
    expires_at = row.expires_at or to_datetime(ctx.clock.now() + body.expires_in_s)
    return JoinTokenCreated(token=token, id=row.id, expires_at=expires_at, uses=body.uses)


@router.get("")
def list_tokens(_: Annotated[Principal, allow(Permission.TOKENS_READ)], ctx: Ctx) -> list[TokenOut]:
    with tx(ctx, readonly=True) as db:
        tokens = auth.list_tokens(db)
    return [
        TokenOut(
            id=t.id,
            kind=t.kind,
            name=t.name,
            created_at=t.created_at,
            expires_at=t.expires_at,
            revoked=t.revoked_at is not None,
            last_used_at=t.last_used_at,
            uses=t.uses,
            max_uses=t.max_uses,
        )
        for t in tokens
    ]
