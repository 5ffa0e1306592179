"""ID token checks of gpufleet.directory.oidc with keys made here and a provider faked by httpx.MockTransport,
and the CLI's device-grant polling against scripted token-endpoint answers."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from joserfc import jwt
from joserfc.jwk import ECKey, RSAKey

from gpufleet.cli.sso_device import DeviceLoginError, device_login
from gpufleet.core.errors import ConfigError, Unauthorized
from gpufleet.directory import oidc
from gpufleet.directory.oidc import OidcClient, OidcConfig
from gpufleet.directory.records import DirectoryUnavailable

ISSUER = "https://sso.example.test/realm"
NOW = 1_800_000_000.0


class FakeProvider:
    """Discovery and a JWKS the test can rotate; counts JWKS fetches."""

    def __init__(self, *keys: RSAKey | ECKey) -> None:
        self.keys = list(keys)
        self.jwks_fetches = 0

    def handler(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/.well-known/openid-configuration"):
            return httpx.Response(
                200,
                json={
                    "issuer": ISSUER,
                    "authorization_endpoint": f"{ISSUER}/auth",
                    "token_endpoint": f"{ISSUER}/token",
                    "jwks_uri": f"{ISSUER}/jwks",
                },
            )
        if request.url.path.endswith("/jwks"):
            self.jwks_fetches += 1
            return httpx.Response(200, json={"keys": [k.as_dict(private=False) for k in self.keys]})
        return httpx.Response(404)


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


def rsa_key(kid: str) -> RSAKey:
    return RSAKey.generate_key(2048, parameters={"kid": kid})


def claims(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "iss": ISSUER,
        "sub": "u-1",
        "aud": "gpufleet-web",
        "exp": int(NOW) + 300,
        "iat": int(NOW),
        "nonce": "n-1",
        "preferred_username": "alice",
        "name": "Alice Example",
        "groups": ["gpu-admins", "ml-vision"],
    }
    base.update(changes)
    return {k: v for k, v in base.items() if v is not None}


def sign(key: RSAKey | ECKey, alg: str = "RS256", **changes: Any) -> str:
    return jwt.encode({"alg": alg, "kid": key.kid}, claims(**changes), key)


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@pytest.fixture
def key() -> RSAKey:
    return rsa_key("k1")


@pytest.fixture
def provider(key: RSAKey) -> FakeProvider:
    return FakeProvider(key)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def client(provider: FakeProvider, clock: Clock) -> OidcClient:
    config = OidcConfig(issuer=ISSUER, client_id="gpufleet-web", client_secret="s")
    return OidcClient(config, httpx.Client(transport=httpx.MockTransport(provider.handler)), clock=clock)


def verify(client: OidcClient, token: str, nonce: str | None = "n-1") -> dict[str, Any]:
    return client.verify_id_token(token, nonce=nonce, audiences=("gpufleet-web",))


def test_a_valid_token_is_accepted_and_names_alice(client: OidcClient, key: RSAKey) -> None:
    got = verify(client, sign(key))
    user = client.user_from_claims(got)
    assert (user.username, user.full_name, user.source_id) == ("alice", "Alice Example", f"{ISSUER}#u-1")
    assert user.groups == frozenset({"gpu-admins", "ml-vision"})
    assert (user.uid, user.gid) == (None, None)


def test_an_es256_token_is_accepted(clock: Clock) -> None:
    ec = ECKey.generate_key("P-256", parameters={"kid": "e1"})
    config = OidcConfig(issuer=ISSUER, client_id="gpufleet-web")
    client = OidcClient(config, httpx.Client(transport=httpx.MockTransport(FakeProvider(ec).handler)), clock=clock)
    assert verify(client, sign(ec, alg="ES256"))["sub"] == "u-1"


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"aud": "someone-else"}, "wrong audience"),
        ({"aud": ["gpufleet-web", "other"]}, r"wrong authorized party \(azp\)"),
        ({"aud": ["gpufleet-web", "other"], "azp": "other"}, r"wrong authorized party \(azp\)"),
        ({"iss": ISSUER + "/"}, "wrong issuer"),
        ({"nonce": "n-2"}, "wrong nonce"),
        ({"nonce": None}, "wrong nonce"),
        ({"exp": int(NOW) - 61}, "ID token expired"),
        ({"exp": None}, "ID token has no expiry"),
        ({"iat": int(NOW) + 61}, "ID token issued in the future"),
        ({"nbf": int(NOW) + 61}, "ID token not yet valid"),
        ({"sub": None}, "ID token has no subject"),
    ],
)
def test_bad_claims_are_refused_with_their_reason(
    client: OidcClient, key: RSAKey, changes: dict[str, Any], reason: str
) -> None:
    with pytest.raises(Unauthorized, match=reason):
        verify(client, sign(key, **changes))


def test_leeway_allows_a_little_clock_skew(client: OidcClient, key: RSAKey) -> None:
    assert verify(client, sign(key, exp=int(NOW) - 59, iat=int(NOW) + 59, nbf=int(NOW) + 59))


def test_several_audiences_with_our_azp_are_accepted(client: OidcClient, key: RSAKey) -> None:
    assert verify(client, sign(key, aud=["gpufleet-web", "other"], azp="gpufleet-web"))


def test_a_token_signed_by_another_key_with_the_same_kid_is_refused(client: OidcClient) -> None:
    with pytest.raises(Unauthorized, match="bad signature"):
        verify(client, sign(rsa_key("k1")))


def test_alg_none_is_refused(client: OidcClient) -> None:
    token = f"{b64(json.dumps({'alg': 'none', 'kid': 'k1'}).encode())}.{b64(json.dumps(claims()).encode())}."
    with pytest.raises(Unauthorized, match="algorithm not allowed: none"):
        verify(client, token)


def test_hs256_signed_with_the_public_key_is_refused(client: OidcClient, key: RSAKey) -> None:
    # Made by hand: joserfc itself refuses to use a public key as an HMAC secret.
    signing_input = f"{b64(json.dumps({'alg': 'HS256', 'kid': 'k1'}).encode())}.{b64(json.dumps(claims()).encode())}"
    mac = hmac.new(key.as_pem(private=False), signing_input.encode(), hashlib.sha256).digest()
    token = f"{signing_input}.{b64(mac)}"
    with pytest.raises(Unauthorized, match="algorithm not allowed: HS256"):
        verify(client, token)


def test_a_malformed_token_is_refused(client: OidcClient) -> None:
    for token in ("", "a.b", "!!.!!.!!", f"{b64(b'[1]')}.e30.sig"):
        with pytest.raises(Unauthorized, match=r"malformed ID token|not allowed"):
            verify(client, token)


def test_an_unknown_kid_refetches_the_jwks_once(
    client: OidcClient, provider: FakeProvider, key: RSAKey, clock: Clock
) -> None:
    verify(client, sign(key))
    assert provider.jwks_fetches == 1
    rotated = rsa_key("k2")
    provider.keys.append(rotated)
    clock.now += oidc.JWKS_REFETCH_MIN_S
    assert verify(client, sign(rotated, exp=int(clock.now) + 300))
    assert provider.jwks_fetches == 2
    verify(client, sign(rotated, exp=int(clock.now) + 300))
    assert provider.jwks_fetches == 2  # known now: no fetch


def test_a_flood_of_unknown_kids_fetches_the_jwks_at_most_once_a_while(
    client: OidcClient, provider: FakeProvider, key: RSAKey, clock: Clock
) -> None:
    verify(client, sign(key))
    stranger = rsa_key("nobody")
    for _ in range(50):
        with pytest.raises(Unauthorized, match="unknown key"):
            verify(client, sign(stranger))
    assert provider.jwks_fetches == 1
    clock.now += oidc.JWKS_REFETCH_MIN_S
    for _ in range(50):
        with pytest.raises(Unauthorized, match="unknown key"):
            verify(client, sign(stranger, exp=int(clock.now) + 300))
    assert provider.jwks_fetches == 2


@pytest.mark.parametrize(
    ("username", "groups"),
    [("Alice", ["g"]), ("a" * 33, ["g"]), ("al ice", ["g"]), (None, ["g"]), ("alice", [1]), ("alice", {"a": 1})],
)
def test_a_bad_username_or_groups_claim_is_refused(client: OidcClient, username: Any, groups: Any) -> None:
    with pytest.raises(Unauthorized, match=r"not a valid gpufleet user name|not a list of names"):
        client.user_from_claims({"sub": "s", "preferred_username": username, "groups": groups})


def test_no_groups_claim_means_no_groups(client: OidcClient) -> None:
    assert client.user_from_claims({"sub": "s", "preferred_username": "carol"}).groups == frozenset()


def test_begin_login_asks_for_code_with_pkce_s256(client: OidcClient) -> None:
    start = client.begin_login("https://head.example.test/cb")
    url = httpx.URL(start.url)
    assert str(url).startswith(f"{ISSUER}/auth?")
    params = dict(url.params)
    assert params["response_type"] == "code"
    assert params["code_challenge_method"] == "S256"
    assert params["state"] == start.state
    assert params["nonce"] == start.nonce
    expected = b64(hashlib.sha256(start.code_verifier.encode()).digest())
    assert params["code_challenge"] == expected
    assert params["scope"] == "openid profile email groups"


def test_config_refuses_plain_http_off_the_loopback() -> None:
    with pytest.raises(ConfigError, match="https"):
        OidcConfig(issuer="http://sso.example.test", client_id="c")
    assert OidcConfig(issuer="http://127.0.0.1:18900/api/oidc", client_id="c").device_client_id == "c"


def test_an_unreachable_provider_is_directory_unavailable() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    client = OidcClient(OidcConfig(issuer=ISSUER, client_id="c"), httpx.Client(transport=httpx.MockTransport(refuse)))
    with pytest.raises(DirectoryUnavailable, match="unreachable"):
        client.discovery()


# --- the CLI's device grant ------------------------------------------------------------------------------


def device_provider(answers: list[tuple[int, dict[str, Any]]], seen: list[dict[str, str]]) -> httpx.Client:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/.well-known/openid-configuration"):
            return httpx.Response(
                200,
                json={
                    "issuer": ISSUER,
                    "device_authorization_endpoint": f"{ISSUER}/device_authorization",
                    "token_endpoint": f"{ISSUER}/token",
                },
            )
        form = dict(httpx.QueryParams(request.content.decode()))
        seen.append(form)
        if request.url.path.endswith("/device_authorization"):
            return httpx.Response(
                200,
                json={
                    "device_code": "dc",
                    "user_code": "ABCD-EFGH",
                    "verification_uri": f"{ISSUER}/device",
                    "expires_in": 30,
                    "interval": 2,
                },
            )
        status, body = answers.pop(0)
        return httpx.Response(status, json=body)

    return httpx.Client(transport=httpx.MockTransport(handler))


def run_device(
    answers: list[tuple[int, dict[str, Any]]],
) -> tuple[list[float], list[dict[str, str]], Callable[[], Any]]:
    slept: list[float] = []
    seen: list[dict[str, str]] = []
    elapsed = [0.0]

    def sleep(s: float) -> None:
        slept.append(s)
        elapsed[0] += s

    def run() -> Any:
        return device_login(
            ISSUER,
            "gpufleet-cli",
            lambda uri, code, complete: None,
            http=device_provider(answers, seen),
            sleep=sleep,
            clock=lambda: elapsed[0],
        )

    return slept, seen, run


def test_device_login_polls_until_approved_and_honours_slow_down() -> None:
    pending = (400, {"error": "authorization_pending"})
    slept, seen, run = run_device([pending, (400, {"error": "slow_down"}), pending, (200, {"id_token": "t"})])
    assert run() == {"id_token": "t"}
    assert slept == [2, 2, 7, 7]
    assert seen[0] == {"client_id": "gpufleet-cli", "scope": "openid profile email groups"}
    assert seen[1]["grant_type"] == "urn:ietf:params:oauth:grant-type:device_code"
    assert seen[1]["device_code"] == "dc"


@pytest.mark.parametrize(
    ("error", "message"), [("access_denied", "refused at the provider"), ("expired_token", "expired_token")]
)
def test_device_login_stops_on_denial_or_expiry(error: str, message: str) -> None:
    _, _, run = run_device([(400, {"error": error})])
    with pytest.raises(DeviceLoginError, match=message):
        run()


def test_device_login_stops_at_expires_in() -> None:
    slept, _, run = run_device([(400, {"error": "authorization_pending"})] * 100)
    with pytest.raises(DeviceLoginError, match="expired"):
        run()
    assert sum(slept) <= 30
