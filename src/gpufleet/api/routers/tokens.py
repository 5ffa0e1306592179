"""Token endpoints: join tokens for new nodes (admin only)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Request

from gpufleet.api.deps import Ctx, RowId, allow, tx
from gpufleet.auth import identity, users
from gpufleet.auth import service as auth
from gpufleet.auth.policy import Permission, allowed
from gpufleet.auth.schemas import (
    JoinTokenCreate,
    JoinTokenCreated,
    PasswordLogin,
    Principal,
    TokenOut,
    UserTokenCreate,
    UserTokenCreated,
)
from gpufleet.core import tls
from gpufleet.core.clock import to_datetime
from gpufleet.core.errors import Forbidden

router = APIRouter(prefix="/tokens", tags=["tokens"])
whoami_router = APIRouter(tags=["tokens"])
login_router = APIRouter(tags=["tokens"])


@login_router.post("/login", status_code=201)
def password_login(body: PasswordLogin, ctx: Ctx, request: Request) -> UserTokenCreated:
    """Trade a user name and password for an API token of that user (what `gpufleet login --user` does).

    Failed attempts are slowed down (429 with Retry-After) and audited like web logins.
    """
    request.state.audit_target = f"user {body.username}"
    source = request.client.host if request.client else ""
    password = body.password.get_secret_value()
    with tx(ctx, readonly=True) as db:  # argon2 is slow: never inside the write lock
        proven = identity.password_login(db, ctx.identity, ctx.throttle, body.username, password, source)
    username, note = proven.username, ctx.identity.note(proven)
    if note:
        request.state.audit_target = f"user {username} ({note})"
    with tx(ctx) as db:
        token, row = auth.create_user_token(db, ctx.clock, users.get_user(db, username), body.expires_in_s, body.scope)
        request.state.actor = f"user:{username}"  # before the block ends: the record is in this transaction
    return UserTokenCreated(token=token, id=row.id, expires_at=row.expires_at, scope=body.scope)


@whoami_router.get("/whoami")
def whoami(caller: Annotated[Principal, allow(Permission.SELF_READ)]) -> dict[str, object]:
    """Who the presented token belongs to (used by `gpufleet login` to check a token): its kind, and the
    role the caller acts with now (a user's token or session: the user's current role, not the kind of
    token), its scope and user."""
    return {
        "kind": caller.kind,
        "token_id": caller.token_id,
        "node_id": caller.node_id,
        "role": caller.role.value,
        "scope": caller.scope,
        "user": caller.user,
    }


@router.post("/join", status_code=201)
def create_join_token(
    body: JoinTokenCreate, _: Annotated[Principal, allow(Permission.TOKENS_WRITE)], ctx: Ctx, request: Request
) -> JoinTokenCreated:
    with tx(ctx) as db:
        token, row = auth.create_join_token(db, ctx.clock, body.expires_in_s, body.uses)
        request.state.audit_target = f"join token #{row.id} (uses {body.uses}, expires in {body.expires_in_s}s)"
    expires_at = row.expires_at or to_datetime(ctx.clock.now() + body.expires_in_s)
    return JoinTokenCreated(
        token=tls.pin_join_token(token, ctx.ca_fingerprint),
        id=row.id,
        expires_at=expires_at,
        uses=body.uses,
        ca_fingerprint=ctx.ca_fingerprint,
    )


@router.post("/user", status_code=201)
def create_user_token(
    body: UserTokenCreate, caller: Annotated[Principal, allow(Permission.TOKENS_OWN)], ctx: Ctx, request: Request
) -> UserTokenCreated:
    """An API token for a user: one's own, or anyone's with users:write."""
    if caller.user != body.user and not allowed(caller.role, Permission.USERS_WRITE, caller.scope):
        raise Forbidden("only admins create tokens for other users")
    with tx(ctx) as db:
        token, row = auth.create_user_token(db, ctx.clock, users.get_user(db, body.user), body.expires_in_s, body.scope)
        request.state.audit_target = f"token #{row.id} for user {body.user} (scope {body.scope})"
    return UserTokenCreated(token=token, id=row.id, expires_at=row.expires_at, scope=body.scope)


@router.delete("/{token_id}", status_code=204)
def revoke_token(token_id: RowId, caller: Annotated[Principal, allow(Permission.TOKENS_REVOKE)], ctx: Ctx) -> None:
    """Operators revoke join tokens (they create them); API tokens and sessions take users:write."""
    with tx(ctx) as db:
        auth.revoke_token(
            db, ctx.clock, token_id, join_only=not allowed(caller.role, Permission.USERS_WRITE, caller.scope)
        )


@router.get("")
def list_tokens(_: Annotated[Principal, allow(Permission.TOKENS_READ)], ctx: Ctx) -> list[TokenOut]:
    with tx(ctx, readonly=True) as db:
        tokens = auth.list_tokens(db)
        names = {u.id: u.username for u in users.list_users(db)}
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
            user=names.get(t.user_id) if t.user_id is not None else None,
            scope=t.scope,
        )
        for t in tokens
    ]
