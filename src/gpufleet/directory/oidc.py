"""The relying party of single sign-on: OpenID Connect discovery, the authorization code flow with PKCE, and
the checking of ID tokens (the dashboard's and the ones the CLI brings back from the device grant).

Keys and tokens are handled by joserfc (authlib's JOSE library); HTTP by httpx. Every refusal of a token is
an `Unauthorized` with a short reason; a provider that cannot be reached is `DirectoryUnavailable`.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
import json
import secrets
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import httpx
from authlib.oauth2.rfc7636 import create_s256_code_challenge
from joserfc import jwt
from joserfc.errors import BadSignatureError, JoseError
from joserfc.jwk import JWKRegistry, Key

from gpufleet.auth.users import USERNAME
from gpufleet.core.errors import ConfigError, Unauthorized
from gpufleet.directory.records import DirectoryUnavailable, DirectoryUser

# Asymmetric algorithms only: `none` and the HS* family are never accepted, so a token cannot be "signed"
# with nothing or with the provider's public key used as an HMAC secret.
ALLOWED_ALGS: dict[str, str] = {
    "RS256": "RSA",
    "RS384": "RSA",
    "RS512": "RSA",
    "PS256": "RSA",
    "PS384": "RSA",
    "PS512": "RSA",
    "ES256": "EC",
    "ES384": "EC",
    "ES512": "EC",
    "EdDSA": "OKP",
}
DISCOVERY_TTL_S = 3600.0
JWKS_TTL_S = 3600.0
# An unknown `kid` refetches the JWKS at most this often: a flood of bad tokens cannot flood the provider.
JWKS_REFETCH_MIN_S = 10.0
LOOPBACK_NAMES = ("localhost",)


def _is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class OidcConfig:
    """Where the provider is and who gpufleet is to it."""

    issuer: str
    client_id: str
    client_secret: str | None = None
    cli_client_id: str | None = None  # the public client of the device grant; None: the same as client_id
    scopes: tuple[str, ...] = ("openid", "profile", "email", "groups")
    username_claim: str = "preferred_username"
    groups_claim: str = "groups"
    ca_file: Path | None = None
    leeway_s: int = 60  # clock skew allowed on exp, iat and nbf
    timeout_s: float = 10

    def __post_init__(self) -> None:
        parts = urlsplit(self.issuer)
        # Plain http would let anyone on the path swap the provider's keys; only a provider on this host may use it.
        if parts.scheme != "https" and not (parts.scheme == "http" and _is_loopback(parts.hostname or "")):
            raise ConfigError(f"OIDC issuer {self.issuer!r} must be an https URL (http only on a loopback address)")
        if parts.query or parts.fragment:
            raise ConfigError(f"OIDC issuer {self.issuer!r} must not have a query or fragment")
        if "openid" not in self.scopes:
            raise ConfigError("OIDC scopes must include 'openid'")
        if self.leeway_s < 0:
            raise ConfigError("OIDC leeway_s must not be negative")

    @property
    def device_client_id(self) -> str:
        return self.cli_client_id or self.client_id


@dataclass(frozen=True)
class LoginStart:
    """Where to send the browser, and what to keep (server-side or in a signed cookie) until it comes back."""

    url: str
    state: str
    nonce: str
    code_verifier: str


def _b64json(segment: str) -> dict[str, Any]:
    try:
        value = json.loads(base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4)))
    except (binascii.Error, ValueError) as exc:
        raise Unauthorized("malformed ID token") from exc
    if not isinstance(value, dict):
        raise Unauthorized("malformed ID token")
    return value


class OidcClient:
    """One provider, as the head sees it. Thread-safe: the discovery document and the JWKS are cached."""

    def __init__(
        self, config: OidcConfig, http: httpx.Client | None = None, clock: Callable[[], float] = time.time
    ) -> None:
        self.config = config
        self._http = http or httpx.Client(verify=self._tls(config), timeout=config.timeout_s)
        self._clock = clock
        self._lock = threading.Lock()
        self._discovery: dict[str, Any] | None = None
        self._discovery_at = 0.0
        self._keys: dict[str, Key] = {}
        self._unnamed: list[Key] = []  # JWKS keys without a `kid`
        self._jwks_at: float | None = None

    @staticmethod
    def _tls(config: OidcConfig) -> ssl.SSLContext | bool:
        if config.ca_file is None:
            return True
        if not config.ca_file.is_file():
            raise ConfigError(f"OIDC CA file {config.ca_file} does not exist")
        return ssl.create_default_context(cafile=str(config.ca_file))

    # --- provider documents -------------------------------------------------------------------------------

    def _get_json(self, url: str, what: str) -> dict[str, Any]:
        try:
            response = self._http.get(url, headers={"Accept": "application/json"})
        except httpx.HTTPError as exc:
            raise DirectoryUnavailable(f"OIDC provider unreachable ({what}): {exc}") from exc
        if response.status_code != 200:
            raise DirectoryUnavailable(f"OIDC provider answered {response.status_code} for its {what}")
        try:
            body = response.json()
        except ValueError as exc:
            raise DirectoryUnavailable(f"OIDC provider's {what} is not JSON") from exc
        if not isinstance(body, dict):
            raise DirectoryUnavailable(f"OIDC provider's {what} is not a JSON object")
        return body

    def discovery(self) -> dict[str, Any]:
        """The provider's metadata, fetched again after DISCOVERY_TTL_S."""
        with self._lock:
            if self._discovery is not None and self._clock() - self._discovery_at < DISCOVERY_TTL_S:
                return self._discovery
        url = self.config.issuer.rstrip("/") + "/.well-known/openid-configuration"
        document = self._get_json(url, "discovery document")
        # OIDC Discovery 4.3: the issuer must be exactly the one configured, or its keys could be anyone's.
        if document.get("issuer") != self.config.issuer:
            raise ConfigError(
                f"OIDC discovery names issuer {document.get('issuer')!r}, not the configured {self.config.issuer!r}"
            )
        for field in ("authorization_endpoint", "token_endpoint", "jwks_uri"):
            if not isinstance(document.get(field), str):
                raise ConfigError(f"OIDC discovery document has no {field}")
        with self._lock:
            self._discovery, self._discovery_at = document, self._clock()
        return document

    def authorization_endpoint(self) -> str:
        return str(self.discovery()["authorization_endpoint"])

    def token_endpoint(self) -> str:
        return str(self.discovery()["token_endpoint"])

    def device_endpoint(self) -> str:
        """The device authorization endpoint (RFC 8628), where the CLI starts its sign-in."""
        endpoint = self.discovery().get("device_authorization_endpoint")
        if not isinstance(endpoint, str):
            raise ConfigError("the OIDC provider offers no device authorization endpoint")
        return endpoint

    def _load_jwks(self) -> None:
        document = self._get_json(str(self.discovery()["jwks_uri"]), "JWKS")
        keys: dict[str, Key] = {}
        unnamed: list[Key] = []
        for entry in document.get("keys", []):
            if not isinstance(entry, dict) or entry.get("use", "sig") != "sig":
                continue
            try:
                key = JWKRegistry.import_key(entry)
            except (JoseError, ValueError, TypeError):
                continue  # a key type joserfc does not know cannot sign anything we accept
            if isinstance(entry.get("kid"), str):
                keys[entry["kid"]] = key
            else:
                unnamed.append(key)
        with self._lock:
            self._keys, self._unnamed, self._jwks_at = keys, unnamed, self._clock()

    def _candidates(self, kid: str | None) -> list[Key]:
        with self._lock:
            fetched_at, known = self._jwks_at, kid is not None and kid in self._keys
        now = self._clock()
        if fetched_at is None or now - fetched_at >= JWKS_TTL_S:
            self._load_jwks()
        elif not known and now - fetched_at >= JWKS_REFETCH_MIN_S:
            self._load_jwks()  # the provider may have rotated its keys since
        with self._lock:
            if kid is not None:
                return [self._keys[kid]] if kid in self._keys else []
            return [*self._keys.values(), *self._unnamed]

    # --- tokens --------------------------------------------------------------------------------------------

    def verify_id_token(self, token: str, *, nonce: str | None, audiences: tuple[str, ...]) -> dict[str, Any]:
        """The ID token's claims, once its signature, issuer, audience, times and nonce are right."""
        parts = token.split(".")
        if len(parts) != 3:
            raise Unauthorized("malformed ID token")
        header = _b64json(parts[0])
        alg = header.get("alg")
        if not isinstance(alg, str) or alg not in ALLOWED_ALGS:
            raise Unauthorized(f"ID token algorithm not allowed: {alg}")
        kid = header.get("kid")
        if kid is not None and not isinstance(kid, str):
            raise Unauthorized("malformed ID token")
        keys = [key for key in self._candidates(kid) if key.key_type == ALLOWED_ALGS[alg]]
        if not keys:
            raise Unauthorized("ID token signed by an unknown key")
        claims: dict[str, Any] | None = None
        for key in keys:
            try:
                claims = dict(jwt.decode(token, key, algorithms=[alg]).claims)
                break
            except BadSignatureError:
                continue
            except (JoseError, ValueError) as exc:
                raise Unauthorized("malformed ID token") from exc
        if claims is None:
            raise Unauthorized("bad signature")
        self._check_claims(claims, nonce, audiences)
        return claims

    def _check_claims(self, claims: Mapping[str, Any], nonce: str | None, audiences: tuple[str, ...]) -> None:
        if claims.get("iss") != self.config.issuer:
            raise Unauthorized("wrong issuer")
        aud = claims.get("aud")
        token_audiences = [aud] if isinstance(aud, str) else aud if isinstance(aud, list) else []
        if not any(a in token_audiences for a in audiences):
            raise Unauthorized("wrong audience")
        azp = claims.get("azp")
        # OIDC Core 3.1.3.7: with several audiences the token must say which client it was issued to.
        if (len(token_audiences) > 1 and azp is None) or (azp is not None and azp not in audiences):
            raise Unauthorized("wrong authorized party (azp)")
        now, leeway = self._clock(), self.config.leeway_s
        exp, iat, nbf = claims.get("exp"), claims.get("iat"), claims.get("nbf")
        if not isinstance(exp, int | float) or isinstance(exp, bool):
            raise Unauthorized("ID token has no expiry")
        if now > exp + leeway:
            raise Unauthorized("ID token expired")
        if not isinstance(iat, int | float) or isinstance(iat, bool):
            raise Unauthorized("ID token has no issue time")
        if iat > now + leeway:
            raise Unauthorized("ID token issued in the future")
        if nbf is not None and (not isinstance(nbf, int | float) or nbf > now + leeway):
            raise Unauthorized("ID token not yet valid")
        if not isinstance(claims.get("sub"), str) or not claims["sub"]:
            raise Unauthorized("ID token has no subject")
        if nonce is not None:
            got = claims.get("nonce")
            if not isinstance(got, str) or not hmac.compare_digest(got.encode(), nonce.encode()):
                raise Unauthorized("wrong nonce")

    def user_from_claims(self, claims: Mapping[str, Any]) -> DirectoryUser:
        """The person an ID token names. No POSIX identity comes from OIDC."""
        username = claims.get(self.config.username_claim)
        if not isinstance(username, str) or not USERNAME.fullmatch(username):
            raise Unauthorized(
                f"the provider's {self.config.username_claim} {username!r} is not a valid gpufleet user name "
                "(lowercase letters, digits, '_' and '-', at most 32)"
            )
        raw_groups = claims.get(self.config.groups_claim, [])
        if isinstance(raw_groups, str):
            raw_groups = [raw_groups]
        if not isinstance(raw_groups, list) or not all(isinstance(g, str) for g in raw_groups):
            raise Unauthorized(f"the provider's {self.config.groups_claim} claim is not a list of names")
        name = claims.get("name")
        return DirectoryUser(
            username=username,
            source_id=f"{self.config.issuer}#{claims['sub']}",
            full_name=name if isinstance(name, str) else "",
            groups=frozenset(raw_groups),
        )

    def user_from_id_token(self, token: str, *, audiences: tuple[str, ...], nonce: str | None = None) -> DirectoryUser:
        """`verify_id_token` then `user_from_claims`: what the head does with the CLI's token."""
        return self.user_from_claims(self.verify_id_token(token, nonce=nonce, audiences=audiences))

    # --- the authorization code flow -----------------------------------------------------------------------

    def begin_login(self, redirect_uri: str) -> LoginStart:
        """The authorization URL (code flow, state, nonce, PKCE S256) and the values to keep for finish_login."""
        state, nonce = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        verifier = secrets.token_urlsafe(64)  # 86 characters: RFC 7636 wants 43 to 128
        params = {
            "response_type": "code",
            "client_id": self.config.client_id,
            "redirect_uri": redirect_uri,
            "scope": " ".join(self.config.scopes),
            "state": state,
            "nonce": nonce,
            "code_challenge": create_s256_code_challenge(verifier),
            "code_challenge_method": "S256",
        }
        endpoint = self.authorization_endpoint()
        url = endpoint + ("&" if urlsplit(endpoint).query else "?") + urlencode(params)
        return LoginStart(url=url, state=state, nonce=nonce, code_verifier=verifier)

    def finish_login(self, code: str, redirect_uri: str, code_verifier: str, nonce: str) -> DirectoryUser:
        """Trade the code for tokens at the token endpoint and return the person the ID token names."""
        data = {
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": redirect_uri,
            "code_verifier": code_verifier,
        }
        auth: tuple[str, str] | None = None
        if self.config.client_secret is not None:
            auth = (self.config.client_id, self.config.client_secret)  # client_secret_basic
        else:
            data["client_id"] = self.config.client_id
        try:
            response = self._http.post(self.token_endpoint(), data=data, auth=auth or httpx.USE_CLIENT_DEFAULT)
        except httpx.HTTPError as exc:
            raise DirectoryUnavailable(f"OIDC provider unreachable (token endpoint): {exc}") from exc
        if response.status_code >= 500:
            raise DirectoryUnavailable(f"OIDC token endpoint answered {response.status_code}")
        try:
            body = response.json()
        except ValueError:
            body = {}
        if response.status_code != 200 or not isinstance(body, dict):
            error = body.get("error", response.status_code) if isinstance(body, dict) else response.status_code
            raise Unauthorized(f"sign-in refused by the provider: {error}")
        id_token = body.get("id_token")
        if not isinstance(id_token, str):
            raise Unauthorized("the provider returned no ID token")
        return self.user_from_id_token(id_token, audiences=(self.config.client_id,), nonce=nonce)

    def close(self) -> None:
        self._http.close()
