"""Token logic: create, authenticate, trade a join token for a node credential. Never commits."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import exists, select, update
from sqlalchemy.orm import Session

from gpufleet.auth.models import ApiToken, TokenKind, User
from gpufleet.auth.policy import Role
from gpufleet.auth.schemas import Principal
from gpufleet.core import secrets
from gpufleet.core.clock import Clock, to_datetime
from gpufleet.core.errors import Forbidden, InvalidInput, NotFound, Unauthorized

# Recording last use on every request would turn reads into writes; once a minute is enough to audit.
LAST_USED_RESOLUTION = timedelta(seconds=60)


def _add(session: Session, clock: Clock, kind: TokenKind, name: str, token: str, **fields: object) -> ApiToken:
    row = ApiToken(
        kind=kind,
        name=name,
        token_hash=secrets.hash_token(token),
        created_at=to_datetime(clock.now()),
        **fields,
    )
    session.add(row)
    session.flush()
    return row


def ensure_admin_token(session: Session, clock: Clock, bootstrap: str | None) -> str | None:
    """Make sure an admin can get in. Returns a new secret to print once, or None if nothing was created.

    With `bootstrap` set (GPUFLEET_BOOTSTRAP_TOKEN), that exact token is installed if missing. Without
    it, a token is generated only when no admin token exists yet, i.e. on the first start.
    """
    if bootstrap is not None:
        if len(bootstrap) < 16:
            raise InvalidInput("bootstrap token must be at least 16 characters")
        found = session.scalar(select(ApiToken).where(ApiToken.token_hash == secrets.hash_token(bootstrap)))
        if found is None:
            _add(session, clock, TokenKind.ADMIN, "bootstrap", bootstrap)
        elif found.kind is not TokenKind.ADMIN or found.revoked_at is not None:
            raise InvalidInput("bootstrap token matches a token that is revoked or not an admin token")
        return None
    has_admin = session.scalar(select(exists().where(ApiToken.kind == TokenKind.ADMIN, ApiToken.revoked_at.is_(None))))
    if has_admin:
        return None
    token = secrets.new_token(secrets.ADMIN_PREFIX)
    _add(session, clock, TokenKind.ADMIN, "initial admin", token)
    return token


def create_api_token(session: Session, clock: Clock, name: str, role: Role, expires_in_s: int | None) -> str:
    """An API token acting with `role` (see auth.policy). Users and their tokens arrive with issue 3."""
    if role is Role.NODE:
        raise InvalidInput("node credentials come from joining, not from token create")
    token = secrets.new_token(secrets.ADMIN_PREFIX)
    expires_at = to_datetime(clock.now() + expires_in_s) if expires_in_s else None
    _add(session, clock, TokenKind.ADMIN, name, token, role=role, expires_at=expires_at)
    return token


def create_join_token(session: Session, clock: Clock, expires_in_s: int, uses: int) -> tuple[str, ApiToken]:
    """A token that lets up to `uses` agents join before `expires_in_s` passes."""
    token = secrets.new_token(secrets.JOIN_PREFIX)
    row = _add(
        session,
        clock,
        TokenKind.JOIN,
        "join",
        token,
        expires_at=to_datetime(clock.now() + expires_in_s),
        max_uses=uses,
    )
    return token, row


def list_tokens(session: Session) -> list[ApiToken]:
    return list(session.scalars(select(ApiToken).where(ApiToken.kind != TokenKind.NODE).order_by(ApiToken.id)))


def _refused(revoked_at: datetime | None, expires_at: datetime | None, now: datetime) -> str | None:
    """Why a token found by its hash may not be used, or None."""
    if revoked_at is not None:
        return "token has been revoked"
    if expires_at is not None and expires_at <= now:
        return "token has expired"
    return None


def _lookup(session: Session, clock: Clock, token: str) -> ApiToken:
    """The token's row, usable now (a join token's: its uses are counted on it)."""
    row = session.scalars(select(ApiToken).where(ApiToken.token_hash == secrets.hash_token(token))).first()
    if row is None:
        raise Unauthorized("unknown token")
    if (why := _refused(row.revoked_at, row.expires_at, to_datetime(clock.now()))) is not None:
        raise Unauthorized(why)
    return row


# What a request needs of its token and the user it acts as: every API request reads this, so one
# query of these columns rather than both rows as objects (measured: a third of the authentication's
# CPU went to building the two objects and describing their 25 columns).
_CALLER = (
    ApiToken.id,
    ApiToken.kind,
    ApiToken.name,
    ApiToken.role,
    ApiToken.scope,
    ApiToken.node_id,
    ApiToken.user_id,
    ApiToken.revoked_at,
    ApiToken.expires_at,
    ApiToken.last_used_at,
    User.id.label("found_user_id"),
    User.enabled,
    User.role.label("user_role"),
    User.username,
)


def authenticate(session: Session, clock: Clock, token: str, *, web_session: bool = False) -> Principal:
    """Resolve a bearer token (or, with `web_session`, a session cookie) to who is calling, reading
    only. Join tokens are accepted only by `consume_join_token`. The caller records the use with
    `record_use` when `use_unrecorded` says so.

    Raises Unauthorized for an unknown, revoked, expired or join token, and for a token presented
    the wrong way (a session as a bearer token or the other way round).
    """
    row = session.execute(
        select(*_CALLER)
        .outerjoin(User, User.id == ApiToken.user_id)
        .where(ApiToken.token_hash == secrets.hash_token(token))
    ).first()
    if row is None:
        raise Unauthorized("unknown token")
    now = to_datetime(clock.now())
    if (why := _refused(row.revoked_at, row.expires_at, now)) is not None:
        raise Unauthorized(why)
    if row.kind is TokenKind.JOIN:
        raise Unauthorized("a join token can only be used to join a node")
    if web_session != (row.kind is TokenKind.SESSION):
        raise Unauthorized(
            "a web session is only valid as the browser's cookie" if not web_session else "not a session"
        )
    # Node credentials are used every reconnect and their node's last_seen already says when; only
    # people's and automation's tokens get a last-use record.
    stale = row.kind is not TokenKind.NODE and (
        row.last_used_at is None or now - row.last_used_at > LAST_USED_RESOLUTION
    )
    name = row.name.removeprefix("node ") if row.kind is TokenKind.NODE else row.name
    role = Role.NODE if row.kind is TokenKind.NODE else row.role
    username = None
    if row.user_id is not None:
        if row.found_user_id is None or not row.enabled:  # the user is gone, or disabled
            raise Unauthorized("the token's user is disabled")
        role, username = row.user_role, row.username
    return Principal(
        kind=row.kind,
        token_id=row.id,
        node_id=row.node_id,
        role=role,
        scope=row.scope,
        user=username,
        use_unrecorded=stale,
        name=name,
        expires_at=row.expires_at,
    )


def create_user_token(
    session: Session, clock: Clock, user: User, expires_in_s: int, scope: str
) -> tuple[str, ApiToken]:
    """An API token acting as `user` (with the user's role), read-only when `scope` is "read"."""
    token = secrets.new_token(secrets.ADMIN_PREFIX)
    row = _add(
        session,
        clock,
        TokenKind.ADMIN,
        user.username,
        token,
        role=user.role,
        user_id=user.id,
        scope=scope,
        expires_at=to_datetime(clock.now() + expires_in_s),
    )
    return token, row


def create_web_session(session: Session, clock: Clock, user: User, ttl_s: int) -> str:
    """A browser session for `user` after a password login; its secret goes in an HttpOnly cookie."""
    token = secrets.new_token(secrets.SESSION_PREFIX)
    _add(
        session,
        clock,
        TokenKind.SESSION,
        user.username,
        token,
        role=user.role,
        user_id=user.id,
        expires_at=to_datetime(clock.now() + ttl_s),
    )
    return token


def csrf_token(session_secret: str) -> str:
    """The CSRF token of a web session: derived from the cookie's secret, which other sites cannot read."""
    return secrets.derived(session_secret, "gpufleet csrf")


def end_web_session(session: Session, clock: Clock, session_secret: str) -> None:
    """Log out: the session's cookie stops working at once. Unknown or ended sessions are ignored."""
    session.execute(
        update(ApiToken)
        .where(
            ApiToken.token_hash == secrets.hash_token(session_secret),
            ApiToken.kind == TokenKind.SESSION,
            ApiToken.revoked_at.is_(None),
        )
        .values(revoked_at=to_datetime(clock.now()))
    )


def revoke_token(session: Session, clock: Clock, token_id: int, *, join_only: bool = False) -> ApiToken:
    """Revoke an API, session or join token (only a join token with `join_only`). Raises NotFound for
    an unknown id (or a node credential), Forbidden for another kind with `join_only`."""
    row = session.get(ApiToken, token_id)
    if row is None or row.kind is TokenKind.NODE:
        raise NotFound(f"no such token: {token_id}")
    if join_only and row.kind is not TokenKind.JOIN:
        raise Forbidden("only admins revoke API tokens and sessions; operators revoke join tokens")
    if row.revoked_at is None:
        row.revoked_at = to_datetime(clock.now())
    return row


def record_use(session: Session, clock: Clock, principal: Principal) -> None:
    """Note that a token was used (at most once a minute, see `Principal.use_unrecorded`)."""
    session.execute(
        update(ApiToken).where(ApiToken.id == principal.token_id).values(last_used_at=to_datetime(clock.now()))
    )


def consume_join_token(session: Session, clock: Clock, token: str) -> ApiToken:
    """Spend one use of a join token. Raises Unauthorized if unknown, expired, revoked or used up.

    The use is counted with a conditional UPDATE, so concurrent joins cannot overspend it.
    """
    row = _lookup(session, clock, token)
    if row.kind is not TokenKind.JOIN:
        raise Unauthorized("not a join token")
    spent = session.execute(
        update(ApiToken)
        .where(ApiToken.id == row.id, ApiToken.uses < ApiToken.max_uses)
        .values(uses=ApiToken.uses + 1, last_used_at=to_datetime(clock.now()))
    )
    if spent.rowcount != 1:  # type: ignore[attr-defined]
        raise Unauthorized(f"join token already used ({row.max_uses} of {row.max_uses} uses)")
    return row


def issue_node_credential(session: Session, clock: Clock, node_id: int, node_name: str) -> str:
    """A fresh credential for a node; any earlier credential of that node stops working."""
    now = to_datetime(clock.now())
    session.execute(
        update(ApiToken)
        .where(ApiToken.node_id == node_id, ApiToken.kind == TokenKind.NODE, ApiToken.revoked_at.is_(None))
        .values(revoked_at=now)
    )
    token = secrets.new_token(secrets.NODE_PREFIX)
    _add(session, clock, TokenKind.NODE, f"node {node_name}", token, node_id=node_id)
    return token
