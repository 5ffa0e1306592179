"""Token tables. Only hashes are stored; the secret is shown once, when created."""

from __future__ import annotations

import enum
from datetime import datetime

from sqlalchemy import JSON, Boolean, Enum, ForeignKey, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from gpufleet.auth.policy import Role
from gpufleet.core.db import Base, UTCDateTime, enum_values


class TokenKind(enum.StrEnum):
    ADMIN = "admin"  # full API access
    JOIN = "join"  # may only trade itself for a node credential, a limited number of times
    NODE = "node"  # an agent's own credential: may act only as its node
    SESSION = "session"  # a browser's login, presented only as a cookie (with a CSRF token to change things)


class User(Base):
    """A person: their role, their POSIX identity on the nodes, their SSH keys, and where they come from."""

    __tablename__ = "users"

    id: Mapped[int] = mapped_column(primary_key=True)
    username: Mapped[str] = mapped_column(String(32), unique=True)
    full_name: Mapped[str] = mapped_column(String(128), default="")
    role: Mapped[Role] = mapped_column(Enum(Role, native_enum=False, length=16, values_callable=enum_values))
    password_hash: Mapped[str | None] = mapped_column(String(256), default=None)
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    uid: Mapped[int] = mapped_column(Integer, unique=True)
    gid: Mapped[int] = mapped_column(Integer)
    shell: Mapped[str] = mapped_column(String(128), default="/bin/bash")
    ssh_keys: Mapped[list[str]] = mapped_column(JSON, default=list)
    home: Mapped[str | None] = mapped_column(String(256), default=None)  # None: /home/USERNAME on the nodes
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())
    # Where the user comes from: "local" (made in gpufleet), "ldap" or "oidc". A directory's user is kept in
    # step with the directory (gpufleet.directory) and changed there, not here.
    source: Mapped[str] = mapped_column(String(16), default="local", server_default="local")
    source_id: Mapped[str | None] = mapped_column(String(512), default=None)  # the entry's DN, or ISSUER#sub
    synced_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None)  # last read from its source


class ApiToken(Base):
    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(primary_key=True)
    kind: Mapped[TokenKind] = mapped_column(Enum(TokenKind, native_enum=False, length=16, values_callable=enum_values))
    name: Mapped[str] = mapped_column(String(128))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None)
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None)
    max_uses: Mapped[int | None] = mapped_column(Integer, default=None)
    uses: Mapped[int] = mapped_column(Integer, default=0)
    # The node table lives in the inventory domain, which sits above auth; the foreign key is by name.
    # What an admin-kind API token may do (see auth.policy); node credentials are always `node`.
    role: Mapped[Role] = mapped_column(
        Enum(Role, native_enum=False, length=16, values_callable=enum_values), default=Role.ADMIN
    )
    # A user's token acts as that user (their role); `scope` read limits it to reading.
    user_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), default=None, index=True)
    scope: Mapped[str] = mapped_column(String(8), default="write")
    node_id: Mapped[int | None] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"), default=None, index=True)
