"""The directory's admin view over the API: where users come from, each source's last sync, mapping problems."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict


class SourceStatus(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    source: str
    attempted_at: datetime | None
    succeeded_at: datetime | None
    error: str  # why the last attempt failed; empty after a success
    users: int
    changed: int
    problems: list[str]


class DirectoryStatus(BaseModel):
    identity_provider: str  # local or ldap
    sso: bool  # single sign-on configured (oidc_issuer)
    users: dict[str, int]  # how many users come from each source: local, ldap, oidc
    sources: list[SourceStatus]
    problems: list[str]  # what the mappings name that cannot be applied now


class SyncOut(BaseModel):
    users: int
    created: list[str]
    changed: list[str]
    disabled: list[str]
    problems: list[str]
