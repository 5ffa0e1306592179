"""gpufleet's OIDC client against a real provider (glewlwyd, scripts/services/oidc.sh): discovery, the
code flow with PKCE as the dashboard runs it, and the device grant as the CLI runs it."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest

from gpufleet.cli.sso_device import device_login
from gpufleet.core.errors import ConfigError, Unauthorized
from gpufleet.directory.oidc import OidcClient
from gpufleet.directory.records import DirectoryUnavailable
from tests.directory.oidc_fixtures import REDIRECT_URIS, OidcProvider

pytestmark = pytest.mark.oidc

REDIRECT = REDIRECT_URIS[0]


def test_discovery_names_the_flows_gpufleet_uses(oidc_provider: OidcProvider) -> None:
    client = OidcClient(oidc_provider.config())
    document = client.discovery()
    assert document["issuer"] == oidc_provider.issuer
    assert "S256" in document.get("code_challenge_methods_supported", ["S256"])
    assert client.device_endpoint().startswith(oidc_provider.issuer)
    assert client.discovery() is document  # cached


def test_code_flow_signs_alice_in_with_her_groups(oidc_provider: OidcProvider) -> None:
    client = OidcClient(oidc_provider.config())
    start = client.begin_login(REDIRECT)
    query = parse_qs(urlsplit(start.url).query)
    assert query["code_challenge_method"] == ["S256"]
    assert query["state"] == [start.state]
    back = urlsplit(oidc_provider.browser_login(start.url, "alice"))
    assert f"{back.scheme}://{back.netloc}{back.path}" == REDIRECT
    returned = parse_qs(back.query)
    assert returned["state"] == [start.state]
    user = client.finish_login(returned["code"][0], REDIRECT, start.code_verifier, start.nonce)
    assert user.username == "alice"
    assert user.full_name == "Alice Example"
    assert user.groups == frozenset({"gpu-admins", "ml-vision"})
    assert user.source_id.startswith(oidc_provider.issuer + "#")
    assert (user.uid, user.gid) == (None, None)


def test_code_flow_refuses_a_wrong_verifier_and_a_reused_code(oidc_provider: OidcProvider) -> None:
    client = OidcClient(oidc_provider.config())
    start = client.begin_login(REDIRECT)
    code = parse_qs(urlsplit(oidc_provider.browser_login(start.url, "carol")).query)["code"][0]
    with pytest.raises(Unauthorized, match="refused by the provider"):
        client.finish_login(code, REDIRECT, "x" * 60, start.nonce)
    start = client.begin_login(REDIRECT)
    code = parse_qs(urlsplit(oidc_provider.browser_login(start.url, "carol")).query)["code"][0]
    assert client.finish_login(code, REDIRECT, start.code_verifier, start.nonce).groups == {"ml-nlp"}
    with pytest.raises(Unauthorized, match="refused by the provider"):
        client.finish_login(code, REDIRECT, start.code_verifier, start.nonce)


def test_code_flow_checks_the_nonce(oidc_provider: OidcProvider) -> None:
    client = OidcClient(oidc_provider.config())
    start = client.begin_login(REDIRECT)
    code = parse_qs(urlsplit(oidc_provider.browser_login(start.url, "bob")).query)["code"][0]
    with pytest.raises(Unauthorized, match="wrong nonce"):
        client.finish_login(code, REDIRECT, start.code_verifier, "another-login")


def test_device_grant_ends_in_an_id_token_the_head_accepts(oidc_provider: OidcProvider) -> None:
    shown: list[tuple[str, str, str | None]] = []

    def show(uri: str, user_code: str, complete: str | None) -> None:
        shown.append((uri, user_code, complete))
        oidc_provider.approve_device(user_code, "bob")  # the person, in their browser, meanwhile

    tokens = device_login(oidc_provider.issuer, oidc_provider.cli_client_id, show)
    assert shown[0][0] == oidc_provider.verification_url
    client = OidcClient(oidc_provider.config())
    user = client.user_from_id_token(tokens["id_token"], audiences=(oidc_provider.cli_client_id,))
    assert user.username == "bob"
    assert user.groups == frozenset({"ml-vision", "ml-nlp"})
    with pytest.raises(Unauthorized, match="wrong audience"):
        client.verify_id_token(tokens["id_token"], nonce=None, audiences=(oidc_provider.web_client_id,))


def test_a_wrong_issuer_or_a_dead_provider_is_refused(oidc_provider: OidcProvider) -> None:
    with pytest.raises(ConfigError, match="discovery names issuer"):
        OidcClient(oidc_provider.config(issuer=oidc_provider.issuer + "/")).discovery()
    dead = oidc_provider.config(issuer="http://127.0.0.1:9/api/oidc", timeout_s=2)
    with pytest.raises(DirectoryUnavailable):
        OidcClient(dead).begin_login(REDIRECT)
