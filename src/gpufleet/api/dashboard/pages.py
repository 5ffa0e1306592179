"""How a dashboard page is rendered: one template, its live part re-fetched by htmx.

Every page is a template `<name>.html` that extends `layout.html` and includes its live fragment,
`fragments/<name>.html`, whose root element re-fetches the page's own URL every `REFRESH_S`. A
request htmx makes (`HX-Request`) gets the fragment alone, so a page stays live without a reload,
and a filter form can swap the fragment with new query parameters and push them into the address
bar. The live element has `hx-sync="this:queue last"`: the refresh an action triggers waits for a
poll still in flight and then runs (htmx would drop it by default, and the poll's older answer would
show the state from before the action for another 5 s; replacing the poll would abort it, which htmx
reports as an error). Pages need a logged-in browser (api.routers.web_login); without
one a page redirects to the login form and a fragment tells htmx to (`HX-Redirect`).

Nothing here changes anything: buttons on the pages call the REST API (static/app.js adds the
session's CSRF token), so a change made from the dashboard is checked, refused and audited exactly
as one made with the CLI.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from fastapi import Request
from fastapi.responses import RedirectResponse, Response
from sqlalchemy.orm import Session

from gpufleet.api.context import HeadContext
from gpufleet.api.deps import SESSION_COOKIE, session_principal, tx
from gpufleet.api.templates import TEMPLATES
from gpufleet.auth import service as auth
from gpufleet.auth.policy import Permission, allowed
from gpufleet.auth.schemas import Principal
from gpufleet.core.errors import GpufleetError, InvalidInput

INPUT_TIME = "%Y-%m-%dT%H:%M:%S"  # what a datetime-local field shows (no zone: pages are in UTC)
REFRESH_S = 5  # how often a page's live part is fetched again (the issue allows at most 5 s)


@dataclass(frozen=True)
class NavItem:
    key: str
    title: str
    path: str
    permission: Permission


# The pages in the top bar, in order; a page the user may not read is not shown.
NAV: tuple[NavItem, ...] = (
    NavItem("overview", "Overview", "/", Permission.NODES_READ),
    NavItem("nodes", "Nodes", "/nodes", Permission.NODES_READ),
    NavItem("gpus", "GPU map", "/gpus", Permission.NODES_READ),
    NavItem("categories", "Categories", "/categories", Permission.NODES_READ),
    NavItem("jobs", "Jobs", "/jobs", Permission.JOBS_READ),
    NavItem("environments", "Environments", "/environments", Permission.JOBS_READ),
    NavItem("models", "Models", "/models", Permission.JOBS_READ),
    NavItem("datasets", "Datasets", "/datasets", Permission.JOBS_READ),
    NavItem("services", "Services", "/services", Permission.JOBS_READ),
    NavItem("alerts", "Alerts", "/alerts", Permission.ALERTS_READ),
    NavItem("logs", "Logs", "/logs", Permission.NODES_READ),
    NavItem("software", "Software", "/software", Permission.ASSETS_READ),
    NavItem("images", "Images", "/images", Permission.IMAGES_READ),
    NavItem("power", "Power", "/power", Permission.POWER_READ),
    NavItem("switches", "Network", "/switches", Permission.NODES_READ),
    NavItem("storage", "Storage", "/storage", Permission.NODES_READ),
    NavItem("burn-in", "Burn-in", "/burn-in", Permission.NODES_READ),
    NavItem("maintenance", "Maintenance", "/maintenance", Permission.NODES_READ),
    NavItem("tasks", "Tasks", "/tasks", Permission.NODES_READ),
    NavItem("audit", "Audit log", "/audit", Permission.AUDIT_READ),
    NavItem("users", "Users", "/users", Permission.USERS_READ),
    NavItem("projects", "Projects", "/projects", Permission.PROJECTS_READ),
)


def query_time(query: dict[str, str], key: str) -> datetime | None:
    """An ISO 8601 time from the query (a date, or a date and time; without a zone it is UTC)."""
    text = query.get(key)
    if text is None:
        return None
    try:
        at = datetime.fromisoformat(text.strip())
    except ValueError:
        raise InvalidInput(f"{key} must be a time like 2025-01-31T13:45 (UTC), not {text!r}") from None
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)


@dataclass(frozen=True)
class View:
    """What a page's data function gets: the read-only session, the head, the caller and the query."""

    session: Session
    ctx: HeadContext
    who: Principal
    query: dict[str, str]

    def may(self, permission: Permission) -> bool:
        return allowed(self.who.role, permission, self.who.scope)


def render(
    request: Request,
    ctx: HeadContext,
    name: str,
    permission: Permission,
    data: Callable[[View], dict[str, Any]],
    *,
    nav: str | None = None,
    title: str | None = None,
) -> Response:
    """Page `name` (or its fragment alone, for htmx), after checking the session and `permission`.

    `data` runs in a read-only transaction and may raise GpufleetError (NotFound, InvalidInput):
    the page then shows the message with the error's status, and the fragment too.
    """
    fragment = request.headers.get("hx-request") == "true" and request.headers.get("hx-boosted") != "true"
    try:
        who = session_principal(request, ctx)
    except GpufleetError:
        if fragment:
            return Response(status_code=401, headers={"HX-Redirect": "/login"})
        return RedirectResponse("/login", status_code=303)
    item = next((i for i in NAV if i.key == (nav or name)), None)
    context: dict[str, Any] = {
        "page": nav or name,
        "title": title or (item.title if item else name),
        "nav": [i for i in NAV if allowed(who.role, i.permission, who.scope)],
        "refresh_s": REFRESH_S,
        "self_url": request.url.path + (f"?{request.url.query}" if request.url.query else ""),
        "user": who.user,
        "role": who.role.value,
        "csrf": auth.csrf_token(request.cookies[SESSION_COOKIE]),
    }
    status = 200
    if not allowed(who.role, permission, who.scope):
        context["error"] = f"a {who.role.value} may not see this page ({permission})"
        status = 403
    else:
        query = {k: v for k, v in request.query_params.items() if v != ""}
        try:
            with tx(ctx, readonly=True) as session:
                view = View(session, ctx, who, query)
                context |= data(view) | {"may": {p.value for p in Permission if view.may(p)}}
        except GpufleetError as exc:
            context["error"] = str(exc)
            status = exc.http_status
    template = f"fragments/{name}.html" if fragment and status == 200 else f"{name}.html"
    if status != 200:
        template = "error.html" if not fragment else "fragments/error.html"
    headers = {"Cache-Control": "no-store", "Vary": "HX-Request"}
    return TEMPLATES.TemplateResponse(request, template, context, status_code=status, headers=headers)
