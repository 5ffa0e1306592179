import asyncio
import hashlib
import ssl
from pathlib import Path

import pytest

from gpufleet.agent import trust
from gpufleet.api.pki import init_pki
from gpufleet.core import tls
from gpufleet.core.errors import ConfigError


def test_a_join_token_carries_and_gives_back_its_pin() -> None:
    pin = "sha256:" + "0a" * 32
    token = tls.pin_join_token("gfj_secret-part", pin)
    assert token == "gfj_secret-part:sha256:" + "0a" * 32
    assert tls.split_join_token(token) == ("gfj_secret-part", pin)
    assert tls.split_join_token("gfj_secret-part") == ("gfj_secret-part", None)
    assert tls.pin_join_token("gfj_x", None) == "gfj_x"
    assert tls.split_join_token("gfj_x:sha256:" + "0A" * 32)[1] == pin  # typed in upper case


@pytest.mark.parametrize("pin", ["", "abc", "zz" * 32, "0a" * 33])
def test_a_malformed_pin_is_an_error_not_silently_ignored(pin: str) -> None:
    with pytest.raises(ConfigError, match="64 hex digits"):
        tls.split_join_token("gfj_secret:sha256:" + pin)


def test_the_fingerprint_is_what_openssl_prints(tmp_path: Path) -> None:
    result = init_pki(tmp_path, ["localhost"])
    der = ssl.PEM_cert_to_DER_cert(result.files.ca_cert.read_text())
    assert result.ca_fingerprint == "sha256:" + hashlib.sha256(der).hexdigest()
    with pytest.raises(ConfigError):
        tls.fingerprint("not a certificate")


@pytest.mark.parametrize(
    ("url", "ok"),
    [
        ("http://127.0.0.1:8080", True),
        ("http://localhost:8080", True),
        ("http://[::1]:8080", True),
        ("https://head.example.org", True),
        ("http://head.example.org:8080", False),
        ("http://10.0.0.1:8080", False),
    ],
)
def test_plain_http_only_on_loopback(url: str, ok: bool) -> None:
    if ok:
        tls.check_plain_http(url, allow_insecure_http=False)
    else:
        with pytest.raises(ConfigError, match="plain HTTP"):
            tls.check_plain_http(url, allow_insecure_http=False)
        tls.check_plain_http(url, allow_insecure_http=True)


def test_the_agent_trusts_a_saved_ca_matching_the_pin_without_asking_the_head(tmp_path: Path) -> None:
    made = init_pki(tmp_path / "head", ["localhost"])
    state = tmp_path / "agent"
    state.mkdir()
    (state / trust.CA_FILE).write_text(made.files.ca_cert.read_text())
    # Port 9 answers nothing: a fetch would fail, so success means the saved CA was used.
    context = asyncio.run(trust.head_context("https://127.0.0.1:9", made.ca_fingerprint, state, None, False))
    assert context is not None
    assert context.verify_mode is ssl.CERT_REQUIRED
    assert len(context.get_ca_certs()) == 1


def test_a_pin_with_a_plain_http_url_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="https://"):
        asyncio.run(trust.head_context("http://127.0.0.1:8080", "sha256:" + "00" * 32, tmp_path, None, False))
