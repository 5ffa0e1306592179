"""The LDAP client's checks that need no directory: what the settings refuse, and names refused before any
request (the URL here has nothing listening, so a request would fail as DirectoryUnavailable instead)."""

from __future__ import annotations

from typing import Any

import pytest

from gpufleet.core.errors import ConfigError, Unauthorized
from gpufleet.directory.ldap import REFUSED, LdapConfig, LdapDirectory


def config(**overrides: Any) -> LdapConfig:
    values: dict[str, Any] = {
        "urls": ("ldaps://127.0.0.1:9",),
        "bind_dn": "cn=reader,dc=example,dc=org",
        "bind_password": "secret",
        "user_base": "ou=people,dc=example,dc=org",
        "group_base": "ou=groups,dc=example,dc=org",
    }
    return LdapConfig(**(values | overrides))


def test_plain_ldap_is_refused_naming_the_setting() -> None:
    with pytest.raises(ConfigError, match="ldap_allow_plain"):
        config(urls=("ldap://ldap.example.org",), starttls=False)


def test_plain_ldap_when_allowed_and_starttls_by_default() -> None:
    assert config(urls=("ldap://ldap.example.org",), starttls=False, allow_plain=True).allow_plain
    assert config(urls=("ldap://ldap.example.org:389",)).starttls
    assert config(urls=("ldaps://a.example.org", "ldaps://b.example.org:636")).urls[1].endswith(":636")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"urls": ()}, "ldap_urls"),
        ({"urls": ("https://ldap.example.org",)}, "ldap_urls"),
        ({"urls": ("ldaps://",)}, "ldap_urls"),
        ({"urls": ("ldaps://ldap.example.org/dc=example,dc=org",)}, "ldap_urls"),
        ({"urls": ("ldaps://ldap.example.org:port",)}, "ldap_urls"),
        ({"bind_password": ""}, "ldap_bind_password"),
        ({"bind_dn": ""}, "ldap_bind_dn"),
        ({"user_base": ""}, "ldap_user_base"),
        ({"user_filter": "objectClass=posixAccount"}, "ldap_user_filter"),
        ({"disabled_filter": "nsAccountLock=TRUE"}, "ldap_disabled_filter"),
        ({"timeout_s": 0}, "ldap_timeout_s"),
    ],
)
def test_bad_settings_are_refused(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config(**overrides)


def test_other_directories_disabled_filters_are_accepted() -> None:
    for expression in ("(nsAccountLock=TRUE)", "(userAccountControl:1.2.840.113556.1.4.803:=2)", None, ""):
        assert config(disabled_filter=expression).disabled_filter == expression


@pytest.mark.parametrize(
    ("username", "password"),
    [("alice", ""), ("Alice", "pw"), ("*", "pw"), ("*)(uid=*", "pw"), ("a" * 33, "pw"), ("", "pw"), ("al ice", "pw")],
)
def test_refused_before_asking_the_directory(username: str, password: str) -> None:
    with pytest.raises(Unauthorized) as caught:
        LdapDirectory(config()).authenticate(username, password)
    assert str(caught.value) == REFUSED


@pytest.mark.parametrize("username", ["Alice", "*", "*)(uid=*", "", "a" * 33])
def test_find_of_a_name_that_cannot_be_a_user_asks_nothing(username: str) -> None:
    assert LdapDirectory(config()).find(username) is None
