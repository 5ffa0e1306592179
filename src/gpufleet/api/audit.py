"""Audit: one record for every mutating request and every login attempt.

Who acted comes from `request.state.actor` (set where the caller is authenticated: `api.deps`, the
join and login routes); what was touched from `request.state.audit_target` when the target lives in
the body (node names, a token id), else from the path and query.

A change that succeeds is recorded in its own transaction (`record_in`, called by `api.deps.tx` just
before the commit), with the success status its route declares (`status_code=`): the change and its
record are committed together or not at all, and a submission costs one commit, not two. A request
that changed nothing (refused, failed, rolled back), a route that declares no status (a redirect) and
one whose final status is not the one recorded with its change (it failed after committing) are
recorded by the middleware once the response is complete, with its status, so refused and failed
attempts are on record too.
"""

from __future__ import annotations

import asyncio
import logging
from contextvars import ContextVar
from typing import Any

from sqlalchemy.orm import Session
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpufleet.auth import audit
from gpufleet.core.clock import Clock
from gpufleet.core.db import transaction

log = logging.getLogger(__name__)
MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# Calls to inference services through the head's proxy change nothing in the cluster: they are a
# model's traffic (a POST per embedding), and a write per call would make the audit log their access log.
UNAUDITED_PREFIXES = ("/services/",)
# The mutating request being served, for `record_in`: set by the middleware, read in the route's thread
# (Starlette copies the context into the threads that run blocking handlers).
_audited: ContextVar[Scope | None] = ContextVar("audited", default=None)
WRITTEN = "audit_written"  # in the request's state: the status recorded with the change, once committed


def _action(scope: Scope) -> str:
    endpoint: Any = scope.get("endpoint")
    if endpoint is None:
        return f"{scope['method']} {scope['path']}"
    module = str(getattr(endpoint, "__module__", "")).rsplit(".", 1)[-1]
    return f"{module}.{getattr(endpoint, '__name__', 'unknown')}"


def _target(scope: Scope) -> str:
    state: dict[str, Any] = scope.setdefault("state", {})
    query = scope.get("query_string", b"").decode(errors="replace")
    return str(state.get("audit_target") or (scope["path"] + (f"?{query}" if query else "")))


def _source(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else ""


def record_in(session: Session, clock: Clock) -> int | None:
    """Add the current request's record to `session`, the transaction of the change it made, unless
    one was already committed. Returns the status recorded, for `committed` once the commit succeeded;
    None outside a mutating request."""
    scope = _audited.get()
    # Only a route that declares its success status (`status_code=`) knows it before answering; one that
    # answers a redirect or picks its status is recorded by the middleware, once it has answered.
    status = getattr(scope.get("route"), "status_code", None) if scope is not None else None
    if scope is None or status is None or scope.setdefault("state", {}).get(WRITTEN) is not None:
        return None
    audit.record(
        session,
        clock,
        actor=str(scope["state"].get("actor", "anonymous")),
        action=_action(scope),
        target=_target(scope),
        source=_source(scope),
        result=int(status),
    )
    return int(status)


def committed(status: int | None) -> None:
    """The transaction that `record_in` wrote to has committed: the middleware must not record again."""
    scope = _audited.get()
    if status is not None and scope is not None:
        scope.setdefault("state", {})[WRITTEN] = status


class AuditMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] not in MUTATING
            or str(scope["path"]).startswith(UNAUDITED_PREFIXES)
        ):
            await self.app(scope, receive, send)
            return
        status = 500

        async def tracking_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        token = _audited.set(scope)
        try:
            await self.app(scope, receive, tracking_send)
        finally:
            _audited.reset(token)
            if scope.setdefault("state", {}).get(WRITTEN) != status:
                await self._write(scope, status)

    async def _write(self, scope: Scope, status: int) -> None:
        state: dict[str, Any] = scope.setdefault("state", {})
        ctx = scope["app"].state.ctx

        def write() -> None:
            with transaction(ctx.sessions) as session:
                audit.record(
                    session,
                    ctx.clock,
                    actor=str(state.get("actor", "anonymous")),
                    action=_action(scope),
                    target=_target(scope),
                    source=_source(scope),
                    result=status,
                )

        try:
            await asyncio.to_thread(write)
        except Exception:
            # The response is already sent; losing the record must be loud, not fatal.
            log.exception("could not write the audit record for %s %s", scope["method"], scope["path"])
