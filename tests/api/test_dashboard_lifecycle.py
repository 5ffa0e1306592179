"""The Burn-in and Maintenance pages over HTTP (api.dashboard.lifecycle): held nodes with why, the fleet
view with an outlier marked, a run's failed step with its value and threshold, campaigns with their nodes'
phases, the node page's burn-in line; fragments, filters, errors, and a viewer may read them all."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from gpufleet.api.dashboard.lifecycle import duration, num, pct_from, signed
from gpufleet.core.db import transaction
from gpufleet.inventory.models import Node
from tests.api.dashboard_helpers import csrf_header, logged_in, up_node
from tests.lifecycle.seed import T0, S, add_campaign, add_run

# One database: pages over the services that test_campaigns runs on both.
pytestmark = pytest.mark.one_database


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    """SQLite only: pages, forms and input parsing are HTTP translation, the same on both databases (the
    domain tests run both)."""
    return f"sqlite:///{tmp_path / 'gpufleet.db'}"


HEALTHY = (700.0, 702.0, 698.0, 705.0, 695.0, 701.0)


def _seed(client: TestClient) -> dict[str, int]:
    """Eight H200 nodes burnt in: sim007 failed gemm and is held; sim008 passed but slower than the rest."""
    for i in range(1, 9):
        up_node(client, f"sim{i:03d}")
    ctx = client.app.state.ctx  # type: ignore[attr-defined]
    ids: dict[str, int] = {}
    with transaction(ctx.sessions) as s:
        for i, value in enumerate(HEALTHY, 1):
            add_run(
                s, f"sim{i:03d}", [S("gemm", "passed", value, 600.0), S("thermal", "passed", 70.0, 87.0, "C", "lower")]
            )
        ids["failed"] = add_run(
            s,
            "sim007",
            [
                S("gemm", "failed", 480.0, 600.0, job_id=41, evidence={"per_gpu": {"3": 480.0}}),
                S("network", "passed", 380.0, 320.0, "Gbit/s", partner="sim002", attempts=2),
                S("dcgm", "skipped", detail="dcgmi is not installed"),
            ],
            reason="gemm: 480 TFLOPS under threshold 600 (GPU 3)",
            at=T0 + timedelta(minutes=5),
        )
        ids["slow"] = add_run(s, "sim008", [S("gemm", "passed", 640.0, 600.0)], at=T0 + timedelta(minutes=6))
        node = s.scalars(select(Node).where(Node.name == "sim007")).one()
        node.hold, node.drained_at, node.drain_reason = "burn-in-failed", T0, "gpufleet: burn-in failed"
        add_campaign(
            s,
            "image-r3",
            [("sim001", "done"), ("sim002", "acting"), ("sim003", "waiting"), ("sim004", "pending")],
            actions=[{"kind": "sync-image", "image": "base", "revision": 3}, {"kind": "reboot"}],
            policy={"max_unavailable": "2", "canary": True, "failure_budget": 1, "wait_jobs_s": 5400.0},
        )
    return ids


def test_the_burnin_page_shows_held_nodes_the_fleet_with_outliers_and_runs(client: TestClient) -> None:
    ids = _seed(client)
    browser = logged_in(client)  # a viewer: reading the cluster is enough
    html = browser.get("/burn-in").text
    held = html.split('id="held"', 1)[1].split("</table>", 1)[0]
    assert re.findall(r'data-node="([^"]+)" data-hold="([^"]+)"', held) == [("sim007", "burn-in-failed")]
    assert "gemm: 480 TFLOPS under threshold 600 (GPU 3)" in held
    assert f'href="/burn-in/{ids["failed"]}"' in held

    fleet = html.split('id="fleet-metrics"', 1)[1].split("</table>", 1)[0]
    assert re.findall(r'data-outlier="([^"]+)"', fleet) == ["sim007", "sim008"]  # the slow node too, over 600
    gemm = fleet.split('data-step="gemm"', 1)[1].split("</tr>", 1)[0]
    assert "NVIDIA H200" in gemm
    assert ">699 TFLOPS<" in gemm  # the median of eight: (698 + 700) / 2
    assert "≥ 600" in gemm

    runs = html.split('id="runs"', 1)[1].split("</table>", 1)[0]
    assert re.findall(r'data-run="(\d+)"', runs)[:2] == [str(ids["slow"]), str(ids["failed"])]
    # The built-in profiles, with their thresholds per GPU model; admission is off by default.
    assert 'data-profile="quick"' in html
    assert "h200 ≥ 600" in html
    assert "Admission is off" in html

    only = browser.get("/burn-in?state=failed&node=sim007", headers={"HX-Request": "true"}).text
    assert '<section id="live"' in only
    assert "<html" not in only
    assert re.findall(r'data-run="(\d+)"', only) == [str(ids["failed"])]


def test_a_steps_values_across_the_fleet_worst_first(client: TestClient) -> None:
    _seed(client)
    browser = logged_in(client)
    html = browser.get("/burn-in?step=gemm").text
    table = html.split('class="fleet-values" data-step="gemm"', 1)[1].split("</table>", 1)[0]
    assert re.findall(r'<tr data-node="([^"]+)"', table)[:2] == ["sim007", "sim008"]
    assert re.findall(r'data-node="([^"]+)" class="outlier-worse"', table) == ["sim007", "sim008"]
    assert "\u221231.3 %" in table  # 480 against a median of 699
    assert 'id="no-values"' in browser.get("/burn-in?step=nothing").text


def test_a_run_page_shows_the_failed_step_with_its_value_threshold_and_job(client: TestClient) -> None:
    ids = _seed(client)
    browser = logged_in(client)
    html = browser.get(f"/burn-in/{ids['failed']}").text
    assert 'id="run-state">failed<' in html
    assert "node held: burn-in-failed" in html
    gemm = html.split('data-step="gemm"', 1)[1].split("</tr>", 1)[0]
    assert 'data-state="failed"' in gemm
    assert '<td class="num value">480 TFLOPS</td>' in gemm
    assert "≥ 600 TFLOPS" in gemm
    assert '<td class="num down">\u221220.0 %</td>' in gemm  # the margin: on the failing side
    assert '<a href="/jobs/41">41</a>' in gemm
    assert '"3": 480.0' in gemm  # the evidence
    network = html.split('data-step="network"', 1)[1].split("</tr>", 1)[0]
    assert '<a href="/nodes/sim002">sim002</a>' in network
    assert "dcgmi is not installed" in html
    missing = browser.get("/burn-in/99999")
    assert missing.status_code == 404
    assert "no burn-in run 99999" in missing.text
    assert browser.get("/burn-in?before=x").status_code == 400


def test_campaign_pages_show_progress_and_each_nodes_phase(client: TestClient) -> None:
    _seed(client)
    browser = logged_in(client)
    html = browser.get("/maintenance").text
    row = html.split('data-campaign="image-r3"', 1)[1].split("</tr>", 1)[0]
    assert "1/4" in row
    assert re.findall(r'data-phase="([a-z]+)">(\d+)', row) == [
        ("pending", "1"),
        ("waiting", "1"),
        ("acting", "1"),
        ("done", "1"),
    ]
    assert "sync-image:base@3 → reboot" in row
    assert browser.get("/maintenance?state=completed").text.count("data-campaign=") == 0

    page = browser.get("/maintenance/image-r3").text
    nodes = page.split('id="campaign-nodes"', 1)[1].split("</table>", 1)[0]
    assert re.findall(r'<tr data-node="([^"]+)" data-phase="([^"]+)"', nodes) == [
        ("sim001", "done"),
        ("sim002", "acting"),
        ("sim003", "waiting"),
        ("sim004", "pending"),
    ]
    assert "canary" in nodes.split('data-node="sim002"', 1)[0]
    assert 'id="campaign-out">2<' in page
    assert "<dt>max unavailable</dt><dd>2</dd>" in page
    assert "<dt>canary first</dt><dd>yes</dd>" in page
    assert "<dt>wait for jobs</dt><dd>90 min</dd>" in page
    assert browser.get("/maintenance/nothing").status_code == 404


def test_the_node_page_links_its_latest_burnin_and_hold(client: TestClient) -> None:
    ids = _seed(client)
    browser = logged_in(client)
    html = browser.get("/nodes/sim007").text
    assert 'id="node-hold" href="/burn-in">held: burn-in-failed<' in html
    line = html.split('id="burnin"', 1)[1].split("</dd>", 1)[0]
    assert f'<a href="/burn-in/{ids["failed"]}">run {ids["failed"]}</a>' in line
    assert "gemm: 480 TFLOPS under threshold 600" in line
    assert 'href="/burn-in?node=sim007">all 1<' in line
    fresh = up_node(client, "fresh01")
    assert fresh
    assert ">never<" in browser.get("/nodes/fresh01").text.split('id="burnin"', 1)[1].split("</dd>", 1)[0]


def test_the_pages_are_in_the_top_bar_and_empty_pages_say_so(client: TestClient) -> None:
    browser = logged_in(client)
    html = browser.get("/burn-in").text
    assert '<a href="/burn-in" aria-current="page">Burn-in</a>' in html
    assert '<a href="/maintenance">Maintenance</a>' in html
    assert "No node is held" in html
    assert "No measurement yet" in html
    assert "No burn-in run yet" in html
    assert "No campaign yet" in browser.get("/maintenance").text


def test_figures_read_as_people_write_them() -> None:
    assert [num(v) for v in (None, 3412.4, 41.46, 0.98765)] == ["", "3,412", "41.5", "0.988"]
    assert pct_from(480.0, 600.0) == "\u221220.0 %"
    assert pct_from(700.01, 700.0) == "0.0 %"  # never "−0.0"
    assert pct_from(5.0, 0.0) == ""
    assert signed(3.14159) == "+3.1"
    assert [duration(s) for s in (86_400, 3600, 5400, 90, 1.5)] == ["1 d", "1 h", "90 min", "90 s", "1.5 s"]


def test_campaign_buttons_call_the_campaign_api_for_those_who_may(client: TestClient) -> None:
    _seed(client)
    viewer = logged_in(client)
    assert 'data-action="/api/v1/maintenance/' not in viewer.get("/maintenance/image-r3").text
    admin = logged_in(client, role="admin", username="ada")
    page = admin.get("/maintenance/image-r3").text
    buttons = re.findall(r'data-action="(/api/v1/maintenance/campaigns/[^"]+)"', page)
    assert buttons == ["/api/v1/maintenance/campaigns/image-r3/pause", "/api/v1/maintenance/campaigns/image-r3/cancel"]
    # The button's URL is the campaign API's route: pressing it pauses the campaign.
    answer = admin.post(buttons[0], headers=csrf_header(admin))
    assert answer.status_code == 200, answer.text
    page = admin.get("/maintenance/image-r3").text
    assert 'id="campaign-state">paused<' in page
    assert re.findall(r'data-action="/api/v1/maintenance/campaigns/image-r3/(\w+)"', page) == ["resume", "cancel"]
