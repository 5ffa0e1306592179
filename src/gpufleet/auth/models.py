"""Token tables. Only hashes are stored; the secret is shown once, when created."""

from __future__ import annotations

import enum
from datetime import datetime

from sqlalchemy import Enum, ForeignKey, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from gpufleet.auth.policy import Role
from gpufleet.core.db import Base, UTCDateTime, enum_values


class TokenKind(enum.StrEnum):
    ADMIN = "admin"  # full API access
    JOIN = "join"  # may only trade itself for a node credential, a limited number of times
    NODE = "node"  # an agent's own credential: may act only as its node


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
    node_id: Mapped[int | None] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"), default=None, index=True)
