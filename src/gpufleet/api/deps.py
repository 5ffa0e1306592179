"""Dependencies: the request's transaction and who is calling. Authorization is decided here, once."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session

from gpufleet.api.context import HeadContext
from gpufleet.auth import service as auth
from gpufleet.auth.models import TokenKind
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


def require_admin(caller: Caller) -> Principal:
    if caller.kind is not TokenKind.ADMIN:
        raise Forbidden("this endpoint needs an admin token")
    return caller


def require_node(caller: Caller) -> Principal:
    if caller.kind is not TokenKind.NODE or caller.node_id is None:
        raise Forbidden("this endpoint is for node agents")
    return caller


Admin = Annotated[Principal, Depends(require_admin)]
NodeCaller = Annotated[Principal, Depends(require_node)]
