"""API shapes for tokens."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from pydantic import BaseModel, Field

from gpufleet.auth.models import TokenKind
from gpufleet.auth.policy import Role

MAX_JOIN_TTL_S = 30 * 24 * 3600


class JoinTokenCreate(BaseModel):
    expires_in_s: int = Field(3600, ge=1, le=MAX_JOIN_TTL_S)
    uses: int = Field(1, ge=1, le=100_000, description="how many nodes may join with it")


class JoinTokenCreated(BaseModel):
    token: str
    id: int
    expires_at: datetime
    uses: int


class TokenOut(BaseModel):
    id: int
    kind: TokenKind
    name: str
    created_at: datetime
    expires_at: datetime | None
    revoked: bool
    last_used_at: datetime | None
    uses: int
    max_uses: int | None


@dataclass(frozen=True)
class Principal:
    """Who is calling: an admin token, or the credential of one node."""

    kind: TokenKind
    token_id: int
    node_id: int | None = None
    role: Role = Role.VIEWER
    use_unrecorded: bool = False  # last use older than a minute: worth one write to record
    name: str = ""  # the token's name, or the node's, for the audit log

    @property
    def actor(self) -> str:
        return f"node:{self.name}" if self.kind is TokenKind.NODE else f"token:{self.name}#{self.token_id}"
