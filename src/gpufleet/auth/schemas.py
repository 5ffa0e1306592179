"""API shapes for tokens."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, StringConstraints

from gpufleet.auth.models import TokenKind
from gpufleet.auth.policy import Role

MAX_JOIN_TTL_S = 30 * 24 * 3600


class JoinTokenCreate(BaseModel):
    expires_in_s: int = Field(3600, ge=1, le=MAX_JOIN_TTL_S)
    uses: int = Field(1, ge=1, le=100_000, description="how many nodes may join with it")


class JoinTokenCreated(BaseModel):
    token: str  # with the head's CA pin appended when it serves TLS (see core.tls)
    id: int
    expires_at: datetime
    uses: int
    ca_fingerprint: str | None = None


class UserTokenCreated(BaseModel):
    token: str
    id: int
    expires_at: datetime | None
    scope: str


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
    user: str | None = None
    scope: str = "write"


@dataclass(frozen=True)
class Principal:
    """Who is calling: an admin token, or the credential of one node."""

    kind: TokenKind
    token_id: int
    node_id: int | None = None
    role: Role = Role.VIEWER
    scope: str = "write"  # "read": only the *:read permissions, whatever the role allows
    user: str | None = None  # the user a token belongs to
    use_unrecorded: bool = False  # last use older than a minute: worth one write to record
    name: str = ""  # the token's name, or the node's, for the audit log
    expires_at: datetime | None = None  # the token's own expiry

    @property
    def actor(self) -> str:
        if self.kind is TokenKind.NODE:
            return f"node:{self.name}"
        if self.user is not None:
            return f"user:{self.user}"
        return f"token:{self.name}#{self.token_id}"


SshKey = Annotated[str, StringConstraints(min_length=16, max_length=16_384, pattern=r"^(ssh-|ecdsa-|sk-)\S+ \S+")]
Shell = Annotated[str, StringConstraints(pattern=r"^/[A-Za-z0-9/._-]{1,127}$")]
FullName = Annotated[str, StringConstraints(max_length=128)]


class UserCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    username: Annotated[str, StringConstraints(min_length=1, max_length=64)]  # the service checks the rule
    role: Role = Role.MEMBER
    full_name: FullName = ""
    password: SecretStr | None = None
    uid: int | None = Field(default=None, ge=1000, le=2**31 - 2)
    gid: int | None = Field(default=None, ge=1000, le=2**31 - 2)
    shell: Shell = "/bin/bash"
    ssh_keys: list[SshKey] = Field(default_factory=list, max_length=32)


class UserUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Role | None = None
    full_name: FullName | None = None
    password: SecretStr | None = None
    shell: Shell | None = None
    ssh_keys: list[SshKey] | None = Field(default=None, max_length=32)
    enabled: bool | None = None


class UserOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    username: str
    full_name: str
    role: Role
    enabled: bool
    uid: int
    gid: int
    shell: str
    ssh_keys: list[str]
    home: str | None
    source: str  # local, ldap or oidc
    synced_at: datetime | None  # when a directory's user was last read from it
    created_at: datetime
    updated_at: datetime


class UserTokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    user: str
    expires_in_s: int = Field(30 * 24 * 3600, ge=60, le=366 * 24 * 3600)
    scope: Literal["read", "write"] = "write"


class PasswordLogin(BaseModel):
    model_config = ConfigDict(extra="forbid")

    username: Annotated[str, StringConstraints(min_length=1, max_length=64)]
    password: Annotated[SecretStr, Field(min_length=1, max_length=1024)]
    expires_in_s: int = Field(30 * 24 * 3600, ge=60, le=366 * 24 * 3600)
    scope: Literal["read", "write"] = "write"


class ProjectCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, StringConstraints(min_length=1, max_length=63)]
    description: Annotated[str, StringConstraints(max_length=512)] = ""


class ProjectMemberChange(BaseModel):
    model_config = ConfigDict(extra="forbid")

    user: Annotated[str, StringConstraints(min_length=1, max_length=64)]


class ProjectQuota(BaseModel):
    """Both quotas at once; null means unlimited."""

    model_config = ConfigDict(extra="forbid")

    max_gpus: int | None = Field(default=None, ge=0, le=1_000_000)
    gpu_hours_budget: float | None = Field(default=None, ge=0, le=1e12)
    budget_period: Literal["week", "month", "quarter"] | None = None


class ProjectOut(BaseModel):
    name: str
    description: str
    members: list[str]
    max_gpus: int | None
    gpu_hours_budget: float | None
    budget_period: str
    created_at: datetime
