"""HTTPS with the head's own CA: agents pin it from the join token and refuse any other."""

import hashlib
import signal
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import GPUFLEET, Head, base_env, run_cli, wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture
def tls_head(tmp_path: Path) -> Iterator[Head]:
    head = Head(tmp_path, tls=True).start()
    yield head
    head.kill(signal.SIGTERM)


def _agent(tmp: Path, head: Head, token: str, name: str) -> list[str]:
    state = tmp / name
    return [*GPUFLEET, "agent", "--server", head.url, "--join-token", token, "--name", name, "--state-dir", str(state)]


def test_join_tokens_carry_the_ca_fingerprint(tls_head: Head) -> None:
    token = tls_head.join_token(1)
    secret, _, pin = token.partition(":sha256:")
    assert secret.startswith("gfj_")
    der = ssl.PEM_cert_to_DER_cert(tls_head.ca_file.read_text())
    assert pin == hashlib.sha256(der).hexdigest()
    assert tls_head.health()["status"] == "ok"  # served over HTTPS, verified against the CA


def test_an_agent_pins_the_ca_and_joins_over_https(tls_head: Head, tmp_path: Path) -> None:
    proc = subprocess.Popen(
        _agent(tmp_path, tls_head, tls_head.join_token(1), "tls1"),
        env=base_env(tmp_path),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for(lambda: any(n["name"] == "tls1" and n["state"] == "up" for n in tls_head.nodes()), 30)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert (tmp_path / "tls1" / "head-ca.pem").read_text() == tls_head.ca_file.read_text()
    assert b"Traceback" not in err


def test_an_agent_refuses_a_head_whose_ca_does_not_match_the_pin(tls_head: Head, tmp_path: Path) -> None:
    secret = tls_head.join_token(1).partition(":sha256:")[0]
    wrong = secret + ":sha256:" + "ab" * 32
    result = subprocess.run(
        _agent(tmp_path, tls_head, wrong, "tls2"),
        env=base_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 8
    assert "refusing to join" in result.stderr
    assert "sha256:" + "ab" * 32 in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "tls2" / "credential.json").exists()
    tokens = tls_head.api("GET", "/api/v1/tokens")
    assert [t["uses"] for t in tokens if t["kind"] == "join"] == [0]  # nothing secret was sent


def test_the_cli_verifies_the_head_against_the_ca_file(tls_head: Head, tmp_path: Path) -> None:
    untrusted = run_cli(tmp_path, "node", "list", server=tls_head.url)
    assert untrusted.returncode == 7
    assert "CERTIFICATE_VERIFY_FAILED" in untrusted.stderr
    assert "Traceback" not in untrusted.stderr
    env = base_env(tmp_path) | {"GPUFLEET_CA_FILE": str(tls_head.ca_file)}
    trusted = subprocess.run(
        [*GPUFLEET, "--server", tls_head.url, "--token", "gfa_e2e-admin-token-0123456789", "node", "list"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert trusted.returncode == 0, trusted.stderr


def test_plain_http_is_refused_off_loopback(tmp_path: Path) -> None:
    server = run_cli(tmp_path, "server", "--data-dir", str(tmp_path / "h"), "--listen", "0.0.0.0:1", token=None)
    assert server.returncode == 2
    assert "plain HTTP" in server.stderr
    cli = run_cli(tmp_path, "node", "list", server="http://192.0.2.1:8080")
    assert cli.returncode == 2
    assert "plain HTTP" in cli.stderr
