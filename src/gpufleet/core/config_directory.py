"""The settings for users from the site's directory (LDAP) and single sign-on (OpenID Connect).

Kept apart from `core.config` to keep that module readable; `Settings` inherits these fields, so they
are set like any other (`ldap_urls = [...]` in the config file, GPUFLEET_LDAP_URLS in the environment).
Secrets are never settings: the bind password and the client secret are read from the files named here.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings

# The roles a group may map to (auth.policy.Role, less `node`): core may not import auth.
USER_ROLES = ("admin", "operator", "member", "viewer")
DEFAULT_GROUP_FILTER = (
    "(|(objectClass=groupOfNames)(objectClass=groupOfUniqueNames)(objectClass=posixGroup)(objectClass=group))"
)


def _check_roles(value: dict[str, str]) -> dict[str, str]:
    bad = {group: role for group, role in value.items() if role not in USER_ROLES}
    if bad:
        raise ValueError(f"unknown roles {bad}: a group maps to one of {', '.join(USER_ROLES)}")
    return value


class DirectorySettings(BaseSettings):
    identity_provider: str = Field(
        "local",
        description="who checks user names and passwords: local (gpufleet's own users) or ldap (the directory; "
        "local accounts still log in, as the break-glass path)",
    )
    ldap_urls: list[str] = Field(
        default_factory=list, description="the directory's servers, ldaps://HOST or ldap://HOST; several are replicas"
    )
    ldap_starttls: bool = Field(True, description="StartTLS on ldap:// URLs")
    ldap_ca_file: Path | None = Field(None, description="CA certificate the directory's servers are checked against")
    ldap_allow_plain: bool = Field(False, description="allow ldap:// without StartTLS (passwords in clear: tests only)")
    ldap_bind_dn: str = Field("", description="the service account gpufleet reads the directory as")
    ldap_bind_password_file: Path | None = Field(None, description="file holding the service account's password")
    ldap_user_base: str = Field("", description="where users are searched, e.g. ou=people,dc=example,dc=org")
    ldap_user_filter: str = Field("(objectClass=posixAccount)", description="which entries are gpufleet users")
    ldap_username_attr: str = Field("uid", description="the attribute holding the user name (AD: sAMAccountName)")
    ldap_group_base: str = Field("", description="where groups are searched, e.g. ou=groups,dc=example,dc=org")
    ldap_group_filter: str = Field(DEFAULT_GROUP_FILTER, description="which entries are groups")
    ldap_disabled_filter: str = Field(
        "(pwdAccountLockedTime=*)",
        description="a filter matching disabled accounts: OpenLDAP (pwdAccountLockedTime=*), 389 DS / FreeIPA "
        "(nsAccountLock=TRUE), AD (userAccountControl:1.2.840.113556.1.4.803:=2); empty: none",
    )
    ldap_group_roles: dict[str, str] = Field(
        default_factory=dict, description="directory group -> gpufleet role; a user in several gets the highest"
    )
    ldap_group_projects: dict[str, str] = Field(
        default_factory=dict, description="directory group -> gpufleet project its members belong to"
    )
    ldap_default_role: str = Field("member", description="the role of a directory user in no mapped group")
    ldap_sync_interval_s: float = Field(
        300.0, ge=10, le=86400, description="how often the leader reads every directory user again"
    )
    ldap_timeout_s: float = Field(5.0, gt=0, le=120, description="how long one directory request may take")

    oidc_issuer: str | None = Field(None, description="the single sign-on provider's issuer URL; unset: no SSO")
    oidc_client_id: str = Field("", description="the dashboard's client id at the provider")
    oidc_client_secret_file: Path | None = Field(None, description="file holding the dashboard client's secret")
    oidc_cli_client_id: str = Field("", description="the CLI's public client id (device grant); empty: oidc_client_id")
    oidc_scopes: list[str] = Field(
        default_factory=lambda: ["openid", "profile", "email", "groups"], description="scopes asked for"
    )
    oidc_username_claim: str = Field("preferred_username", description="the ID token claim holding the user name")
    oidc_groups_claim: str = Field("groups", description="the ID token claim listing the user's groups")
    oidc_ca_file: Path | None = Field(None, description="CA certificate the provider's https is checked against")
    oidc_leeway_s: int = Field(60, ge=0, le=600, description="clock skew allowed on an ID token's times")
    oidc_group_roles: dict[str, str] = Field(default_factory=dict, description="groups claim value -> gpufleet role")
    oidc_group_projects: dict[str, str] = Field(
        default_factory=dict, description="groups claim value -> gpufleet project its members belong to"
    )
    oidc_default_role: str = Field("member", description="the role of a signed-in user in no mapped group")

    @field_validator("identity_provider")
    @classmethod
    def _check_identity_provider(cls, value: str) -> str:
        if value not in ("local", "ldap"):
            raise ValueError("identity_provider is local or ldap (single sign-on is set with oidc_issuer)")
        return value

    @field_validator("ldap_group_roles", "oidc_group_roles")
    @classmethod
    def _check_group_roles(cls, value: dict[str, str]) -> dict[str, str]:
        return _check_roles(value)

    @field_validator("ldap_default_role", "oidc_default_role")
    @classmethod
    def _check_default_role(cls, value: str) -> str:
        return _check_roles({"default": value})["default"]
