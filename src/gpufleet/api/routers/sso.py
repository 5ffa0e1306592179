"""Single sign-on through the site's OpenID Connect provider (`oidc_issuer`), beside password logins.

The dashboard: `GET /login/sso` sends the browser to the provider (authorization code flow with PKCE S256,
state and nonce); the provider sends it back to `GET /login/sso/callback`, where the code is traded for an ID
token, the token is checked (signature, issuer, audience, expiry, nonce: directory.oidc), the person is
created or refreshed (directory.sync.apply_user: role and projects from the groups claim) and a dashboard
session starts as after a password login. What must survive the round trip (state, nonce, the PKCE
verifier) rides in a short-lived HttpOnly cookie scoped to /login/sso; the callback takes the state from the
provider's redirect and the cookie both and refuses any mismatch, so another site cannot complete a login
into an account of its choosing.

The CLI: `gpufleet login --sso` reads `GET /api/v1/sso` (issuer, the CLI's public client id, scopes), runs the
device authorization grant with the provider itself, and trades the ID token it gets for an ordinary
gpufleet API token at `POST /api/v1/login/sso`. The token's audience must be the CLI's client id.

Every SSO login is audited, refused ones too.
"""

from __future__ import annotations

import base64
import json
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.orm import Session

from gpufleet.api.deps import SESSION_COOKIE, Ctx, tx
from gpufleet.api.routers.web_login import login_page
from gpufleet.auth import audit, users
from gpufleet.auth import service as auth
from gpufleet.auth.models import User
from gpufleet.auth.schemas import UserTokenCreated
from gpufleet.core import secrets
from gpufleet.core.errors import GpufleetError, NotFound, Unauthorized, Unavailable
from gpufleet.directory.oidc import OidcClient
from gpufleet.directory.records import DirectoryUnavailable, DirectoryUser
from gpufleet.directory.settings import mappings
from gpufleet.directory.sync import apply_user

router = APIRouter(include_in_schema=False)  # the browser's round trip
api = APIRouter(tags=["tokens"])  # the CLI's, under /api/v1
SSO_COOKIE = "gpufleet_sso"
SSO_COOKIE_PATH = "/login/sso"
ROUND_TRIP_S = 600  # how long the browser may take at the provider


class SsoInfo(BaseModel):
    issuer: str
    client_id: str  # the CLI's public client (device grant)
    scopes: list[str]


class SsoLogin(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id_token: str = Field(min_length=1, max_length=16384)
    expires_in_s: int = Field(30 * 24 * 3600, ge=60, le=366 * 24 * 3600)


def _client(ctx: Any) -> OidcClient:
    oidc: OidcClient | None = ctx.oidc
    if oidc is None:
        raise NotFound("single sign-on is not configured (oidc_issuer)")
    return oidc


def _redirect_uri(request: Request, ctx: Any) -> str:
    base = ctx.settings.external_url or str(request.base_url)
    return base.rstrip("/") + SSO_COOKIE_PATH + "/callback"


def _signed_in(ctx: Any, person: DirectoryUser) -> User:
    """Create or refresh the person (role and projects from the groups claim) and return the user, read
    again in the transaction that makes their session or token. Unauthorized where the person cannot be a
    user here (a local account of that name, a bad name) or is disabled."""
    with tx(ctx) as db:
        applied = apply_user(db, ctx.clock, "oidc", person, mappings(ctx.settings)["oidc"])
    if applied.user is None:
        raise Unauthorized(f"{person.username} may not sign in here: {applied.problem}")
    if not applied.user.enabled:
        raise Unauthorized(f"{person.username} is disabled")
    return applied.user


@router.get("/login/sso")
def begin(request: Request, ctx: Ctx) -> Response:
    """Send the browser to the provider's sign-in page."""
    try:
        start = _client(ctx).begin_login(_redirect_uri(request, ctx))
    except DirectoryUnavailable as exc:
        return _failed(request, ctx, f"the sign-on provider cannot be reached: {exc}", 503)
    kept = json.dumps({"state": start.state, "nonce": start.nonce, "verifier": start.code_verifier})
    response = RedirectResponse(start.url, status_code=303)
    response.set_cookie(
        SSO_COOKIE,
        base64.urlsafe_b64encode(kept.encode()).decode(),
        max_age=ROUND_TRIP_S,
        path=SSO_COOKIE_PATH,
        httponly=True,
        samesite="lax",  # sent on the provider's top-level redirect back, never on another site's request
        secure=request.url.scheme == "https",
    )
    return response


@router.get("/login/sso/callback", response_class=HTMLResponse)
def callback(
    request: Request,
    ctx: Ctx,
    code: Annotated[str, Query(max_length=4096)] = "",
    state: Annotated[str, Query(max_length=512)] = "",
    error: Annotated[str, Query(max_length=256)] = "",
) -> Response:
    """Where the provider sends the browser back: check, sign in, start a dashboard session."""
    kept = _kept(request)
    if error:
        return _failed(request, ctx, f"the sign-on provider refused: {error}", 401)
    if kept is None or not code or not state or not secrets.same(state, kept.get("state", "")):
        return _failed(request, ctx, "this sign-on expired or did not start here; please try again", 400)
    try:
        person = _client(ctx).finish_login(code, _redirect_uri(request, ctx), kept["verifier"], kept["nonce"])
        user = _signed_in(ctx, person)
        with tx(ctx) as db:
            session_secret = auth.create_web_session(
                db, ctx.clock, users.get_user(db, user.username), ctx.settings.web_session_ttl_s
            )
            _audit(request, ctx, db, f"user:{user.username}", f"user {user.username}", 303)
    except DirectoryUnavailable as exc:
        return _failed(request, ctx, f"the sign-on provider cannot be reached: {exc}", 503)
    except GpufleetError as exc:
        return _failed(request, ctx, str(exc), exc.http_status)
    response = RedirectResponse("/", status_code=303)
    response.delete_cookie(SSO_COOKIE, path=SSO_COOKIE_PATH)
    response.set_cookie(
        SESSION_COOKIE,
        session_secret,
        httponly=True,
        samesite="lax",
        secure=request.url.scheme == "https",
        max_age=ctx.settings.web_session_ttl_s,
    )
    return response


def _kept(request: Request) -> dict[str, str] | None:
    raw = request.cookies.get(SSO_COOKIE)
    if not raw:
        return None
    try:
        value = json.loads(base64.urlsafe_b64decode(raw.encode()))
    except ValueError:
        return None
    if not isinstance(value, dict) or not all(isinstance(value.get(k), str) for k in ("state", "nonce", "verifier")):
        return None
    return {k: value[k] for k in ("state", "nonce", "verifier")}


def _audit(request: Request, ctx: Any, db: Session, actor: str, target: str, result: int) -> None:
    """The callback is a GET, which the audit middleware leaves out: each sign-on is recorded here."""
    source = request.client.host if request.client else ""
    audit.record(
        db,
        ctx.clock,
        actor=actor,
        action="sso.callback",
        target=f"{target} (single sign-on)",
        source=source,
        result=result,
    )


def _failed(request: Request, ctx: Any, message: str, status_code: int) -> Response:
    with tx(ctx) as db:
        _audit(request, ctx, db, "anonymous", f"refused: {message}", status_code)
    response = login_page(request, message, status_code)
    response.delete_cookie(SSO_COOKIE, path=SSO_COOKIE_PATH)
    return response


@api.get("/sso")
def sso_info(ctx: Ctx) -> SsoInfo:
    """What `gpufleet login --sso` needs to run the device grant with the provider. No token needed."""
    oidc = _client(ctx)
    return SsoInfo(issuer=oidc.config.issuer, client_id=oidc.config.device_client_id, scopes=list(oidc.config.scopes))


@api.post("/login/sso", status_code=201)
def sso_token(body: SsoLogin, ctx: Ctx, request: Request) -> UserTokenCreated:
    """Trade an ID token from the device grant (audience: the CLI's client id) for a gpufleet API token."""
    oidc = _client(ctx)
    request.state.audit_target = "single sign-on (CLI)"
    try:
        person = oidc.user_from_id_token(body.id_token, audiences=(oidc.config.device_client_id,))
    except DirectoryUnavailable as exc:
        raise Unavailable(f"the sign-on provider cannot be reached: {exc}") from exc
    request.state.audit_target = f"user {person.username} (single sign-on, CLI)"
    user = _signed_in(ctx, person)
    with tx(ctx) as db:
        token, row = auth.create_user_token(
            db, ctx.clock, users.get_user(db, user.username), body.expires_in_s, "write"
        )
        request.state.actor = f"user:{user.username}"  # before the block ends: the record is in this transaction
    return UserTokenCreated(token=token, id=row.id, expires_at=row.expires_at, scope="write")
