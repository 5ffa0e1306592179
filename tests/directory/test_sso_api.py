"""Single sign-on through the head's routes (api.routers.sso) and the real provider (glewlwyd, scripts/services/
oidc.sh): the dashboard's code flow ends in a session of a user with the role and projects their groups
claim gives; the CLI's device grant ends in an ordinary API token; forged, expired, wrong-audience and
other-key tokens are refused and audited. The real browser drives the same in tests/browser."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from fastapi.testclient import TestClient
from joserfc import jwt
from joserfc.jwk import RSAKey

from gpufleet.api.context import HeadContext
from gpufleet.cli.sso_device import device_login
from gpufleet.directory.oidc import OidcClient
from gpufleet.directory.settings import mappings
from tests.directory.oidc_fixtures import OidcProvider

pytestmark = pytest.mark.oidc
CLAIMS = {
    "oidc_issuer": "set below",
    "oidc_client_id": "set below",
    "oidc_group_roles": {"gpu-admins": "admin"},
    "oidc_group_projects": {"ml-vision": "vision", "ml-nlp": "nlp"},
    "oidc_default_role": "viewer",
}


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    """SQLite only: the routes' logic is the same on both; test_directory_sync runs the sync on both."""
    return f"sqlite:///{tmp_path / 'gpufleet.db'}"


@pytest.fixture
def sso(client: TestClient, oidc_provider: OidcProvider) -> Iterator[TestClient]:
    """The app with the provider as its single sign-on, and projects vision and nlp."""
    ctx: HeadContext = client.app.state.ctx  # type: ignore[attr-defined]
    before = ctx.settings, ctx.oidc
    update = CLAIMS | {"oidc_issuer": oidc_provider.issuer, "oidc_client_id": oidc_provider.web_client_id}
    ctx.settings = ctx.settings.model_copy(update=update)
    ctx.oidc = OidcClient(oidc_provider.config())
    assert set(mappings(ctx.settings)) == {"oidc"}
    for name in ("vision", "nlp"):
        assert client.post("/api/v1/projects", json={"name": name}).status_code == 201
    yield client
    ctx.oidc.close()
    ctx.settings, ctx.oidc = before


def _browser(client: TestClient) -> TestClient:
    return TestClient(client.app, follow_redirects=False)


def test_the_dashboard_signs_in_through_the_provider_with_the_groups_role_and_projects(
    sso: TestClient,
    oidc_provider: OidcProvider,
) -> None:
    browser = _browser(sso)
    assert 'href="/login/sso"' in browser.get("/login").text
    start = browser.get("/login/sso")
    assert start.status_code == 303
    assert start.headers["location"].startswith(oidc_provider.issuer)
    back = urlsplit(oidc_provider.browser_login(start.headers["location"], "alice"))
    landed = browser.get(f"{back.path}?{back.query}")
    assert landed.status_code == 303, landed.text
    assert landed.headers["location"] == "/"
    assert "alice" in browser.get("/").text  # the dashboard, as alice
    alice = sso.get("/api/v1/users/alice").json()
    assert (alice["source"], alice["role"]) == ("oidc", "admin")
    assert sso.get("/api/v1/projects/vision").json()["members"] == ["alice"]
    assert sso.get("/api/v1/projects/nlp").json()["members"] == []
    audited = sso.get("/api/v1/audit", params={"actor": "user:alice"}).json()
    assert any(r["action"] == "sso.callback" and "single sign-on" in r["target"] for r in audited), audited


def test_a_callback_that_did_not_start_here_is_refused(
    sso: TestClient,
    oidc_provider: OidcProvider,
) -> None:
    victim, attacker = _browser(sso), _browser(sso)
    start = attacker.get("/login/sso")
    back = urlsplit(oidc_provider.browser_login(start.headers["location"], "bob"))
    # The attacker's code in the victim's browser, which never started a sign-on: no session.
    refused = victim.get(f"{back.path}?{back.query}")
    assert refused.status_code == 400
    assert "did not start here" in refused.text
    assert "gpufleet_session" not in victim.cookies
    # Nor with a state of the victim's own but the attacker's code.
    victim.get("/login/sso")
    code = parse_qs(back.query)["code"][0]
    assert victim.get("/login/sso/callback", params={"code": code, "state": "x" * 43}).status_code == 400


def test_the_cli_trades_the_device_grants_id_token_for_an_api_token(
    sso: TestClient,
    oidc_provider: OidcProvider,
) -> None:
    info = sso.get("/api/v1/sso", headers={"Authorization": ""}).json()
    assert info["client_id"] == oidc_provider.cli_client_id
    tokens = device_login(
        info["issuer"],
        info["client_id"],
        lambda uri, code, complete: oidc_provider.approve_device(code, "bob"),
        scopes=tuple(info["scopes"]),
    )
    answer = sso.post("/api/v1/login/sso", json={"id_token": tokens["id_token"]}, headers={"Authorization": ""})
    assert answer.status_code == 201, answer.text
    me = sso.get("/api/v1/whoami", headers={"Authorization": f"Bearer {answer.json()['token']}"}).json()
    assert (me["user"], me["role"]) == ("bob", "viewer")
    assert sso.get("/api/v1/users/bob").json()["source"] == "oidc"


def _forged(token: str, key: RSAKey) -> str:
    """The token's own header (kid) and claims, signed with `key`."""
    header = json.loads(base64.urlsafe_b64decode(token.split(".", maxsplit=1)[0] + "=="))
    claims = json.loads(base64.urlsafe_b64decode(token.split(".")[1] + "=="))
    return jwt.encode({"alg": "RS256", "kid": header.get("kid", "k")}, claims, key)


def test_wrong_audience_expired_and_other_key_tokens_are_refused(
    sso: TestClient,
    oidc_provider: OidcProvider,
) -> None:
    # A real token for the dashboard's client: its audience is not the CLI's.
    browser = _browser(sso)
    start = browser.get("/login/sso")
    back = urlsplit(oidc_provider.browser_login(start.headers["location"], "carol"))
    code = parse_qs(back.query)["code"][0]
    kept = json.loads(base64.urlsafe_b64decode(browser.cookies["gpufleet_sso"]))
    web_token = _web_id_token(oidc_provider, code, start.headers["location"], kept["verifier"])
    refusals = {
        "wrong audience": web_token,
        "bad signature": _forged(web_token, RSAKey.import_key(rsa.generate_private_key(65537, 2048))),
    }
    for reason, token in refusals.items():
        answer = sso.post("/api/v1/login/sso", json={"id_token": token}, headers={"Authorization": ""})
        assert answer.status_code == 401, (reason, answer.text)
    # Expired: the same provider's valid CLI token, seen by a head whose clock is an hour on.
    tokens = device_login(
        oidc_provider.issuer,
        oidc_provider.cli_client_id,
        lambda uri, code, complete: oidc_provider.approve_device(code, "carol"),
    )
    ctx: HeadContext = sso.app.state.ctx  # type: ignore[attr-defined]
    assert ctx.oidc is not None
    live = ctx.oidc
    ctx.oidc = OidcClient(oidc_provider.config(), clock=lambda: time.time() + 3600)
    try:
        late = sso.post("/api/v1/login/sso", json={"id_token": tokens["id_token"]}, headers={"Authorization": ""})
    finally:
        ctx.oidc.close()
        ctx.oidc = live
    assert late.status_code == 401
    assert "expired" in late.json()["detail"]
    assert sso.get("/api/v1/users/carol").status_code == 404  # nobody was made by a refused token
    refused = sso.get("/api/v1/audit", params={"action": "sso.sso_token"}).json()
    assert len([r for r in refused if r["result"] == 401]) >= 3, refused


def _web_id_token(provider: OidcProvider, code: str, authorization_url: str, verifier: str) -> str:
    """The ID token the dashboard's client gets for `code` (what the head's callback would get)."""
    redirect_uri = parse_qs(urlsplit(authorization_url).query)["redirect_uri"][0]
    with httpx.Client(timeout=10) as http:
        discovery = http.get(provider.issuer + "/.well-known/openid-configuration").json()
        answer = http.post(
            discovery["token_endpoint"],
            data={
                "grant_type": "authorization_code",
                "code": code,
                "redirect_uri": redirect_uri,
                "code_verifier": verifier,
            },
            auth=(provider.web_client_id, provider.web_client_secret),
        )
    assert answer.status_code == 200, answer.text
    token: str = answer.json()["id_token"]
    return token
