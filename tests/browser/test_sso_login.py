"""Single sign-on in a real browser (Debian's Chromium through Playwright) against a real head and the real
provider (Debian's glewlwyd, scripts/services/oidc.sh): the login page's "Sign in with single sign-on" leads
to the provider's sign-in page, and back on the dashboard the person is signed in with the role and project
their groups claim maps to (alice: gpu-admins -> admin, ml-vision -> vision); someone in no mapped role group
gets oidc_default_role (bob: viewer). A callback the browser did not start is refused with no session.

The provider's pages are a third party's and log console errors of their own (glewlwyd's login page asks
for a missing locales/en-US/translations.json and for /api/profile_list before anyone signed in), which
gpufleet can do nothing about; so these tests use a plain page from `context` and fail only on console errors
(and the CSP violations `context` reports) of the head's own pages, where the `page` fixture would fail on any.
Screenshots: build/artifacts/screenshots/sso-login.png (the provider's sign-in page), sso-dashboard.png."""

from __future__ import annotations

import json
import re
import signal
from collections.abc import Iterator
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import BrowserContext, ConsoleMessage, Page, expect

from tests.browser.conftest import screenshot
from tests.directory.oidc_fixtures import OidcProvider, start_oidc_provider, stop_oidc_provider
from tests.e2e.conftest import Head, free_port
from tests.services import need

pytestmark = [pytest.mark.e2e, pytest.mark.browser, pytest.mark.oidc, pytest.mark.xdist_group("test_sso_login")]
PROVIDER_COOKIE = "GLEWLWYD2_SESSION_ID"  # glewlwyd's session (oidc.sh: session_key)
ADMIN_ONLY_NAV = ("Audit log", "Users")


@dataclass
class Sso:
    head: Head
    provider: OidcProvider


@pytest.fixture(scope="module")
def sso(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sso]:
    """A head whose single sign-on is a provider of its own: the provider accepts exactly the head's callback
    URL, so the head's port is chosen first. Project vision exists before anyone signs in."""
    tmp = tmp_path_factory.mktemp("sso")
    head = Head(tmp)  # its port is picked now; the server starts on it below
    run_dir, port = tmp / "oidc", free_port()
    provider, why = start_oidc_provider(run_dir, port, redirect_uris=(f"{head.url}/login/sso/callback",))
    if provider is None:
        need("oidc provider", why)
    assert provider is not None
    try:
        secret = tmp / "oidc-client-secret"
        secret.write_text(provider.web_client_secret + "\n")
        secret.chmod(0o600)
        head.env = {
            "GPUFLEET_OIDC_ISSUER": provider.issuer,
            "GPUFLEET_OIDC_CLIENT_ID": provider.web_client_id,
            "GPUFLEET_OIDC_CLIENT_SECRET_FILE": str(secret),
            "GPUFLEET_OIDC_CLI_CLIENT_ID": provider.cli_client_id,
            "GPUFLEET_OIDC_GROUP_ROLES": json.dumps({"gpu-admins": "admin"}),
            "GPUFLEET_OIDC_GROUP_PROJECTS": json.dumps({"ml-vision": "vision"}),
            "GPUFLEET_OIDC_DEFAULT_ROLE": "viewer",
        }
        head.start()
        try:
            head.api("POST", "/api/v1/projects", json={"name": "vision"})
            yield Sso(head, provider)
        finally:
            head.kill(signal.SIGTERM)
    finally:
        stop_oidc_provider(run_dir, port)


@dataclass
class HeadErrors:
    """Console errors and uncaught exceptions on the head's own pages; `expected` (path, status) pairs are
    statuses the test asks for, e.g. a refused callback's 400, which Chromium logs as a failed load."""

    origin: str
    errors: list[str] = field(default_factory=list)
    expected: list[tuple[str, int]] = field(default_factory=list)

    def watch(self, pg: Page) -> None:
        def on_console(msg: ConsoleMessage) -> None:
            url = msg.location.get("url", "") or pg.url
            if msg.type != "error" or not url.startswith(self.origin + "/"):
                return  # the provider's pages are not gpufleet's to answer for
            path = urlsplit(url).path
            if not any(path == p and f"status of {code}" in msg.text for p, code in self.expected):
                self.errors.append(f"{msg.text} ({url})")

        def on_error(exc: Exception) -> None:
            if pg.url.startswith(self.origin + "/"):
                self.errors.append(f"{exc} ({pg.url})")

        pg.on("console", on_console)
        pg.on("pageerror", on_error)


@pytest.fixture
def head_errors(context: BrowserContext, sso: Sso) -> Iterator[HeadErrors]:
    """Watches every page opened in `context`; the test fails on any error of the head's pages."""
    watched = HeadErrors(sso.head.url)
    context.on("page", watched.watch)
    yield watched
    assert not watched.errors, f"browser console errors on the head's pages: {watched.errors}"


def sign_on(pg: Page, sso: Sso, user: str, shot: str | None = None) -> None:
    """From the head's login page: the SSO link, the provider's sign-in as `user`, Continue, the dashboard."""
    head, provider = sso.head, sso.provider
    pg.goto(head.url + "/")
    expect(pg).to_have_url(head.url + "/login")
    link = pg.locator("a#sso")
    expect(link).to_have_text("Sign in with single sign-on")
    link.click()
    expect(pg).to_have_url(re.compile(re.escape(provider.base_url) + r"/.*login\.html"))
    pg.locator("#username").fill(user)
    pg.locator("#password").fill(provider.password(user))
    if shot:
        screenshot(pg, shot)
    pg.locator("#loginbut").click()
    pg.get_by_role("button", name="Continue").click()
    expect(pg).to_have_url(head.url + "/")
    expect(pg.locator("#user")).to_have_text(user)


def test_alice_and_bob_sign_on_with_their_groups_role_and_project(
    sso: Sso, context: BrowserContext, head_errors: HeadErrors
) -> None:
    head = sso.head
    pg = context.new_page()

    sign_on(pg, sso, "alice", shot="sso-login")
    nav = pg.get_by_role("navigation", name="Main")
    expect(pg.locator("header .role")).to_have_text("admin")  # gpu-admins -> admin
    for title in ADMIN_ONLY_NAV:
        expect(nav.get_by_role("link", name=title, exact=True)).to_be_visible()
    nav.get_by_role("link", name="Users", exact=True).click()
    expect(pg).to_have_url(head.url + "/users")
    alice = pg.locator('#users tr[data-user="alice"]')
    expect(alice.locator("td").nth(2)).to_have_text("admin")
    expect(alice.locator("td").nth(3)).to_have_text("oidc")
    screenshot(pg, "sso-dashboard")
    user = head.api("GET", "/api/v1/users/alice")
    assert (user["source"], user["role"]) == ("oidc", "admin")
    assert head.api("GET", "/api/v1/projects/vision")["members"] == ["alice"]  # ml-vision -> vision

    pg.get_by_role("button", name="Log out").click()
    expect(pg).to_have_url(head.url + "/login")
    pg.goto(head.url + "/")  # the session ended on the server
    expect(pg).to_have_url(head.url + "/login")

    # The provider still knows alice (its own session); bob signs in afresh, as on a shared machine after
    # alice signed out at the provider too.
    context.clear_cookies(name=PROVIDER_COOKIE)
    sign_on(pg, sso, "bob")
    expect(pg.locator("header .role")).to_have_text("viewer")  # no mapped role group: oidc_default_role
    expect(nav.get_by_role("link", name="Projects", exact=True)).to_be_visible()
    for title in ADMIN_ONLY_NAV:
        expect(nav.get_by_role("link", name=title, exact=True)).to_have_count(0)
    head_errors.expected.append(("/users", 403))
    pg.goto(head.url + "/users")
    expect(pg.locator("main")).to_contain_text("a viewer may not see this page")
    expect(pg.locator("#users")).to_have_count(0)
    user = head.api("GET", "/api/v1/users/bob")
    assert (user["source"], user["role"]) == ("oidc", "viewer")
    assert head.api("GET", "/api/v1/projects/vision")["members"] == ["alice", "bob"]  # bob is in ml-vision too
    pg.close()


def test_a_callback_this_browser_did_not_start_is_refused_without_a_session(
    sso: Sso, context: BrowserContext, head_errors: HeadErrors
) -> None:
    head = sso.head
    head_errors.expected.append(("/login/sso/callback", 400))
    pg = context.new_page()
    pg.goto(head.url + "/login/sso/callback?code=stolen-code&state=someone-elses-state")
    expect(pg.get_by_role("alert")).to_contain_text("did not start here")
    expect(pg.locator("a#sso")).to_be_visible()  # the login page, to try again
    assert not [c for c in context.cookies() if c["name"] == "gpufleet_session"]
    pg.goto(head.url + "/")
    expect(pg).to_have_url(head.url + "/login")
    pg.close()
