"""A real Chromium driven by Playwright for Python, for the dashboard's browser tests.

Debian's /usr/bin/chromium (`bash scripts/services/chromium.sh install`, which .ci/run does) is
launched with `executable_path`: Playwright never downloads a browser here (`playwright install`
cannot work on a closed network). The flags keep Chromium off the network it cannot reach. One
browser per test module (see `browser`); each test gets its own context (cookies) and page, and screenshots go to
build/artifacts/screenshots. Where Chromium or the dashboard's front-end files are missing, the
tests skip saying why (a failure in CI, GPUFLEET_REQUIRE_SERVICES=1).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from scripts.chromium_flags import CHROMIUM, CHROMIUM_ARGS

from gpufleet.api.templates import missing_vendor_files
from tests.conftest import ROOT, need

if TYPE_CHECKING:
    from playwright.sync_api import Browser, BrowserContext, ConsoleMessage, Page

SCREENSHOTS = ROOT / "build" / "artifacts" / "screenshots"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """One Chromium per test module. Not per session: while Playwright's sync API is running it owns
    the thread's asyncio event loop, so every later test that calls asyncio.run() in the same
    (xdist worker) process would fail with "cannot be called from a running event loop"; pytest
    tears a module-scoped fixture down as soon as the worker moves on to another module."""
    if not CHROMIUM.is_file():
        need("Chromium", f"{CHROMIUM} not installed (bash scripts/services/chromium.sh install)")
    missing = missing_vendor_files()
    if missing:
        need("dashboard front-end files", f"{', '.join(missing)} missing (make assets)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


# Every Content-Security-Policy violation a page meets is logged as a console error (which `page`
# fails the test on): the head's policy allows no inline script, style or handler, so a template that
# grew one would be refused in the browser without breaking anything visibly.
REPORT_CSP_VIOLATIONS = """
document.addEventListener("securitypolicyviolation", (e) => console.error(
  `CSP violation: ${e.effectiveDirective} blocked ${e.blockedURI || "inline"} at ${e.sourceFile}:${e.lineNumber}`));
"""


@pytest.fixture
def context(browser: Browser) -> Iterator[BrowserContext]:
    ctx = browser.new_context(viewport={"width": 1280, "height": 800})
    ctx.set_default_timeout(10_000)
    ctx.add_init_script(REPORT_CSP_VIOLATIONS)
    yield ctx
    ctx.close()


@pytest.fixture
def page(context: BrowserContext) -> Iterator[Page]:
    """A page that fails the test on any console error or uncaught exception in the browser."""
    pg = context.new_page()
    errors: list[str] = []

    def on_console(msg: ConsoleMessage) -> None:
        # A wrong password is answered 401 with the login form, which Chromium logs as a failed load.
        expected = "status of 401" in msg.text and msg.location.get("url", "").endswith("/login")
        if msg.type == "error" and not expected:
            errors.append(f"{msg.text} ({msg.location.get('url', '')})")

    pg.on("console", on_console)
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    yield pg
    assert not errors, f"browser console errors: {errors}"


def screenshot(page: Page, name: str) -> Path:
    """Save a full-page screenshot as build/artifacts/screenshots/<name>.png."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
