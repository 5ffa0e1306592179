"""Dependencies: the request's transaction and who is calling. Authorization is decided here, once."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Annotated, Any

from fastapi import Depends, Path, Request
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from gpufleet.api import audit
from gpufleet.api.context import HeadContext
from gpufleet.auth import service as auth
from gpufleet.auth.policy import Permission, allowed
from gpufleet.auth.schemas import Principal
from gpufleet.core import secrets
from gpufleet.core.clock import to_datetime
from gpufleet.core.db import transaction
from gpufleet.core.errors import Forbidden, Unauthorized

SESSION_COOKIE = "gpufleet_session"
CSRF_HEADER = "x-csrf-token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


async def context(request: Request) -> HeadContext:
    # async: a sync dependency costs a trip to the thread pool and back, and this one reads nothing
    ctx: HeadContext = request.app.state.ctx
    return ctx


Ctx = Annotated[HeadContext, Depends(context)]
# A row id in a path: a positive 64-bit integer, so a larger number is a 422, not a database overflow.
RowId = Annotated[int, Path(ge=1, le=2**63 - 1)]


@contextlib.contextmanager
def tx(ctx: HeadContext, *, readonly: bool = False) -> Iterator[Session]:
    """The route's unit of work. Routes open it in their own body, not as a `yield` dependency: a
    dependency's commit runs in another worker thread, and with every worker busy waiting for the
    SQLite write lock, the holder could never get one to commit and release it.

    A writing transaction of a mutating request carries that request's audit record (`api.audit`), so the
    change and its record cost one commit. A route that learns its audit target from the change (a new
    job's id) sets `request.state.audit_target` before its block ends."""
    with transaction(ctx.sessions, readonly=readonly) as session:
        yield session
        recorded = None if readonly else audit.record_in(session, ctx.clock)
    audit.committed(recorded)


def bearer_token(authorization: str | None) -> str:
    """The token from an `Authorization: Bearer ...` header. Raises Unauthorized if absent or malformed."""
    if not authorization:
        raise Unauthorized("missing bearer token")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("expected 'Authorization: Bearer <token>'")
    return token.strip()


def authenticate(ctx: HeadContext, token: str, *, web_session: bool = False) -> Principal:
    """Who presents `token`: a read; the rare write that records the use goes in its own transaction.
    An API token's answer is kept a moment for the next request (`auth.principal_cache`)."""
    generation = ctx.principals.generation
    with transaction(ctx.sessions, readonly=True) as session:
        who = auth.authenticate(session, ctx.clock, token, web_session=web_session)
    if who.use_unrecorded:  # its commit empties the cache, so this answer is not kept: the next one is
        with transaction(ctx.sessions) as session:
            auth.record_use(session, ctx.clock, who)
    if not web_session:
        ctx.principals.put(token, who, generation)
    return who


def session_principal(request: Request, ctx: HeadContext) -> Principal:
    """The logged-in browser's principal, from its session cookie. A request that changes something
    must also carry the session's CSRF token (form field or header), which another site cannot know.

    Raises Unauthorized without a valid session, Forbidden for a missing or wrong CSRF token.
    """
    secret = request.cookies.get(SESSION_COOKIE)
    if not secret:
        raise Unauthorized("not logged in")
    who = authenticate(ctx, secret, web_session=True)
    request.state.actor = who.actor  # a refused change is on record as this user's too
    if request.method not in SAFE_METHODS:
        presented = request.headers.get(CSRF_HEADER) or ""
        if not secrets.same(presented, auth.csrf_token(secret)):
            raise Forbidden("missing or wrong CSRF token")
    return who


async def principal(request: Request, ctx: Ctx) -> Principal:
    """The caller: a bearer token if one is presented, else the browser's session cookie. async: a token
    resolved a moment ago is answered from memory, without the trip to a request thread that a read takes."""
    authorization = request.headers.get("authorization")
    if authorization is None and SESSION_COOKIE in request.cookies:
        return await run_in_threadpool(session_principal, request, ctx)
    token = bearer_token(authorization)
    who = ctx.principals.get(token, to_datetime(ctx.clock.now()))
    if who is None:
        who = await run_in_threadpool(authenticate, ctx, token)
    request.state.actor = who.actor  # for the audit record
    return who


Caller = Annotated[Principal, Depends(principal)]


class PermissionCheck:
    """A dependency that lets the caller through only if the policy table grants `permission`.

    Routes declare `_: Allowed[Permission.X]`-style parameters through `allow`; the route x role
    matrix test reads `permission` back from each route, so no route goes without a decision.

    A token with scope `read` passes only safe methods (GET, HEAD, OPTIONS), whatever its permission
    allows, unless the route says it `reads_only`: a POST that changes nothing and contacts nothing
    (a dry run, a template rendered). Reading a permission such as `power:read` must not let a
    read-only token start a task or reach a BMC (POST /power/status does both).
    """

    def __init__(self, permission: Permission, *, reads_only: bool = False) -> None:
        self.permission = permission
        self.reads_only = reads_only

    async def __call__(self, request: Request, caller: Caller) -> Principal:
        # async: a sync dependency costs a trip to the thread pool and back, and this one reads nothing
        return self.check(request, caller)

    def check(self, request: Request, caller: Principal) -> Principal:
        """The decision, for a route that needs a further permission for some of its requests."""
        if not allowed(caller.role, self.permission, caller.scope):
            who = f"a {caller.role}" + (" with a read-only token" if caller.scope == "read" else "")
            raise Forbidden(f"{who} may not do this ({self.permission})")
        if caller.scope == "read" and request.method not in SAFE_METHODS and not self.reads_only:
            raise Forbidden(f"a read-only token may not {request.method} here: it acts (use a token with scope write)")
        return caller


def allow(permission: Permission, *, reads_only: bool = False) -> Any:
    """`Annotated[Principal, allow(Permission.NODES_READ)]`: authenticate, then check the policy.
    `reads_only` marks a POST that changes nothing, which a read-only token may call."""
    return Depends(PermissionCheck(permission, reads_only=reads_only))
