"""The Burn-in and Maintenance pages in a real browser (Debian's Chromium through Playwright) against a
real head: sixteen registered nodes whose burn-in results and campaigns are written straight into the
head's database (scripts/lifecycle_demo.py: three nodes failed, one slow node, a campaign stopped by its
canary). What an operator reads: who is held and why, the failed step with its value and threshold, the
outliers marked, each campaign node's phase; and a run failing later shows up without a reload. Every
page runs under the head's Content-Security-Policy: the `page` fixture fails on any violation.
Screenshots go to build/artifacts/screenshots."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import pytest
from playwright.sync_api import Page, expect
from scripts.lifecycle_demo import Seeded, seed
from sqlalchemy import select
from sqlalchemy.orm import Session

from gpufleet.core.db import make_engine, make_session_factory, transaction
from gpufleet.inventory.models import Node
from tests.browser.conftest import screenshot
from tests.e2e.conftest import Head
from tests.lifecycle.seed import S, add_run

pytestmark = [pytest.mark.e2e, pytest.mark.browser, pytest.mark.xdist_group("test_lifecycle_pages")]
PASSWORD = "correct horse battery"
NAMES = [f"sim{i:03d}" for i in range(1, 17)]
T = TypeVar("T")


@dataclass
class Fleet:
    head: Head
    seeded: Seeded

    @property
    def url(self) -> str:
        return self.head.url


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("lifecycle")
    head = Head(tmp).start()
    try:
        head.api("POST", "/api/v1/users", json={"username": "alice", "role": "operator", "password": PASSWORD})
        head.api("POST", "/api/v1/nodes", json={"names": ["sim[001-016]"]})
        yield Fleet(head, _write(head, lambda s: seed(s, NAMES)))
    finally:
        head.kill()


def _write(head: Head, work: Callable[[Session], T]) -> T:
    """Run `work(session)` in a transaction on the head's own database (SQLite in WAL mode: the running
    head reads on while this writes)."""
    engine = make_engine(f"sqlite:///{head.tmp / 'head' / 'gpufleet.db'}")
    try:
        with transaction(make_session_factory(engine)) as session:
            return work(session)
    finally:
        engine.dispose()


def log_in(page: Page, url: str) -> None:
    page.goto(url + "/login")
    page.get_by_label("User name").fill("alice")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect(page).to_have_url(url + "/")


def test_the_burnin_page_shows_who_is_held_why_and_the_outliers(fleet: Fleet, page: Page) -> None:
    seeded = fleet.seeded
    log_in(page, fleet.url)
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Burn-in").click()
    expect(page).to_have_url(fleet.url + "/burn-in")
    expect(page.locator("h1")).to_have_text("Burn-in")

    held = page.locator("#held tbody tr")
    expect(held).to_have_count(3)
    expect(page.locator('#held tr[data-hold="burn-in-failed"]')).to_have_count(3)
    weak = page.locator(f'#held tr[data-node="{seeded.weak_gpu}"]')
    expect(weak).to_contain_text(re.compile(r"gemm: 4\d\d(\.\d)? TFLOPS under threshold 600 \(GPU 3\)"))
    expect(page.locator(f'#held tr[data-node="{seeded.weak_link}"]')).to_contain_text("network: 191.4 Gbit/s with")
    expect(page.locator(f'#held tr[data-node="{seeded.wrong_results}"]')).to_contain_text("checksum mismatch")

    # gemm on the H200s: the weak GPU and the slow node (which passed its threshold) are outliers.
    gemm = page.locator('#fleet-metrics tr[data-step="gemm"]')
    expect(gemm.locator("[data-outlier]")).to_have_text([re.compile(seeded.weak_gpu), re.compile(seeded.slow)])
    expect(gemm).to_contain_text("≥ 600")
    expect(page.locator('#fleet-metrics tr[data-step="network"] [data-outlier]')).to_have_text(
        [re.compile(seeded.weak_link)]
    )
    expect(page.locator("#runs tbody tr")).to_have_count(len(NAMES))

    # A step's every value, worst first, the outliers marked.
    gemm.get_by_role("link", name="gemm").click()
    expect(page).to_have_url(re.compile(r"/burn-in\?step=gemm"))
    values = page.locator('table.fleet-values[data-step="gemm"] tbody tr')
    expect(values).to_have_count(len(NAMES))
    expect(values.nth(0)).to_have_attribute("data-node", seeded.weak_gpu)
    expect(values.nth(1)).to_have_attribute("data-node", seeded.slow)
    expect(page.locator("table.fleet-values tr.outlier-worse")).to_have_count(2)
    expect(values.nth(1).locator(".step-passed")).to_have_text("passed")  # an outlier, yet over its threshold
    screenshot(page, "burn-in")


def test_a_run_shows_the_failed_step_its_value_and_threshold(fleet: Fleet, page: Page) -> None:
    seeded = fleet.seeded
    log_in(page, fleet.url)
    page.goto(fleet.url + "/burn-in")
    page.locator(f'#held tr[data-node="{seeded.weak_gpu}"]').get_by_role("link", name=re.compile(r"^run ")).click()
    expect(page).to_have_url(f"{fleet.url}/burn-in/{seeded.runs[seeded.weak_gpu]}")
    expect(page.locator("#run-state")).to_have_text("failed")
    expect(page.locator("#run-hold")).to_have_text("node held: burn-in-failed")
    step = page.locator('#steps tr[data-step="gemm"]')
    expect(step).to_have_attribute("data-state", "failed")
    expect(step.locator(".value")).to_have_text(re.compile(r"^4\d\d(\.\d)? TFLOPS$"))
    expect(step.locator(".threshold")).to_have_text("≥ 600 TFLOPS")
    expect(step.locator("td.num.down")).to_have_text(re.compile(r"^\u22121\d\.\d %$"))  # the margin
    step.locator("details summary").click()
    expect(step.locator("pre.evidence")).to_contain_text('"per_gpu"')
    # The steps after the failure did not run.
    expect(page.locator('#steps tr[data-state="skipped"]')).to_have_count(6)
    screenshot(page, "burn-in-run")

    # The node's page names its hold and leads back to the run.
    page.get_by_role("link", name=seeded.weak_gpu).first.click()
    expect(page).to_have_url(f"{fleet.url}/nodes/{seeded.weak_gpu}")
    expect(page.locator("#node-hold")).to_have_text("held: burn-in-failed")
    expect(page.locator("#burnin")).to_contain_text("failed")
    page.locator("#burnin").get_by_role("link", name=re.compile(r"^run ")).click()
    expect(page).to_have_url(f"{fleet.url}/burn-in/{seeded.runs[seeded.weak_gpu]}")


def test_campaigns_show_each_nodes_phase(fleet: Fleet, page: Page) -> None:
    seeded = fleet.seeded
    log_in(page, fleet.url)
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Maintenance").click()
    expect(page).to_have_url(fleet.url + "/maintenance")
    rows = page.locator("#campaigns tbody tr")
    expect(rows).to_have_count(2)
    stopped = page.locator(f'#campaigns tr[data-campaign="{seeded.stopped_campaign}"]')
    expect(stopped).to_have_attribute("data-state", "stopped")
    expect(stopped).to_contain_text("1/16")
    expect(stopped.locator('[data-phase="pending"]')).to_have_text("15 pending")
    expect(page.locator(f'#campaigns tr[data-campaign="{seeded.done_campaign}"]')).to_contain_text("16/16")

    stopped.get_by_role("link", name=seeded.stopped_campaign).click()
    expect(page).to_have_url(f"{fleet.url}/maintenance/{seeded.stopped_campaign}")
    expect(page.locator("#campaign-state")).to_have_text("stopped")
    expect(page.locator("#campaign-reason")).to_contain_text(f"the canary {NAMES[0]} failed")
    nodes = page.locator("#campaign-nodes tbody tr")
    expect(nodes).to_have_count(len(NAMES))
    expect(nodes.nth(0)).to_have_attribute("data-phase", "failed")
    expect(nodes.nth(0)).to_contain_text("canary")
    expect(page.locator('#campaign-nodes tr[data-phase="pending"]')).to_have_count(15)
    expect(page.locator("#campaign-actions li")).to_have_text(["sync-image:base@3", "reboot"])
    screenshot(page, "maintenance")


def test_a_new_failure_appears_without_a_reload(fleet: Fleet, page: Page) -> None:
    log_in(page, fleet.url)
    page.goto(fleet.url + "/burn-in")
    page.evaluate("window.notReloaded = true")
    node = NAMES[1]

    def fail(session: Session) -> int:
        run = add_run(
            session,
            node,
            [S("gpu-memory", "failed", 2900.0, 3400.0, "GB/s", detail="2900 GB/s under threshold 3400")],
            reason="gpu-memory: 2900 GB/s under threshold 3400",
            profile="full",
            batch="manual",
        )
        row = session.scalars(select(Node).where(Node.name == node)).one()
        row.hold = "burn-in-failed"
        return run

    run = _write(fleet.head, fail)
    try:
        expect(page.locator(f'#held tr[data-node="{node}"]')).to_contain_text("gpu-memory: 2900 GB/s", timeout=10_000)
        expect(page.locator("#runs tbody tr").first).to_have_attribute("data-run", str(run))
        assert page.evaluate("window.notReloaded") is True
    finally:
        _write(fleet.head, lambda s: _release(s, node))


def _release(session: Session, node: str) -> None:
    session.scalars(select(Node).where(Node.name == node)).one().hold = None


def test_the_pages_fit_a_laptop_screen(fleet: Fleet, page: Page) -> None:
    """At 1280x800 no page scrolls sideways (wide tables scroll inside themselves)."""
    seeded = fleet.seeded
    log_in(page, fleet.url)
    for path in (
        "/burn-in",
        "/burn-in?step=gemm",
        f"/burn-in/{seeded.runs[seeded.weak_link]}",
        "/maintenance",
        f"/maintenance/{seeded.stopped_campaign}",
        f"/nodes/{seeded.weak_gpu}",
    ):
        page.goto(fleet.url + path)
        expect(page.locator("h1")).to_be_visible()
        overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
        assert overflow <= 0, f"{path} is {overflow} px too wide"
