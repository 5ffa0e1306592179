"""What the head learns about a person from the site's directory or its single sign-on provider.

Both sources (`directory.ldap`, `directory.oidc`) describe a person as a `DirectoryUser`; the rest of the
directory package (mapping groups to roles and projects, keeping the users table in step) reads only this,
so it is tested the same way for either source.
"""

from __future__ import annotations

from dataclasses import dataclass, field


class DirectoryUnavailable(Exception):
    """The directory or provider could not be asked (unreachable, TLS refused, the service bind failed).

    Not a login failure: the caller decides what a down directory means (local break-glass accounts still
    log in; directory users do not)."""


@dataclass(frozen=True)
class DirectoryUser:
    """One person as the directory has them. `groups` are the groups' short names (an LDAP group's cn, an
    OIDC groups claim's values), which `ldap_group_roles` / `ldap_group_projects` map."""

    username: str
    source_id: str  # the LDAP entry's DN, or the OIDC issuer and subject: which record this is
    full_name: str = ""
    uid: int | None = None  # uidNumber / gidNumber: None where the directory has no POSIX identity
    gid: int | None = None
    home: str | None = None
    shell: str | None = None
    ssh_keys: tuple[str, ...] = ()
    groups: frozenset[str] = field(default_factory=frozenset)
    enabled: bool = True  # False for an account the directory marks disabled or locked
