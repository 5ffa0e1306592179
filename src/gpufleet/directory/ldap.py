"""The site's LDAP directory (OpenLDAP, 389 DS / FreeIPA, Active Directory) read with ldap3.

gpufleet reads the directory as a service account and checks a password by binding as the user's entry.
Every request opens its own connections and closes them, so one `LdapDirectory` is safe to share between
threads. TLS is always verified: ldaps://, or ldap:// with StartTLS; plain ldap:// only where
`ldap_allow_plain` says so (tests). A directory that cannot be asked raises `DirectoryUnavailable`, never an
ldap3 exception, so the caller can tell "down" from "wrong password". Every network call catches Exception:
besides its LDAPException, ldap3 lets through what its socket and BER code raise (OSError, struct.error,
pyasn1's errors).
"""

from __future__ import annotations

import logging
import math
import re
import ssl
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from ldap3 import NONE, SIMPLE, SYNC, Connection, Server, Tls
from ldap3.core.exceptions import LDAPInvalidDnError
from ldap3.utils.conv import escape_filter_chars
from ldap3.utils.dn import parse_dn

from gpufleet.auth.users import USERNAME
from gpufleet.core.config_directory import DEFAULT_GROUP_FILTER
from gpufleet.core.errors import ConfigError, Unauthorized
from gpufleet.directory.records import DirectoryUnavailable, DirectoryUser

log = logging.getLogger(__name__)

# The one answer to every refused login, so a caller cannot learn which names exist or are disabled.
REFUSED = "unknown user name or wrong password"
MEMBER_ATTRS = ("member", "uniqueMember")  # member DNs: groupOfNames, AD's group; groupOfUniqueNames
MEMBER_UID_ATTR = "memberUid"  # member user names: posixGroup (RFC 2307)
PAGED_RESULTS = "1.2.840.113556.1.4.319"
# Bind results that mean the credentials were refused (48 inappropriateAuthentication, 49 invalidCredentials,
# 50 insufficientAccessRights, 53 unwillingToPerform); anything else is the directory failing.
REFUSED_BIND_RESULTS = frozenset({48, 49, 50, 53})


@dataclass(frozen=True)
class LdapConfig:
    """Where the directory is and how its entries are read (the `ldap_` settings)."""

    urls: tuple[str, ...]
    bind_dn: str
    bind_password: str
    user_base: str
    group_base: str
    starttls: bool = True
    ca_file: Path | None = None  # None: the system's CAs; verification itself is never off
    allow_plain: bool = False
    user_filter: str = "(objectClass=posixAccount)"
    username_attr: str = "uid"
    group_filter: str = DEFAULT_GROUP_FILTER
    group_name_attr: str = "cn"
    disabled_filter: str | None = "(pwdAccountLockedTime=*)"  # None or "": the directory disables nobody
    full_name_attr: str = "cn"
    uid_attr: str = "uidNumber"
    gid_attr: str = "gidNumber"
    home_attr: str = "homeDirectory"
    shell_attr: str = "loginShell"
    ssh_key_attr: str = "sshPublicKey"
    member_of_attr: str = "memberOf"
    timeout_s: float = 5.0  # per server: connecting, and each request
    page_size: int = 500  # entries per page of a paged search (AD serves at most 1000)

    def __post_init__(self) -> None:
        if not self.urls:
            raise ConfigError("ldap_urls: name at least one ldaps:// or ldap:// server")
        for url in self.urls:
            parts = urlsplit(url)
            if parts.scheme not in ("ldap", "ldaps") or not parts.hostname or parts.path not in ("", "/"):
                raise ConfigError(f"ldap_urls: {url!r} is not ldaps://HOST[:PORT] or ldap://HOST[:PORT]")
            try:
                parts.port  # noqa: B018 (raises on a port that is not a number)
            except ValueError as e:
                raise ConfigError(f"ldap_urls: {url!r}: {e}") from e
            if parts.scheme == "ldap" and not self.starttls and not self.allow_plain:
                raise ConfigError(
                    f"ldap_urls: {url} without StartTLS would send passwords in clear; use ldaps://, "
                    "ldap_starttls = true, or (tests only) ldap_allow_plain = true"
                )
        for name, setting in (
            ("bind_dn", "ldap_bind_dn"),
            # An empty bind password is an unauthenticated bind, which servers answer with success.
            ("bind_password", "ldap_bind_password_file (the service account's password)"),
            ("user_base", "ldap_user_base"),
            ("group_base", "ldap_group_base"),
        ):
            if not getattr(self, name):
                raise ConfigError(f"{setting} must be set")
        for name in ("user_filter", "group_filter", "disabled_filter"):
            value = getattr(self, name)
            if value and not (value.startswith("(") and value.endswith(")")):
                raise ConfigError(f"ldap_{name}: {value!r} is not an LDAP filter in parentheses")
        if self.timeout_s <= 0 or self.page_size < 1:
            raise ConfigError("ldap_timeout_s must be above 0 and the page size at least 1")


class _Failed(Exception):
    """One server could not be used; the message names the URL and what failed."""


class VerifiedTls(Tls):
    """TLS with the host name checked by Python's ssl module. ldap3 turns the context's check off and does its
    own with ssl.match_hostname, which Python 3.12 removed."""

    def __init__(self, ca_data: str | None) -> None:
        super().__init__(validate=ssl.CERT_REQUIRED, ca_certs_data=ca_data)
        self._ca_data = ca_data

    def wrap_socket(self, connection: Any, do_handshake: bool = False) -> None:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=self._ca_data)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        connection.socket = context.wrap_socket(
            connection.socket, server_hostname=connection.server.host, do_handshake_on_connect=do_handshake
        )


class LdapDirectory:
    """gpufleet's users as the directory lists them (`directory.identity.Directory`)."""

    def __init__(self, config: LdapConfig) -> None:
        self.config = config

    def check(self) -> None:
        """A service bind on the first server that takes it. Raises DirectoryUnavailable."""
        conn, _ = self._service()
        _close(conn)

    def find(self, username: str) -> DirectoryUser | None:
        """The user of that name, enabled or not; None if the directory has no such user (or several)."""
        if not USERNAME.fullmatch(username):
            return None
        conn, url = self._service()
        try:
            return self._person(conn, url, username)
        finally:
            _close(conn)

    def authenticate(self, username: str, password: str) -> DirectoryUser:
        """The user these credentials prove: found by the service account, then a bind as their entry.
        Raises Unauthorized (the same message for every refusal), or DirectoryUnavailable."""
        if not password or not USERNAME.fullmatch(username):
            raise Unauthorized(REFUSED)
        conn, url = self._service()
        try:
            person = self._person(conn, url, username)
        finally:
            _close(conn)
        if person is None or not person.enabled:
            raise Unauthorized(REFUSED)
        # The same server that found the entry checks the password: a replica that lags cannot disagree.
        user_conn = self._open(url, person.source_id, password)
        try:
            bound = user_conn.bind()
            result = user_conn.result or {}
        except Exception as e:
            raise DirectoryUnavailable(f"{url}: bind as a user failed: {_reason(e)}") from e
        finally:
            _close(user_conn)
        if bound:
            return person
        if result.get("result") in REFUSED_BIND_RESULTS:
            raise Unauthorized(REFUSED)
        raise DirectoryUnavailable(f"{url}: bind as a user failed: {_describe(result)}")

    def users(self) -> list[DirectoryUser]:
        """Every entry under the user base that user_filter matches, with their groups; disabled ones marked.
        Entries whose name cannot be a gpufleet user name, and names several entries share, are left out."""
        cfg = self.config
        conn, url = self._service()
        try:
            entries = list(self._search(conn, url, cfg.user_base, cfg.user_filter, self._user_attrs()))
            disabled: set[tuple[tuple[str, str], ...]] = set()
            if cfg.disabled_filter:
                disabled_filter = f"(&{cfg.user_filter}{cfg.disabled_filter})"
                disabled = {_dn_key(dn) for dn, _ in self._search(conn, url, cfg.user_base, disabled_filter, ["1.1"])}
            groups = _GroupIndex(cfg, self._search(conn, url, cfg.group_base, cfg.group_filter, self._group_attrs()))
        finally:
            _close(conn)
        by_name: dict[str, list[tuple[str, Mapping[str, list[bytes]]]]] = {}
        for dn, attrs in entries:
            name = self._username(dn, attrs)
            if name is not None:
                by_name.setdefault(name, []).append((dn, attrs))
        people = []
        for name, found in sorted(by_name.items()):
            if len(found) > 1:
                log.warning("directory user %s left out: %d entries have that name", name, len(found))
                continue
            dn, attrs = found[0]
            names = groups.of(dn, name) | groups.from_member_of(_values(attrs, cfg.member_of_attr))
            people.append(self._user(dn, name, attrs, frozenset(names), _dn_key(dn) not in disabled))
        return people

    # -- reading one user

    def _person(self, conn: Connection, url: str, username: str) -> DirectoryUser | None:
        cfg = self.config
        name_filter = f"(&{cfg.user_filter}({cfg.username_attr}={escape_filter_chars(username)}))"
        found = [
            (dn, attrs)
            for dn, attrs in self._search(conn, url, cfg.user_base, name_filter, self._user_attrs())
            if self._username(dn, attrs) == username
        ]
        if len(found) != 1:
            if found:
                log.warning("directory user %s refused: %d entries have that name", username, len(found))
            return None
        dn, attrs = found[0]
        enabled = True
        if cfg.disabled_filter:
            enabled = not any(True for _ in self._search(conn, url, dn, cfg.disabled_filter, ["1.1"], scope="BASE"))
        escaped_dn = escape_filter_chars(dn)
        member_filter = "".join(f"({attr}={escaped_dn})" for attr in MEMBER_ATTRS)
        group_filter = f"(&{cfg.group_filter}(|{member_filter}({MEMBER_UID_ATTR}={escape_filter_chars(username)})))"
        groups = _GroupIndex(cfg, self._search(conn, url, cfg.group_base, group_filter, self._group_attrs()))
        names = groups.of(dn, username) | groups.from_member_of(_values(attrs, cfg.member_of_attr))
        return self._user(dn, username, attrs, frozenset(names), enabled)

    def _username(self, dn: str, attrs: Mapping[str, list[bytes]]) -> str | None:
        """The entry's user name: the first value of username_attr that gpufleet accepts as one."""
        values = _values(attrs, self.config.username_attr)
        for value in values:
            if USERNAME.fullmatch(value):
                return value
        log.debug("directory entry %s left out: no valid user name in %s", dn, values)
        return None

    def _user(
        self, dn: str, username: str, attrs: Mapping[str, list[bytes]], groups: frozenset[str], enabled: bool
    ) -> DirectoryUser:
        cfg = self.config
        return DirectoryUser(
            username=username,
            source_id=dn,
            full_name=_first(attrs, cfg.full_name_attr) or "",
            uid=_int(_first(attrs, cfg.uid_attr)),
            gid=_int(_first(attrs, cfg.gid_attr)),
            home=_first(attrs, cfg.home_attr),
            shell=_first(attrs, cfg.shell_attr),
            # Values of an LDAP attribute have no order: sorted, so that a re-read is no change.
            ssh_keys=tuple(sorted(key for key in _values(attrs, cfg.ssh_key_attr) if key)),
            groups=groups,
            enabled=enabled,
        )

    def _user_attrs(self) -> list[str]:
        cfg = self.config
        names = (cfg.username_attr, cfg.full_name_attr, cfg.uid_attr, cfg.gid_attr, cfg.home_attr, cfg.shell_attr)
        return list(dict.fromkeys((*names, cfg.ssh_key_attr, cfg.member_of_attr)))

    def _group_attrs(self) -> list[str]:
        return list(dict.fromkeys((self.config.group_name_attr, *MEMBER_ATTRS, MEMBER_UID_ATTR)))

    # -- connections and searches

    def _service(self) -> tuple[Connection, str]:
        """A connection bound as the service account, and its URL: each URL in turn, the first that works."""
        problems = []
        for url in self.config.urls:
            try:
                conn = self._open(url, self.config.bind_dn, self.config.bind_password)
            except _Failed as e:
                problems.append(str(e))
                continue
            try:
                if conn.bind():
                    return conn, url
                problems.append(f"{url}: the service bind as {self.config.bind_dn} failed: {_describe(conn.result)}")
            except Exception as e:
                problems.append(f"{url}: the service bind as {self.config.bind_dn} failed: {_reason(e)}")
            _close(conn)
        raise DirectoryUnavailable("; ".join(problems))

    def _open(self, url: str, user: str, password: str) -> Connection:
        """An open connection to `url`, TLS started where asked, not yet bound. Raises _Failed."""
        cfg = self.config
        parts = urlsplit(url)
        secure = parts.scheme == "ldaps"
        try:
            ca_data = cfg.ca_file.read_text() if cfg.ca_file is not None else None
        except OSError as e:
            raise _Failed(f"{url}: the CA file {cfg.ca_file} cannot be read: {e.strerror}") from e
        tls = VerifiedTls(ca_data) if secure or cfg.starttls else None
        server = Server(
            parts.hostname or "",
            port=parts.port or (636 if secure else 389),
            use_ssl=secure,
            tls=tls,
            get_info=NONE,
            connect_timeout=cfg.timeout_s,
        )
        conn = Connection(
            server,
            user=user,
            password=password,
            authentication=SIMPLE,
            client_strategy=SYNC,
            auto_bind=False,
            read_only=True,
            raise_exceptions=False,
            auto_referrals=False,
            receive_timeout=math.ceil(cfg.timeout_s),  # ldap3 packs it into SO_RCVTIMEO as whole seconds
        )
        try:
            conn.open()
        except Exception as e:
            _close(conn)
            what = "TLS failed" if secure and _is_tls(e) else "cannot connect"
            raise _Failed(f"{url}: {what}: {_reason(e)}") from e
        if not secure and cfg.starttls:
            try:
                started = conn.start_tls()
            except Exception as e:
                _close(conn)
                raise _Failed(f"{url}: StartTLS failed: {_reason(e)}") from e
            if not started:
                _close(conn)
                raise _Failed(f"{url}: StartTLS failed: {_describe(conn.result)}")
        return conn

    def _search(
        self,
        conn: Connection,
        url: str,
        base: str,
        search_filter: str,
        attributes: Sequence[str],
        scope: Literal["BASE", "SUBTREE"] = "SUBTREE",
    ) -> Iterator[tuple[str, Mapping[str, list[bytes]]]]:
        """(DN, raw attributes) of each entry found, page by page. Raises DirectoryUnavailable."""
        cookie: bytes | None = None
        while True:
            try:
                conn.search(
                    base,
                    search_filter,
                    search_scope=scope,
                    dereference_aliases="NEVER",
                    attributes=list(attributes),
                    time_limit=max(1, round(self.config.timeout_s)),
                    paged_size=self.config.page_size if scope == "SUBTREE" else None,
                    paged_cookie=cookie,
                )
            except Exception as e:
                raise DirectoryUnavailable(f"{url}: search of {base} failed: {_reason(e)}") from e
            result = conn.result or {}
            if result.get("result") == 32 and scope == "BASE":  # noSuchObject: the entry has gone
                return
            if result.get("result") != 0:
                raise DirectoryUnavailable(f"{url}: search of {base} for {search_filter} failed: {_describe(result)}")
            for item in conn.response or []:
                if item.get("type") == "searchResEntry":
                    yield item["dn"], item.get("raw_attributes", {})
            control = (result.get("controls") or {}).get(PAGED_RESULTS)
            cookie = control["value"]["cookie"] if control else None
            if not cookie:
                return


class _GroupIndex:
    """The groups read from the directory, by member DN, by memberUid and by their own DN."""

    def __init__(self, config: LdapConfig, entries: Iterator[tuple[str, Mapping[str, list[bytes]]]]) -> None:
        self.config = config
        self.base = _dn_key(config.group_base)
        self.by_member: dict[tuple[tuple[str, str], ...], set[str]] = {}
        self.by_member_uid: dict[str, set[str]] = {}
        self.by_dn: dict[tuple[tuple[str, str], ...], str] = {}
        for dn, attrs in entries:
            name = _first(attrs, config.group_name_attr)
            if not name:
                continue
            self.by_dn[_dn_key(dn)] = name
            for attr in MEMBER_ATTRS:
                for member in _values(attrs, attr):
                    self.by_member.setdefault(_dn_key(member), set()).add(name)
            for member_uid in _values(attrs, MEMBER_UID_ATTR):
                self.by_member_uid.setdefault(member_uid, set()).add(name)

    def of(self, dn: str, username: str) -> set[str]:
        """The groups naming this user as a member, by DN or by user name."""
        return self.by_member.get(_dn_key(dn), set()) | self.by_member_uid.get(username, set())

    def from_member_of(self, member_of: Sequence[str]) -> set[str]:
        """The short names of the memberOf values under the group base. These add what a member search cannot
        see: FreeIPA's memberOf lists nested groups, and dynamic groups have no member values."""
        names = set()
        for dn in member_of:
            key = _dn_key(dn)
            if len(key) <= len(self.base) or key[-len(self.base) :] != self.base:
                continue
            name = self.by_dn.get(key) or _rdn_value(dn, self.config.group_name_attr)
            if name:
                names.add(name)
        return names


def _values(attrs: Mapping[str, list[bytes]], name: str) -> list[str]:
    """An attribute's values as text (attribute names are case-insensitive; ldap3 keeps the server's case)."""
    raw = attrs.get(name)
    if raw is None:
        lowered = name.lower()
        raw = next((v for k, v in attrs.items() if k.lower() == lowered), [])
    return [v.decode("utf-8", "replace").strip() if isinstance(v, bytes) else str(v).strip() for v in raw]


def _first(attrs: Mapping[str, list[bytes]], name: str) -> str | None:
    values = _values(attrs, name)
    return values[0] if values else None


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _dn_key(dn: str) -> tuple[tuple[str, str], ...]:
    """A DN in a form two spellings of it share: attribute types and values lowercased, spaces stripped."""
    try:
        return tuple((attr.strip().lower(), value.strip().lower()) for attr, value, _ in parse_dn(dn))
    except LDAPInvalidDnError:
        return (("", dn.strip().lower()),)


def _rdn_value(dn: str, attr: str) -> str | None:
    """The value of the DN's first component where that is `attr` (cn=ml-nlp,... -> ml-nlp)."""
    try:
        first = parse_dn(dn)[0]
    except (LDAPInvalidDnError, IndexError):
        return None
    return str(first[1]).strip() if str(first[0]).strip().lower() == attr.lower() else None


def _describe(result: Mapping[str, Any] | None) -> str:
    if not result:
        return "no answer"
    message = f": {result['message']}" if result.get("message") else ""
    return f"{result.get('description', 'error')} ({result.get('result')}){message}"


def _reason(error: BaseException) -> str:
    """The error's text without the tuple reprs ldap3 wraps it in when it re-raises: ('("...",)',)."""
    text = str(error)
    for _ in range(4):
        quoted = re.fullmatch(r"""\(\s*(['"])(.*)\1,?\s*\)""", text, re.DOTALL)
        if quoted is None:
            break
        text = quoted.group(2).replace("\\'", "'").replace('\\"', '"')
    return text


def _is_tls(error: BaseException) -> bool:
    text = str(error).lower()
    return isinstance(error, ssl.SSLError) or "ssl" in text or "certificate" in text


def _close(conn: Connection) -> None:
    """Unbind, and close the socket, which ldap3 leaves open when connecting or TLS failed."""
    try:
        conn.unbind()
    except Exception:
        log.debug("unbinding an LDAP connection failed", exc_info=True)
    sock = getattr(conn, "socket", None)
    if sock is not None:
        sock.close()
