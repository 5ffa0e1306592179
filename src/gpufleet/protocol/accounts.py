"""The cluster users' accounts, as the head hands them to agents (`GET /api/v1/agent/accounts`).

Limits here are loose on purpose: they bound what a hostile or broken head can make an agent parse,
but the rules an account must follow on a node (name, shell, key syntax) are checked by the agent
entry by entry, so one bad account is skipped rather than making the whole list unreadable.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

# What useradd accepts: a lowercase letter or underscore, then lowercase letters, digits, '_' and '-'.
USERNAME_RE = r"^[a-z_][a-z0-9_-]{0,31}$"
USERNAME_PATTERN = re.compile(USERNAME_RE)
MAX_ACCOUNTS = 100_000
MAX_KEYS_PER_ACCOUNT = 64


class Account(BaseModel):
    """One cluster user's POSIX account: the same uid and gid on every node."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    username: Annotated[str, StringConstraints(min_length=1, max_length=64)]
    full_name: Annotated[str, StringConstraints(max_length=256)] = ""
    uid: int = Field(ge=0, le=2**32 - 1)
    gid: int = Field(ge=0, le=2**32 - 1)
    shell: Annotated[str, StringConstraints(max_length=256)] = "/bin/bash"
    home: Annotated[str, StringConstraints(max_length=256)] | None = None  # None: /home/USERNAME
    ssh_keys: list[Annotated[str, StringConstraints(max_length=16_384)]] = Field(
        default_factory=list, max_length=MAX_KEYS_PER_ACCOUNT
    )
    enabled: bool = True


def accounts_version(accounts: list[Account]) -> str:
    """A SHA-256 of the accounts' content, independent of their order: the list's ETag."""
    canonical = json.dumps(
        [a.model_dump(mode="json", exclude_none=True) for a in sorted(accounts, key=lambda a: a.username)],
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


class AccountList(BaseModel):
    """Every account gpufleet manages on the nodes, enabled or not, and a version of the whole list."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    accounts: list[Account] = Field(default_factory=list, max_length=MAX_ACCOUNTS)
    version: Annotated[str, StringConstraints(min_length=1, max_length=128)]

    @classmethod
    def of(cls, accounts: list[Account]) -> AccountList:
        """The list with its version computed from its content."""
        return cls(accounts=accounts, version=accounts_version(accounts))
