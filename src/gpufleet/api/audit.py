"""Audit middleware: one record for every mutating request and every login attempt, after the response.

Who acted comes from `request.state.actor` (set where the caller is authenticated: `api.deps`, the
join and login routes); what was touched from `request.state.audit_target` when the target lives in
the body (node names, a token id), else from the path and query. The record is written once the
response is complete, with its status, so refused and failed attempts are on record too.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpufleet.auth import audit
from gpufleet.core.db import transaction

log = logging.getLogger(__name__)
MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# Calls to inference services through the head's proxy change nothing in the cluster: they are a
# model's traffic (a POST per embedding), and a write per call would make the audit log their access log.
UNAUDITED_PREFIXES = ("/services/",)


def _action(scope: Scope) -> str:
    endpoint: Any = scope.get("endpoint")
    if endpoint is None:
        return f"{scope['method']} {scope['path']}"
    module = str(getattr(endpoint, "__module__", "")).rsplit(".", 1)[-1]
    return f"{module}.{getattr(endpoint, '__name__', 'unknown')}"


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

        try:
            await self.app(scope, receive, tracking_send)
        finally:
            await self._write(scope, status)

    async def _write(self, scope: Scope, status: int) -> None:
        state: dict[str, Any] = scope.setdefault("state", {})
        query = scope.get("query_string", b"").decode(errors="replace")
        target = state.get("audit_target") or (scope["path"] + (f"?{query}" if query else ""))
        client = scope.get("client")
        ctx = scope["app"].state.ctx

        def write() -> None:
            with transaction(ctx.sessions) as session:
                audit.record(
                    session,
                    ctx.clock,
                    actor=str(state.get("actor", "anonymous")),
                    action=_action(scope),
                    target=str(target),
                    source=client[0] if client else "",
                    result=status,
                )

        try:
            await asyncio.to_thread(write)
        except Exception:
            # The response is already sent; losing the record must be loud, not fatal.
            log.exception("could not write the audit record for %s %s", scope["method"], scope["path"])
