"""The administration pages: the audit log, the users and the projects.

All three only read. The buttons on the Users page call the REST API (`PATCH` and `DELETE
/api/v1/users/{name}`), so the API checks, refuses and audits them as it would a CLI call.

The audit log is read with `auth.audit.list_records`, the function the REST API uses, which filters
and pages in the database.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response
from sqlalchemy import func, select

from gpufleet.api.dashboard.pages import INPUT_TIME, View, query_time, render
from gpufleet.api.deps import Ctx
from gpufleet.auth import audit, projects, users
from gpufleet.auth.audit import AuditRecord
from gpufleet.auth.models import ApiToken, TokenKind
from gpufleet.auth.policy import Permission
from gpufleet.core.clock import to_datetime
from gpufleet.core.errors import InvalidInput
from gpufleet.directory import settings as directory_settings
from gpufleet.directory import views as directory_views

router = APIRouter(include_in_schema=False)

# --- Audit log ---------------------------------------------------------------------------------

PAGE_SIZE = 100
MAX_PAGE = 100_000
# What a record's result (the HTTP status its request ended with) is called in the filter.
RESULTS: dict[str, tuple[int, int]] = {"ok": (100, 399), "refused": (400, 499), "failed": (500, 599)}
_STATUS = re.compile(r"^[1-5][0-9]{2}$")
_PAGE = re.compile(r"^[0-9]{1,6}$")


def result_class(status: int) -> str:
    """ok, refused or failed: what a status code means for the audit log."""
    return next((name for name, (low, high) in RESULTS.items() if low <= status <= high), "failed")


def _page(query: dict[str, str]) -> int:
    text = query.get("page", "1")
    if not _PAGE.match(text) or not 1 <= int(text) <= MAX_PAGE:
        raise InvalidInput(f"page must be a whole number from 1 to {MAX_PAGE}, not {text!r}")
    return int(text)


def _result_range(query: dict[str, str]) -> tuple[int, int] | None:
    text = query.get("result")
    if text is None:
        return None
    if text in RESULTS:
        return RESULTS[text]
    if _STATUS.match(text):
        return int(text), int(text)
    raise InvalidInput(f"result must be {', '.join(RESULTS)} or an HTTP status such as 403, not {text!r}")


@dataclass(frozen=True)
class AuditPage:
    records: list[AuditRecord]
    page: int
    has_next: bool


def audit_page(view: View) -> AuditPage:
    """The records matching the query's filters, newest first, one page of them. Raises InvalidInput."""
    query = view.query
    page = _page(query)
    since, until = query_time(query, "since"), query_time(query, "until")
    if since is not None and until is not None and until < since:
        raise InvalidInput("until is before since")
    actor = query.get("actor")
    if actor is not None and len(actor) > 160:
        raise InvalidInput("actor is at most 160 characters")
    action = query.get("action", "").strip()
    if len(action) > 128:
        raise InvalidInput("action is at most 128 characters")
    rows = audit.list_records(
        view.session,
        since=since,
        until=until,
        actor=actor,
        action=action or None,
        results=_result_range(query),
        offset=(page - 1) * PAGE_SIZE,
        limit=PAGE_SIZE + 1,  # one more says whether there is a next page
    )
    return AuditPage(rows[:PAGE_SIZE], page, len(rows) > PAGE_SIZE)


def audit_view(view: View) -> dict[str, Any]:
    found = audit_page(view)
    since, until = query_time(view.query, "since"), query_time(view.query, "until")
    return {
        "records": found.records,
        "page_no": found.page,  # not "page": that names the page in the navigation
        "has_next": found.has_next,
        "query": view.query,
        "results": list(RESULTS),
        "result_class": result_class,
        # What the form's datetime-local fields show (they take no zone: the page is in UTC).
        "since": since.strftime(INPUT_TIME) if since else "",
        "until": until.strftime(INPUT_TIME) if until else "",
    }


@router.get("/audit", response_class=HTMLResponse)
def audit_log_page(request: Request, ctx: Ctx) -> Response:
    return render(request, ctx, "audit", Permission.AUDIT_READ, audit_view)


# --- Users -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class UserRow:
    username: str
    full_name: str
    role: str
    enabled: bool
    created_at: datetime
    last_login: datetime | None  # the newest dashboard session's start
    tokens: int  # API tokens that still work
    sessions: int  # dashboard sessions that still work
    source: str  # local, ldap or oidc
    synced_at: datetime | None  # a directory user's last refresh from the directory


def users_view(view: View) -> dict[str, Any]:
    now = to_datetime(view.ctx.clock.now())
    live = ApiToken.revoked_at.is_(None) & (ApiToken.expires_at.is_(None) | (ApiToken.expires_at > now))
    counts: dict[tuple[int | None, TokenKind], int] = {
        (user_id, kind): n
        for user_id, kind, n in view.session.execute(
            select(ApiToken.user_id, ApiToken.kind, func.count())
            .where(ApiToken.user_id.is_not(None), live)
            .group_by(ApiToken.user_id, ApiToken.kind)
        )
    }
    last_login: dict[int | None, datetime | str | None] = dict(
        view.session.execute(
            select(ApiToken.user_id, func.max(ApiToken.created_at))
            .where(ApiToken.user_id.is_not(None), ApiToken.kind == TokenKind.SESSION)
            .group_by(ApiToken.user_id)
        ).all()  # a list: dict() would take the Result, which has keys(), for a mapping
    )
    rows = [
        UserRow(
            username=u.username,
            full_name=u.full_name,
            role=u.role.value,
            enabled=u.enabled,
            created_at=u.created_at,
            last_login=_utc(last_login.get(u.id)),
            tokens=counts.get((u.id, TokenKind.ADMIN), 0),
            sessions=counts.get((u.id, TokenKind.SESSION), 0),
            source=u.source,
            synced_at=u.synced_at,
        )
        for u in users.list_users(view.session)
    ]
    settings = view.ctx.settings
    directory = directory_views.status(
        view.session,
        identity_provider=settings.identity_provider,
        sso=settings.oidc_issuer is not None,
        mappings=directory_settings.mappings(settings),
    )
    return {"users": rows, "me": view.who.user, "directory": directory}


def _utc(at: datetime | str | None) -> datetime | None:
    """An aggregate's datetime as UTC, whatever the driver made of it (SQLite may give naive or text)."""
    if at is None:
        return None
    if isinstance(at, str):
        at = datetime.fromisoformat(at)
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)


@router.get("/users", response_class=HTMLResponse)
def users_page(request: Request, ctx: Ctx) -> Response:
    return render(request, ctx, "users", Permission.USERS_READ, users_view)


# --- Projects ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Member:
    username: str
    full_name: str
    role: str  # the user's role; projects have no roles of their own
    enabled: bool


@dataclass(frozen=True)
class ProjectRow:
    name: str
    description: str
    members: list[Member]
    max_gpus: int | None
    gpu_hours_budget: float | None
    budget_period: str
    created_at: datetime

    @property
    def budget(self) -> str:
        """The GPU-hour budget as shown: 1,200 or 12.5."""
        hours = self.gpu_hours_budget or 0.0
        return f"{hours:,.0f}" if hours.is_integer() else f"{hours:,.1f}"


def projects_view(view: View) -> dict[str, Any]:
    rows = [
        ProjectRow(
            name=p.name,
            description=p.description,
            members=sorted(
                (Member(m.user.username, m.user.full_name, m.user.role.value, m.user.enabled) for m in p.members),
                key=lambda m: m.username,
            ),
            max_gpus=p.max_gpus,
            gpu_hours_budget=p.gpu_hours_budget,
            budget_period=p.budget_period.value,
            created_at=p.created_at,
        )
        for p in projects.list_projects(view.session)
    ]
    return {"projects": rows}


@router.get("/projects", response_class=HTMLResponse)
def projects_page(request: Request, ctx: Ctx) -> Response:
    return render(request, ctx, "projects", Permission.PROJECTS_READ, projects_view)
