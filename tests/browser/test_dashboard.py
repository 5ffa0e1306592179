"""The dashboard in a real browser against a real head and simulated nodes."""

from __future__ import annotations

import re
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.browser.conftest import screenshot
from tests.e2e.conftest import Head, start_sim, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.browser]
PASSWORD = "correct horse battery"


@pytest.fixture
def head(tmp_path: Path) -> Iterator[Head]:
    h = Head(tmp_path).start()
    h.api("POST", "/api/v1/users", json={"username": "alice", "role": "operator", "password": PASSWORD})
    yield h
    h.kill(signal.SIGTERM)


def _log_in(page: Page, head: Head) -> None:
    page.goto(head.url + "/")
    expect(page).to_have_url(head.url + "/login")
    page.get_by_label("User name").fill("alice")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect(page).to_have_url(head.url + "/")


def test_log_in_watch_nodes_join_live_and_log_out(head: Head, page: Page, tmp_path: Path) -> None:
    page.goto(head.url + "/login")
    page.get_by_label("User name").fill("alice")
    page.get_by_label("Password").fill("not the password")
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("alert")).to_contain_text("wrong password")
    screenshot(page, "login")

    _log_in(page, head)
    expect(page.locator("#user")).to_have_text("alice")
    expect(page.locator("#nodes-total .value")).to_have_text("0")
    expect(page.get_by_role("navigation", name="Main").get_by_role("link")).to_have_text(
        ["Overview", "Nodes", "Alerts"]
    )

    # The page stays open while nodes join: htmx refreshes the fragment (every 5 s) without a reload.
    page.evaluate("window.notReloaded = true")
    sim = start_sim(tmp_path, head.url, head.join_token(4), 4)
    try:
        wait_for(lambda: [n["state"] for n in head.nodes()].count("up") == 4, timeout=20, interval=0.2)
        expect(page.locator("#nodes-up .value")).to_have_text("4", timeout=8_000)
        assert page.evaluate("window.notReloaded") is True
        expect(page.locator("#nodes-total .value")).to_have_text("4")
        expect(page.locator("#fleet .tile")).to_have_text(["sim001", "sim002", "sim003", "sim004"])
        expect(page.locator("#gpus-total .value")).to_have_text("32")
        expect(page.locator("#no-alerts")).to_be_visible()
        screenshot(page, "overview")

        page.get_by_role("link", name="Nodes").click()
        expect(page).to_have_url(head.url + "/nodes")
        expect(page.locator("#nodes tbody tr")).to_have_count(4)
        expect(page.locator("#sim001")).to_contain_text("up")
        screenshot(page, "nodes")

        page.get_by_role("link", name="Alerts").click()
        expect(page.locator("#alerts")).to_be_visible()
        screenshot(page, "alerts")
    finally:
        sim.send_signal(signal.SIGKILL)
        sim.wait()

    page.get_by_role("button", name="Log out").click()
    expect(page).to_have_url(head.url + "/login")
    page.goto(head.url + "/")  # the session ended on the server, not only in this browser
    expect(page).to_have_url(head.url + "/login")


def test_htmx_requests_carry_the_csrf_token(head: Head, page: Page) -> None:
    _log_in(page, head)
    token = page.locator('meta[name="csrf-token"]').get_attribute("content")
    assert token
    with page.expect_request(re.compile(r"/fragments/overview$"), timeout=8_000) as polled:
        pass
    assert polled.value.headers.get("x-csrf-token") == token
    assert polled.value.headers.get("hx-request") == "true"
