"""Dashboard login: user name and password in, a server-side session out, in an HttpOnly cookie.

CSRF: the login form is protected by a double-submit value (a random cookie echoed by a hidden
field), so another site cannot log a browser into an account of its choosing; once logged in, every
change needs the session's CSRF token (see `api.deps.session_principal`). Failed logins are slowed
down by `auth.throttle`, and every attempt is audited by the audit middleware.
"""

from __future__ import annotations

import contextlib
import secrets as _secrets
from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from gpufleet.api.deps import SESSION_COOKIE, Ctx, authenticate, tx
from gpufleet.api.templates import TEMPLATES
from gpufleet.auth import service as auth
from gpufleet.auth import users
from gpufleet.auth.identity import password_login
from gpufleet.core import secrets
from gpufleet.core.errors import GpufleetError, TooManyRequests

router = APIRouter(include_in_schema=False)
LOGIN_CSRF_COOKIE = "gpufleet_login_csrf"


def login_page(request: Request, error: str | None = None, status_code: int = 200, username: str = "") -> Response:
    csrf = _secrets.token_urlsafe(24)
    response = TEMPLATES.TemplateResponse(
        request,
        "login.html",
        # The single sign-on button: the app's context says whether a provider is configured.
        {"error": error, "csrf": csrf, "username": username, "sso": request.app.state.ctx.oidc is not None},
        status_code=status_code,
        headers={"Cache-Control": "no-store"},
    )
    response.set_cookie(
        LOGIN_CSRF_COOKIE, csrf, httponly=True, samesite="strict", secure=request.url.scheme == "https", max_age=3600
    )
    return response


@router.get("/login", response_class=HTMLResponse)
def login_form(request: Request) -> Response:
    return login_page(request)


@router.post("/login", response_class=HTMLResponse)
def login(
    request: Request,
    ctx: Ctx,
    username: Annotated[str, Form(max_length=64)],
    password: Annotated[str, Form(max_length=1024)],
    csrf: Annotated[str, Form(max_length=64)] = "",
) -> Response:
    request.state.audit_target = f"user {username}"
    expected = request.cookies.get(LOGIN_CSRF_COOKIE) or ""
    if not expected or not secrets.same(csrf, expected):
        return login_page(request, "the login form expired; please try again", 403, username)
    source = request.client.host if request.client else ""
    try:
        # Checked in a read-only transaction: argon2 takes a while, and must not hold the write lock.
        with tx(ctx, readonly=True) as db:
            proven = password_login(db, ctx.identity, ctx.throttle, username, password, source)
        username, note = proven.username, ctx.identity.note(proven)
        if note:
            request.state.audit_target = f"user {username} ({note})"
        with tx(ctx) as db:
            user = users.get_user(db, username)
            session_secret = auth.create_web_session(db, ctx.clock, user, ctx.settings.web_session_ttl_s)
    except TooManyRequests as exc:
        response = login_page(request, str(exc), 429, username)
        response.headers["Retry-After"] = str(int(exc.retry_after_s) + 1)
        return response
    except GpufleetError as exc:
        return login_page(request, str(exc), exc.http_status, username)
    request.state.actor = f"user:{username}"
    response = RedirectResponse("/", status_code=303)
    response.delete_cookie(LOGIN_CSRF_COOKIE)
    response.set_cookie(
        SESSION_COOKIE,
        session_secret,
        httponly=True,
        samesite="lax",
        secure=request.url.scheme == "https",
        max_age=ctx.settings.web_session_ttl_s,
    )
    return response


@router.post("/logout")
def logout(request: Request, ctx: Ctx) -> Response:
    """End the session on the server, not just in this browser, whatever the form carries.

    No CSRF token is asked for: the session's cookie (SameSite=Lax, so another site's form cannot send
    it) is what is ended, and a logout that kept the server's session alive when the form's token was
    missing or stale left the old cookie value working everywhere. The worst another site could do
    with it is log the browser out."""
    session_secret = request.cookies.get(SESSION_COOKIE)
    if session_secret:
        with contextlib.suppress(GpufleetError):  # an ended or unknown session: nothing to end, nobody to name
            request.state.actor = authenticate(ctx, session_secret, web_session=True).actor  # for the audit record
        with tx(ctx) as db:
            auth.end_web_session(db, ctx.clock, session_secret)
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(SESSION_COOKIE)
    return response
