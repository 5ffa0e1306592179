"""Dependencies: the request's transaction and who is calling. Authorization is decided here, once."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Annotated, Any

from fastapi import Depends, Request
from sqlalchemy.orm import Session

from gpufleet.api.context import HeadContext
from gpufleet.auth import service as auth
from gpufleet.auth.policy import Permission, allowed
from gpufleet.auth.schemas import Principal
from gpufleet.core.db import transaction
from gpufleet.core.errors import Forbidden, Unauthorized

SESSION_COOKIE = "gpufleet_token"


def context(request: Request) -> HeadContext:
    ctx: HeadContext = request.app.state.ctx
    return ctx


Ctx = Annotated[HeadContext, Depends(context)]


def tx(ctx: HeadContext, *, readonly: bool = False) -> AbstractContextManager[Session]:
    """The route's unit of work. Routes open it in their own body, not as a `yield` dependency: a
    dependency's commit runs in another worker thread, and with every worker busy waiting for the
    SQLite write lock, the holder could never get one to commit and release it."""
    return transaction(ctx.sessions, readonly=readonly)


def bearer_token(authorization: str | None) -> str:
    """The token from an `Authorization: Bearer ...` header. Raises Unauthorized if absent or malformed."""
    if not authorization:
        raise Unauthorized("missing bearer token")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("expected 'Authorization: Bearer <token>'")
    return token.strip()


def authenticate(ctx: HeadContext, token: str) -> Principal:
    """Who presents `token`: a read; the rare write that records the use goes in its own transaction."""
    with transaction(ctx.sessions, readonly=True) as session:
        who = auth.authenticate(session, ctx.clock, token)
    if who.use_unrecorded:
        with transaction(ctx.sessions) as session:
            auth.record_use(session, ctx.clock, who)
    return who


def principal(request: Request, ctx: Ctx) -> Principal:
    who = authenticate(ctx, bearer_token(request.headers.get("authorization")))
    request.state.actor = who.actor  # for the audit record
    return who


Caller = Annotated[Principal, Depends(principal)]


class PermissionCheck:
    """A dependency that lets the caller through only if the policy table grants `permission`.

    Routes declare `_: Allowed[Permission.X]`-style parameters through `allow`; the route x role
    matrix test reads `permission` back from each route, so no route goes without a decision.
    """

    def __init__(self, permission: Permission) -> None:
        self.permission = permission

    def __call__(self, caller: Caller) -> Principal:
        if not allowed(caller.role, self.permission, caller.scope):
            who = f"a {caller.role}" + (" with a read-only token" if caller.scope == "read" else "")
            raise Forbidden(f"{who} may not do this ({self.permission})")
        return caller


def allow(permission: Permission) -> Any:
    """`Annotated[Principal, allow(Permission.NODES_READ)]`: authenticate, then check the policy."""
    return Depends(PermissionCheck(permission))
