"""The Logs page: the events found in the nodes' logs (Xids, link faults, new log templates) and every
line the agents sent, filtered by node, time, severity, kind and words.

It reads with `logs.store.search`, the function `GET /api/v1/logs` uses, so the page and the CLI find
the same lines.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from gpufleet.api.dashboard.pages import INPUT_TIME, View, query_time, render
from gpufleet.api.deps import Ctx
from gpufleet.auth.policy import Permission
from gpufleet.core.errors import InvalidInput
from gpufleet.logs import store
from gpufleet.logs.classify import EVENT_KINDS
from gpufleet.logs.mining import NEW_TEMPLATE_KIND

router = APIRouter(include_in_schema=False)
SHOWN = 300
KINDS = (*EVENT_KINDS, NEW_TEMPLATE_KIND)


def logs_view(view: View) -> dict[str, Any]:
    query = view.query
    since, until = query_time(query, "since"), query_time(query, "until")
    if since is not None and until is not None and until < since:
        raise InvalidInput("until is before since")
    severity = query.get("severity")
    if severity is not None and severity not in store.SEVERITIES:
        raise InvalidInput(f"severity must be one of {', '.join(store.SEVERITIES)}")
    for key, most in (("node", 64), ("kind", 32), ("q", 256)):
        if len(query.get(key, "")) > most:
            raise InvalidInput(f"{key} is at most {most} characters")
    every_line = query.get("lines") == "all"
    found = store.search(
        view.session,
        node=query.get("node"),
        since=since.timestamp() if since else None,
        until=until.timestamp() if until else None,
        min_severity=severity,
        kind=query.get("kind"),
        events_only=not every_line,
        text_query=query.get("q"),
        limit=SHOWN,
    )
    return {
        "records": [(f, datetime.fromtimestamp(f.record.ts, UTC)) for f in found],
        "every_line": every_line,
        "shown": SHOWN,
        "query": query,
        "kinds": KINDS,
        "severities": store.SEVERITIES,
        "since": since.strftime(INPUT_TIME) if since else "",
        "until": until.strftime(INPUT_TIME) if until else "",
    }


@router.get("/logs", response_class=HTMLResponse)
def logs_page(request: Request, ctx: Ctx) -> Response:
    return render(request, ctx, "logs", Permission.NODES_READ, logs_view)
