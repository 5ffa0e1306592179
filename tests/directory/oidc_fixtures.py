"""A real OpenID Connect provider for the single sign-on tests: Debian's glewlwyd, started by
scripts/services/oidc.sh once per xdist worker on a port of its own, and the user's side of its flows.

The fixture `oidc_provider` is made visible to tests/directory by its conftest, once: a session fixture imported
into several modules would be one instance per module, each on the worker's one port.
The person's steps (sign in, approve a device code) are plain HTTP calls, the ones glewlwyd's login page makes.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from gpufleet.directory.oidc import OidcConfig
from tests.services import SCRIPTS, need

OIDC_BASE_PORT = 18900
# The redirect URIs the session's provider accepts for gpufleet-web: the code-flow test's, and the head's
# callback under FastAPI's TestClient and under a real server on the loopback.
REDIRECT_URIS = (
    "http://127.0.0.1:9/oidc-test/callback",
    "http://testserver/login/sso/callback",  # the head's callback (api.routers.sso) under the TestClient
)
USERS = {"alice": ("gpu-admins", "ml-vision"), "bob": ("ml-vision", "ml-nlp"), "carol": ("ml-nlp",)}


def _worker_index(worker_id: str) -> int:
    return int(worker_id[2:]) if worker_id.startswith("gw") else 0


def _read_env(path: Path) -> dict[str, str]:
    env: dict[str, str] = {}
    for line in path.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep:
            env[key] = value
    return env


@dataclass(frozen=True)
class OidcProvider:
    """A started provider and what its env file says (scripts/services/oidc.sh)."""

    env_file: Path
    env: dict[str, str] = field(repr=False)

    @property
    def issuer(self) -> str:
        return self.env["GPUFLEET_OIDC_ISSUER"]

    @property
    def base_url(self) -> str:
        parts = urlsplit(self.issuer)
        return f"{parts.scheme}://{parts.netloc}"

    @property
    def web_client_id(self) -> str:
        return self.env["GPUFLEET_OIDC_WEB_CLIENT_ID"]

    @property
    def web_client_secret(self) -> str:
        return self.env["GPUFLEET_OIDC_WEB_CLIENT_SECRET"]

    @property
    def cli_client_id(self) -> str:
        return self.env["GPUFLEET_OIDC_CLI_CLIENT_ID"]

    @property
    def verification_url(self) -> str:
        return self.env["GPUFLEET_OIDC_DEVICE_VERIFICATION_URL"]

    @property
    def login_url(self) -> str:
        return self.env["GPUFLEET_OIDC_LOGIN_URL"]

    def password(self, username: str) -> str:
        return self.env[f"GPUFLEET_OIDC_PASSWORD_{username.upper()}"]

    def config(self, **overrides: object) -> OidcConfig:
        """gpufleet's configuration for this provider (the web client, the CLI's public client)."""
        values: dict[str, object] = {
            "issuer": self.issuer,
            "client_id": self.web_client_id,
            "client_secret": self.web_client_secret,
            "cli_client_id": self.cli_client_id,
            **overrides,
        }
        return OidcConfig(**values)  # type: ignore[arg-type]

    def sign_in(self, http: httpx.Client, username: str, password: str | None = None) -> None:
        """What the login page's form does: POST the username and password; the session is a cookie in `http`."""
        response = http.post(
            f"{self.base_url}/api/auth/",
            json={"username": username, "password": password if password is not None else self.password(username)},
        )
        if response.status_code != 200:
            raise AssertionError(f"sign-in as {username} refused: {response.status_code} {response.text}")

    def browser_login(self, authorization_url: str, username: str, password: str | None = None) -> str:
        """The browser's part of the code flow, without a browser: open the authorization URL, land on the
        login page, sign in, press Continue (the callback URL plus `g_continue`, as login.html does), and
        return the redirect URL that carries `code` and `state` back to gpufleet."""
        with httpx.Client(timeout=10) as http:
            first = http.get(authorization_url)
            assert first.status_code == 302, first.text
            login = urlsplit(first.headers["location"])
            assert login.path.endswith("/login.html"), first.headers["location"]
            callback = parse_qs(login.query)["callback_url"][0]
            self.sign_in(http, username, password)
            back = http.get(callback + ("&" if "?" in callback else "?") + "g_continue")
            assert back.status_code == 302, back.text
            return back.headers["location"]

    def approve_device(self, user_code: str, username: str, password: str | None = None) -> None:
        """The person's step of the device grant: sign in and enter the user code at the verification URL."""
        with httpx.Client(timeout=10) as http:
            self.sign_in(http, username, password)
            response = http.get(self.verification_url, params={"code": user_code, "g_continue": ""})
            location = response.headers.get("location", "")
            if response.status_code != 302 or "prompt=deviceComplete" not in location:
                raise AssertionError(f"device code {user_code} not approved: {response.status_code} {location}")


def start_oidc_provider(
    run_dir: Path, port: int, redirect_uris: tuple[str, ...] = REDIRECT_URIS, id_token_ttl_s: int = 300
) -> tuple[OidcProvider | None, str]:
    """Start a provider (a fresh one: new key, secret and passwords); (provider, "") or (None, why not)."""
    env = {
        **os.environ,
        "GPUFLEET_SERVICES_RUN": str(run_dir),
        "GPUFLEET_OIDC_PORT": str(port),
        "GPUFLEET_OIDC_REDIRECT_URIS": ",".join(redirect_uris),
        "GPUFLEET_OIDC_ID_TOKEN_TTL_S": str(id_token_ttl_s),
    }
    started = subprocess.run(
        ["bash", str(SCRIPTS / "oidc.sh"), "start"], capture_output=True, text=True, timeout=300, check=False, env=env
    )
    if started.returncode != 0:
        return None, (started.stderr.strip() or started.stdout.strip() or "start failed").splitlines()[-1]
    env_file = Path(started.stdout.strip().splitlines()[-1])
    return OidcProvider(env_file=env_file, env=_read_env(env_file)), ""


def stop_oidc_provider(run_dir: Path, port: int) -> None:
    env = {**os.environ, "GPUFLEET_SERVICES_RUN": str(run_dir), "GPUFLEET_OIDC_PORT": str(port)}
    subprocess.run(["bash", str(SCRIPTS / "oidc.sh"), "stop"], capture_output=True, timeout=60, check=False, env=env)


@pytest.fixture(scope="session")
def oidc_provider(worker_id: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OidcProvider]:
    """glewlwyd with gpufleet-web, gpufleet-cli and alice, bob and carol; one per xdist worker."""
    run_dir = tmp_path_factory.mktemp("oidc")
    port = OIDC_BASE_PORT + _worker_index(worker_id)
    provider, why = start_oidc_provider(run_dir, port)
    if provider is None:
        need("oidc provider", why)
    assert provider is not None
    try:
        yield provider
    finally:
        stop_oidc_provider(run_dir, port)
