"""Directory users and single sign-on end to end (issue 25): a real head process configured by its environment
for a real slapd (scripts/services/ldap.sh, StartTLS checked against its CA, the bind password in a file),
driven by the real CLI, a dashboard login over HTTP and an agent applying accounts to a throwaway root; and
`gpufleet login --sso` through a real OpenID Connect provider (glewlwyd, scripts/services/oidc.sh).

The slapd and the provider are this module's own, on ports picked here: the session's instances of
tests/directory listen on fixed ports per xdist worker, and a second start on those ports would clash.
The same behaviour under the TestClient, with a directory made in the test, is tests/directory/test_directory_api.py.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import signal
import subprocess
import time
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from joserfc import jwt
from joserfc.jwk import RSAKey

from gpufleet.agent.accounts import AccountSync
from gpufleet.agent.credentials import CredentialStore
from gpufleet.agent.daemon import Agent, AgentOptions
from gpufleet.agent.gpu.nvml import NvmlReader
from gpufleet.agent.inventory import inventory_source
from gpufleet.agent.passwd import read_local_accounts
from gpufleet.cli.sso_device import device_login
from gpufleet.client import AgentHttp
from gpufleet.directory.oidc import OidcClient
from gpufleet.sim.host import simulated_host
from gpufleet.sim.nvml import SimulatedNvml
from tests.agent.test_accounts import make_root, need_account_tools
from tests.directory.conftest import SCRIPT, LdapEdits, LdapServer
from tests.directory.oidc_fixtures import REDIRECT_URIS, OidcProvider, start_oidc_provider, stop_oidc_provider
from tests.e2e.conftest import ADMIN, GPUFLEET, Head, base_env, free_port, wait_for
from tests.services import install_tools, need

pytestmark = [pytest.mark.e2e, pytest.mark.ldap, pytest.mark.xdist_group("test_directory_e2e")]

SYNC_INTERVAL_S = 10  # ldap_sync_interval_s's minimum
# A change in the directory reaches the head within one scheduled sync; three, and a margin, on a loaded machine.
SYNC_DEADLINE_S = 3 * SYNC_INTERVAL_S + 5
GROUP_ROLES = {"gpu-admins": "admin"}
GROUP_PROJECTS = {"ml-vision": "vision", "ml-nlp": "nlp"}


# -- the directory, the head, the CLI --------------------------------------------------------------------------


def _ldap_service(command: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), command],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, **env},
    )


@pytest.fixture(scope="module")
def directory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LdapServer]:
    """This module's slapd, seeded as ldap.sh seeds it (alice, bob, carol; dave locked; gpu-admins: alice,
    ml-vision: alice bob, ml-nlp: bob carol), on free ports; stopped after the module."""
    install_tools(("slapd", "slappasswd", "ldapsearch", "openssl"), "ldap.sh")
    env = {
        "GPUFLEET_LDAP_PORT": str(free_port()),
        "GPUFLEET_LDAP_TLS_PORT": str(free_port()),
        "GPUFLEET_SERVICES_RUN": str(tmp_path_factory.mktemp("ldap")),
    }
    started = _ldap_service("start", env)
    if started.returncode != 0:
        said = (started.stderr.strip() or started.stdout.strip() or "start failed").splitlines()
        need("slapd", f"`ldap.sh start` failed: {said[-1]}")
    server = LdapServer.from_env_file(Path(started.stdout.strip().splitlines()[-1]), env)
    try:
        yield server
    finally:
        _ldap_service("stop", env)


@pytest.fixture
def edit(directory: LdapServer) -> Iterator[LdapEdits]:
    """Changes to the module's directory, each undone after the test."""
    edits = LdapEdits(directory)
    try:
        yield edits
    finally:
        edits.undo()


def ldap_env(server: LdapServer, tmp: Path, urls: list[str] | None = None) -> dict[str, str]:
    """A head's settings for `server`, as a site would write them: StartTLS checked against the directory's
    CA, the service account's password in a file of its own."""
    password_file = tmp / "ldap-bind-password"
    password_file.write_text(server.bind_password + "\n")
    password_file.chmod(0o600)
    return {
        "GPUFLEET_IDENTITY_PROVIDER": "ldap",
        "GPUFLEET_LDAP_URLS": json.dumps(urls if urls is not None else [server.url]),
        "GPUFLEET_LDAP_STARTTLS": "true",
        "GPUFLEET_LDAP_CA_FILE": str(server.ca_file),
        "GPUFLEET_LDAP_BIND_DN": server.bind_dn,
        "GPUFLEET_LDAP_BIND_PASSWORD_FILE": str(password_file),
        "GPUFLEET_LDAP_USER_BASE": server.user_base,
        "GPUFLEET_LDAP_GROUP_BASE": server.group_base,
        "GPUFLEET_LDAP_GROUP_ROLES": json.dumps(GROUP_ROLES),
        "GPUFLEET_LDAP_GROUP_PROJECTS": json.dumps(GROUP_PROJECTS),
        "GPUFLEET_LDAP_DEFAULT_ROLE": "member",
        "GPUFLEET_LDAP_SYNC_INTERVAL_S": str(SYNC_INTERVAL_S),
    }


def make_projects(head: Head) -> None:
    for name in ("vision", "nlp"):
        head.api("POST", "/api/v1/projects", json={"name": name})


@pytest.fixture(scope="module")
def head(directory: LdapServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Head]:
    """One head for the module's directory tests, with projects vision and nlp and the directory read once."""
    tmp = tmp_path_factory.mktemp("head")
    h = Head(tmp, env=ldap_env(directory, tmp)).start()
    try:
        make_projects(h)
        sync_now(h)
        yield h
    finally:
        h.kill(signal.SIGTERM)


def sync_now(head: Head) -> dict[str, Any]:
    """POST /api/v1/directory/sync: the head reads the directory now, so a test starts from what it says."""
    report: dict[str, Any] = head.api("POST", "/api/v1/directory/sync")
    return report


def members(head: Head, project: str) -> list[str]:
    found: list[str] = head.api("GET", f"/api/v1/projects/{project}")["members"]
    return found


def whoami(head: Head, token: str) -> httpx.Response:
    return httpx.get(head.url + "/api/v1/whoami", headers={"Authorization": f"Bearer {token}"}, timeout=10)


def home_of(tmp: Path, name: str) -> Path:
    home = tmp / f"home-{name}"
    home.mkdir(exist_ok=True)
    return home


def cli_env(home: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The CLI's environment: HOME and its client file (GPUFLEET_CLIENT_CONFIG) in the test's directory."""
    env = base_env(home) | {"HOME": str(home)} | (extra or {})
    env.pop("XDG_CONFIG_HOME", None)
    return env


def gpufleet(
    home: Path, *args: str, server: str, token: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The real `gpufleet --server URL [--token T] ARGS` as a process; no terminal, nothing typed in."""
    prefix = [*GPUFLEET, "--server", server, *(["--token", token] if token else [])]
    return subprocess.run(
        [*prefix, *args],
        env=cli_env(home, env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def login(head: Head, home: Path, username: str, password: str) -> subprocess.CompletedProcess[str]:
    return gpufleet(home, "login", "--user", username, server=head.url, env={"GPUFLEET_PASSWORD": password})


def saved_token(home: Path) -> str:
    token: str = tomllib.loads((home / "client.toml").read_text())["token"]
    return token


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    """A failed command's message: non-zero exit, one line on stderr, no traceback."""
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


@contextlib.contextmanager
def dashboard_login(head: Head, username: str, password: str) -> Iterator[httpx.Client]:
    """A browser logged in over HTTP: the login form's CSRF field and cookie in, the session cookie out."""
    with httpx.Client(base_url=head.url, timeout=10) as browser:
        found = re.search(r'name="csrf" value="([^"]+)"', browser.get("/login").text)
        assert found is not None
        answer = browser.post("/login", data={"username": username, "password": password, "csrf": found.group(1)})
        assert answer.status_code == 303, answer.text
        assert answer.headers["location"] == "/"
        assert "gpufleet_session" in browser.cookies
        yield browser


# -- logins, groups, locks -------------------------------------------------------------------------------------


def test_a_directory_user_logs_in_to_the_cli_and_the_dashboard_with_their_groups_role_and_projects(
    head: Head, directory: LdapServer, tmp_path: Path
) -> None:
    home = home_of(tmp_path, "alice")
    done = login(head, home, "alice", directory.passwords["alice"])
    assert done.returncode == 0, done.stderr
    assert f"logged in to {head.url} as user alice" in done.stdout
    me = whoami(head, saved_token(home)).json()
    assert (me["user"], me["role"]) == ("alice", "admin")  # gpu-admins -> admin
    alice = head.api("GET", "/api/v1/users/alice")
    assert (alice["source"], alice["uid"], alice["role"]) == ("ldap", 20001, "admin")
    assert "alice" in members(head, "vision")  # ml-vision -> vision
    assert "alice" not in members(head, "nlp")
    # The CLI's own commands work with the saved token: alice is an admin.
    status = gpufleet(home, "directory", "status", "-o", "json", server=head.url)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["identity_provider"] == "ldap"

    with dashboard_login(head, "alice", directory.passwords["alice"]) as browser:
        page = browser.get("/")
        assert page.status_code == 200
        assert "alice" in page.text
        assert "Audit log" in page.text  # an admin's navigation
    # bob, in ml-vision and ml-nlp but no role group, gets the default role and both projects.
    with dashboard_login(head, "bob", directory.passwords["bob"]) as browser:
        assert "Audit log" not in browser.get("/").text
    assert head.api("GET", "/api/v1/users/bob")["role"] == "member"
    assert "bob" in members(head, "vision")
    assert "bob" in members(head, "nlp")
    # A wrong password is refused by the directory's bind.
    wrong = login(head, home_of(tmp_path, "wrong"), "alice", "not-alices-password")
    assert "unknown user name or wrong password" in one_line_error(wrong)


def test_out_of_a_group_they_lose_its_project_at_the_next_scheduled_sync_or_at_once_on_demand(
    head: Head, edit: LdapEdits, tmp_path: Path
) -> None:
    sync_now(head)
    assert "alice" in members(head, "vision")
    edit.remove_member("ml-vision", "alice")
    # Nobody asks for a sync: the leader's own, every ldap_sync_interval_s, takes the project back.
    wait_for(lambda: "alice" not in members(head, "vision"), SYNC_DEADLINE_S, interval=0.5)
    assert head.api("GET", "/api/v1/users/alice")["role"] == "admin"  # still in gpu-admins
    # `gpufleet directory sync` does the same at once.
    assert "bob" in members(head, "nlp")
    edit.remove_member("ml-nlp", "bob")
    synced = gpufleet(home_of(tmp_path, "admin"), "directory", "sync", server=head.url, token=ADMIN)
    assert synced.returncode == 0, synced.stderr
    assert re.search(r"^\d+ directory users: \d+ created, \d+ changed, \d+ disabled$", synced.stdout, re.M)
    assert "bob" not in members(head, "nlp")
    assert "bob" in members(head, "vision")
    assert head.api("GET", "/api/v1/directory")["sources"][0]["error"] == ""


def test_locked_in_the_directory_their_next_login_fails_and_their_token_stops_at_the_next_sync(
    head: Head, directory: LdapServer, edit: LdapEdits, tmp_path: Path
) -> None:
    sync_now(head)
    home = home_of(tmp_path, "alice")
    assert login(head, home, "alice", directory.passwords["alice"]).returncode == 0
    token = saved_token(home)
    assert whoami(head, token).status_code == 200
    edit.lock("alice")
    # The next login asks the directory, which refuses the bind of a locked account.
    again = login(head, home_of(tmp_path, "again"), "alice", directory.passwords["alice"])
    assert "unknown user name or wrong password" in one_line_error(again)
    # The token she has stops at the next refresh (asked for here; the leader's own would do the same, as
    # the group test shows): the sync reads her as disabled, and every request checks the user.
    sync_now(head)
    assert whoami(head, token).status_code == 401
    assert head.api("GET", "/api/v1/users/alice")["enabled"] is False


def test_with_the_directory_down_only_local_accounts_log_in_and_that_is_audited_as_break_glass(
    directory: LdapServer, tmp_path: Path
) -> None:
    """A head whose directory does not answer (its one server's port has nobody listening)."""
    dead = f"ldap://127.0.0.1:{free_port()}"
    down = Head(tmp_path, env=ldap_env(directory, tmp_path, urls=[dead])).start()
    try:
        answer = httpx.post(
            down.url + "/api/v1/login", json={"username": "alice", "password": directory.passwords["alice"]}, timeout=30
        )
        assert answer.status_code == 503, answer.text
        assert "local accounts can still log in" in answer.json()["detail"]
        refused = login(down, home_of(tmp_path, "alice"), "alice", directory.passwords["alice"])
        assert "local accounts can still log in" in one_line_error(refused)
        # The bootstrap admin's token still works, and a local admin with a password still logs in.
        assert whoami(down, ADMIN).json()["role"] == "admin"
        password = "break the glass, carefully"
        down.api("POST", "/api/v1/users", json={"username": "root2", "role": "admin", "password": password})
        home = home_of(tmp_path, "root2")
        done = login(down, home, "root2", password)
        assert done.returncode == 0, done.stderr
        assert (whoami(down, saved_token(home)).json()["role"]) == "admin"
        with dashboard_login(down, "root2", password) as browser:
            assert "root2" in browser.get("/").text
        records = down.api("GET", "/api/v1/audit", params={"actor": "user:root2"})
        glass = [r for r in records if "break-glass" in r["target"]]
        assert len(glass) >= 2, records  # the CLI's login and the dashboard's
        # A sync on demand cannot read the directory: 503, and nothing changes.
        admin = {"Authorization": f"Bearer {ADMIN}"}
        assert httpx.post(down.url + "/api/v1/directory/sync", headers=admin, timeout=30).status_code == 503
        (ldap,) = down.api("GET", "/api/v1/directory")["sources"]
        assert ldap["error"]
    finally:
        down.kill(signal.SIGTERM)


# -- node accounts -----------------------------------------------------------------------------------------------


def _root_without_local_alice(tmp: Path) -> Path:
    """make_root's throwaway root, less its local alice (uid 1500), who would stand in the directory alice's way."""
    root = make_root(tmp, homes=True)
    for name in ("passwd", "group", "shadow", "gshadow"):
        path = root / "etc" / name
        mode = path.stat().st_mode
        path.write_text("".join(line for line in path.read_text().splitlines(True) if not line.startswith("alice:")))
        path.chmod(mode)
    return root


async def _until(predicate: Callable[[], object], seconds: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not await asyncio.to_thread(predicate):
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {seconds}s")
        await asyncio.sleep(0.1)


def test_node_accounts_come_from_the_directory(head: Head, directory: LdapServer, tmp_path: Path) -> None:
    need_account_tools()
    sync_now(head)
    people = {person.username: person for person in directory.directory().users()}
    root = _root_without_local_alice(tmp_path)
    sync = AccountSync(root, tmp_path / "agent" / "accounts.json")
    read = inventory_source(
        lambda: simulated_host("n1", 1), [NvmlReader(SimulatedNvml("n1", gpu_count=1), source="simulated")]
    )

    async def scenario() -> None:
        async with httpx.AsyncClient() as http:
            options = AgentOptions(
                server=head.url, name="n1", join_token=head.join_token(1), accounts=sync, accounts_interval_s=0.2
            )
            agent = Agent(
                options, CredentialStore(tmp_path / "agent" / "credential.json"), AgentHttp(head.url, http), read
            )
            task = asyncio.create_task(agent.run())
            try:
                await _until(lambda: agent.accounts_version is not None, 30)  # set once a whole pass is done
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    asyncio.run(scenario())
    local = read_local_accounts(root)
    for name in ("alice", "bob"):
        person, user = people[name], local.users[name]
        assert person.uid is not None
        assert person.ssh_keys
        assert (user.uid, user.gid, user.shell, user.home) == (person.uid, person.gid, person.shell, person.home)
        assert (root / person.home.lstrip("/")).is_dir() if person.home else False
        keys = (root / "home" / name / ".ssh" / "authorized_keys").read_text()
        assert all(key in keys for key in person.ssh_keys), keys
        assert local.shadow[name].password == "*"  # keys only: no password ever leaves the head
    assert (local.users["alice"].uid, local.users["bob"].uid) == (20001, 20002)
    # dave is locked in the directory: a node never had him, and does not get him.
    assert not people["dave"].enabled
    assert "dave" not in local.users


# -- single sign-on from the CLI ---------------------------------------------------------------------------------


@dataclass
class Sso:
    head: Head
    provider: OidcProvider


@pytest.fixture
def sso(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Sso]:
    """A provider of the test's own and a head signing on through it (gpufleet's own passwords otherwise),
    with projects vision and nlp; ml-nlp maps to operator, so bob's role is his groups'. An indirect
    parameter (ID token lifetime, the head's oidc_leeway_s) replaces the defaults (300 s, 60 s)."""
    ttl_s, leeway_s = getattr(request, "param", (300, 60))
    run_dir, port = tmp_path / "oidc", free_port()
    provider, why = start_oidc_provider(run_dir, port, id_token_ttl_s=ttl_s)
    if provider is None:
        need("oidc provider", why)
    assert provider is not None
    try:
        secret = tmp_path / "oidc-client-secret"
        secret.write_text(provider.web_client_secret + "\n")
        secret.chmod(0o600)
        env = {
            "GPUFLEET_OIDC_ISSUER": provider.issuer,
            "GPUFLEET_OIDC_CLIENT_ID": provider.web_client_id,
            "GPUFLEET_OIDC_CLIENT_SECRET_FILE": str(secret),
            "GPUFLEET_OIDC_CLI_CLIENT_ID": provider.cli_client_id,
            "GPUFLEET_OIDC_GROUP_ROLES": json.dumps({"gpu-admins": "admin", "ml-nlp": "operator"}),
            "GPUFLEET_OIDC_GROUP_PROJECTS": json.dumps(GROUP_PROJECTS),
            "GPUFLEET_OIDC_DEFAULT_ROLE": "viewer",
            "GPUFLEET_OIDC_LEEWAY_S": str(leeway_s),
        }
        h = Head(tmp_path, env=env).start()
        try:
            make_projects(h)
            yield Sso(h, provider)
        finally:
            h.kill(signal.SIGTERM)
    finally:
        stop_oidc_provider(run_dir, port)


def _user_code(line: str) -> str:
    """The code in the CLI's instruction: "Open URI, sign in, enter CODE", or the complete URL's own."""
    found = re.search(r"enter (\S+)$", line)
    if found:
        return found.group(1)
    url = line.removeprefix("Open ").split(" ", 1)[0]
    query = parse_qs(urlsplit(url).query)
    codes = query.get("user_code") or query.get("code")
    assert codes, line
    return codes[0]


@pytest.mark.oidc
def test_login_sso_signs_the_cli_in_through_the_provider_with_the_groups_role(sso: Sso, tmp_path: Path) -> None:
    home = home_of(tmp_path, "bob")
    proc = subprocess.Popen(
        [*GPUFLEET, "--server", sso.head.url, "login", "--sso"],
        env=cli_env(home),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()  # the CLI's first line, printed before it polls
        assert line.startswith("Open "), (line, proc.stderr.read() if proc.poll() is not None and proc.stderr else "")
        sso.provider.approve_device(_user_code(line), "bob")
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert f"logged in to {sso.head.url} as user bob" in out
    me = whoami(sso.head, saved_token(home)).json()
    assert (me["user"], me["role"]) == ("bob", "operator")  # ml-nlp -> operator
    assert sso.head.api("GET", "/api/v1/users/bob")["source"] == "oidc"
    assert "bob" in members(sso.head, "vision")
    assert "bob" in members(sso.head, "nlp")


# -- ID tokens the head refuses ----------------------------------------------------------------------------------

SHORT_TTL_S = 10  # the provider's ID token lifetime in the test below; the head allows no clock skew there


def _claims(token: str) -> dict[str, Any]:
    payload = token.split(".")[1]
    claims: dict[str, Any] = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    return claims


def _resigned(token: str, key: RSAKey) -> str:
    """The token's own key id and claims, signed with `key` instead of the provider's key."""
    header = token.split(".", maxsplit=1)[0]
    kid = json.loads(base64.urlsafe_b64decode(header + "=" * (-len(header) % 4))).get("kid", "k")
    return jwt.encode({"alg": "RS256", "kid": kid}, _claims(token), key)


def _web_id_token(provider: OidcProvider, username: str) -> str:
    """A real ID token of the provider for the dashboard's client (audience gpufleet-web): the code flow with
    PKCE, the person's part done over plain HTTP, the code traded with the client's secret."""
    redirect_uri = REDIRECT_URIS[0]
    client = OidcClient(provider.config())
    try:
        start = client.begin_login(redirect_uri)
        token_endpoint = client.token_endpoint()
    finally:
        client.close()
    code = parse_qs(urlsplit(provider.browser_login(start.url, username)).query)["code"][0]
    answer = httpx.post(
        token_endpoint,
        data={
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": redirect_uri,
            "code_verifier": start.code_verifier,
        },
        auth=(provider.web_client_id, provider.web_client_secret),
        timeout=10,
    )
    assert answer.status_code == 200, answer.text
    token: str = answer.json()["id_token"]
    return token


def _sso_login(head: Head, id_token: str) -> httpx.Response:
    return httpx.post(head.url + "/api/v1/login/sso", json={"id_token": id_token}, timeout=30)


@pytest.mark.oidc
@pytest.mark.parametrize("sso", [(SHORT_TTL_S, 0)], indirect=True, ids=["short-lived-tokens"])
def test_the_head_refuses_id_tokens_with_a_wrong_audience_another_key_or_an_expiry_passed(sso: Sso) -> None:
    """Real tokens of the real provider, given to the running head as `gpufleet login --sso` gives them."""
    head, provider = sso.head, sso.provider
    web_token = _web_id_token(provider, "carol")  # for the dashboard's client, not the CLI's
    cli_token = device_login(
        provider.issuer, provider.cli_client_id, lambda uri, code, complete: provider.approve_device(code, "carol")
    )["id_token"]
    # The CLI's token is good while it lives: the refusals below are the head's checks, nothing else.
    accepted = _sso_login(head, cli_token)
    assert accepted.status_code == 201, accepted.text
    other_key = RSAKey.generate_key(2048)
    for reason, token in {"wrong audience": web_token, "bad signature": _resigned(cli_token, other_key)}.items():
        answer = _sso_login(head, token)
        assert answer.status_code == 401, (reason, answer.text)
        assert reason in answer.json()["detail"], (reason, answer.text)
    # The same good token, once its expiry has passed by the head's clock, is refused.
    expires = _claims(cli_token)["exp"]
    assert expires - time.time() <= SHORT_TTL_S + 2
    time.sleep(max(0.0, expires + 1.5 - time.time()))
    late = _sso_login(head, cli_token)
    assert late.status_code == 401, late.text
    assert "expired" in late.json()["detail"]
    records = head.api("GET", "/api/v1/audit", params={"action": "sso.sso_token"})
    assert len([r for r in records if r["result"] == 401]) >= 3, records
