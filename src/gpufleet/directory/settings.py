"""From the head's settings to the directory's parts: the group mappings, the LDAP directory, the identity
provider. Secrets (the bind password, the client secret) are read from their files here, once, at start."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from gpufleet.auth.identity import IdentityProvider, LocalPasswords
from gpufleet.core.clock import Clock
from gpufleet.core.config import Settings
from gpufleet.core.errors import ConfigError
from gpufleet.directory.identity import DirectoryIdentity
from gpufleet.directory.ldap import LdapConfig, LdapDirectory
from gpufleet.directory.mapping import GroupMapping
from gpufleet.directory.oidc import OidcClient, OidcConfig


def mappings(settings: Settings) -> dict[str, GroupMapping]:
    """Each configured source's group mapping: ldap when it is the identity provider, oidc when SSO is set."""
    found: dict[str, GroupMapping] = {}
    if settings.identity_provider == "ldap":
        found["ldap"] = GroupMapping.of(
            settings.ldap_group_roles, settings.ldap_group_projects, settings.ldap_default_role
        )
    if settings.oidc_issuer is not None:
        found["oidc"] = GroupMapping.of(
            settings.oidc_group_roles, settings.oidc_group_projects, settings.oidc_default_role
        )
    return found


def read_secret(path: Path | None, setting: str) -> str:
    """A secret's file's content, without its final newline. ConfigError naming the setting when unreadable."""
    if path is None:
        raise ConfigError(f"{setting} is not set")
    try:
        return path.read_text().rstrip("\n")
    except OSError as e:
        raise ConfigError(f"{setting}: cannot read {path}: {e.strerror}") from e


def ldap_config(settings: Settings) -> LdapConfig:
    """The `ldap_` settings as the LDAP client's. ConfigError for what is missing or unreadable."""
    return LdapConfig(
        urls=tuple(settings.ldap_urls),
        bind_dn=settings.ldap_bind_dn,
        bind_password=read_secret(settings.ldap_bind_password_file, "ldap_bind_password_file"),
        user_base=settings.ldap_user_base,
        group_base=settings.ldap_group_base,
        starttls=settings.ldap_starttls,
        ca_file=settings.ldap_ca_file,
        allow_plain=settings.ldap_allow_plain,
        user_filter=settings.ldap_user_filter,
        username_attr=settings.ldap_username_attr,
        group_filter=settings.ldap_group_filter,
        disabled_filter=settings.ldap_disabled_filter or None,
        timeout_s=settings.ldap_timeout_s,
    )


def oidc_client(settings: Settings) -> OidcClient | None:
    """Single sign-on's provider, where `oidc_issuer` is set (the client secret read from its file)."""
    if settings.oidc_issuer is None:
        return None
    if not settings.oidc_client_id:
        raise ConfigError("oidc_client_id must be set with oidc_issuer")
    secret = None
    if settings.oidc_client_secret_file is not None:
        secret = read_secret(settings.oidc_client_secret_file, "oidc_client_secret_file")
    config = OidcConfig(
        issuer=settings.oidc_issuer,
        client_id=settings.oidc_client_id,
        client_secret=secret,
        cli_client_id=settings.oidc_cli_client_id or None,
        scopes=tuple(settings.oidc_scopes),
        username_claim=settings.oidc_username_claim,
        groups_claim=settings.oidc_groups_claim,
        ca_file=settings.oidc_ca_file,
        leeway_s=settings.oidc_leeway_s,
    )
    return OidcClient(config)


@dataclass(frozen=True)
class LdapSource:
    """The LDAP directory and its group mapping, for the leader's scheduled sync (workers.directory_loops)."""

    directory: LdapDirectory
    mapping: GroupMapping


def identity(
    settings: Settings, sessions: sessionmaker[Session], clock: Clock
) -> tuple[IdentityProvider, LdapSource | None]:
    """The identity provider `identity_provider` names, and for ldap the directory the leader syncs from."""
    if settings.identity_provider == "local":
        return LocalPasswords(), None
    source = LdapSource(LdapDirectory(ldap_config(settings)), mappings(settings)["ldap"])
    return DirectoryIdentity(sessions, clock, source.directory, source.mapping), source
