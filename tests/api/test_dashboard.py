"""The dashboard's pages over HTTP: what they show, to whom, and how they refuse (the browser tests
are in tests/browser)."""

from __future__ import annotations

import html
import re

import pytest
from fastapi.testclient import TestClient

from gpufleet.api.dashboard import nodes as dashboard_nodes
from gpufleet.api.templates import missing_vendor_files, static_url
from gpufleet.core.db import transaction
from gpufleet.inventory import service as inventory
from gpufleet.inventory.models import Node
from gpufleet.inventory.states import NodeState
from gpufleet.monitoring import alerts
from tests.api.dashboard_helpers import csrf_header, logged_in, row_names, stat, up_node, write_gpu_sample
from tests.conftest import need

# Pages, forms and input parsing: HTTP translation, the same on both databases (the domain tests run both).
pytestmark = pytest.mark.one_database


def test_overview_counts_nodes_by_state_and_gpus_by_use(client: TestClient) -> None:
    client.post("/api/v1/nodes", json={"names": ["new[1-2]"]})
    busy = up_node(client, "busy1", gpus=4)
    write_gpu_sample(client, busy, [90.0, 60.0, 0.0, 1.0])
    up_node(client, "quiet1", gpus=2)  # up, but no metrics yet
    page = logged_in(client).get("/")
    assert page.status_code == 200
    assert page.headers["cache-control"] == "no-store"
    html = page.text
    assert (stat(html, "nodes-total"), stat(html, "nodes-up"), stat(html, "nodes-new")) == ("4", "2", "2")
    assert stat(html, "gpus-total") == "6"
    assert (stat(html, "gpus-in_use"), stat(html, "gpus-idle"), stat(html, "gpus-unavailable")) == ("2", "2", "2")
    assert stat(html, "gpus-faulty") == "0"
    assert all(f'data-node="{n}"' in html for n in ("new1", "new2", "busy1", "quiet1"))
    assert 'hx-trigger="every 5s, refresh from:body"' in html
    assert 'aria-current="page">Overview' in html
    assert 'data-chart="/api/v1/fleet/metrics?metric=gpu_util&amp;since=1h"' in html


def test_a_gpu_a_node_lost_or_a_verdict_names_is_faulty(client: TestClient) -> None:
    node_id = up_node(client, "sick1", gpus=4)
    write_gpu_sample(client, node_id, [0.0, 0.0, 0.0])  # GPU 3 stopped reporting
    ctx = client.app.state.ctx  # type: ignore[attr-defined]
    with transaction(ctx.sessions) as session:
        node = session.get(Node, node_id)
        assert node is not None
        node.gpus.pop()  # the inventory lost it too; expected_gpus still says 4
        node.health, node.health_reasons = "failed", ["GPU 1: Xid 79 (GPU has fallen off the bus)"]
    html = logged_in(client).get("/").text
    assert stat(html, "gpus-faulty") == "2"
    assert stat(html, "gpus-idle") == "2"
    heat = logged_in(client, username="carol").get("/gpus?status=faulty").text
    assert re.findall(r'data-gpu="(\d)"', heat) == ["1", "3"]
    assert "Xid 79" in heat
    assert "missing from the inventory" in heat
    with transaction(ctx.sessions) as session:  # a reason is text a node sent: it is escaped
        node = session.get(Node, node_id)
        assert node is not None
        node.health_reasons = ['GPU 1: <img src=x onerror="alert(1)">']
    heat = logged_in(client, username="dave").get("/gpus?status=faulty").text
    assert "<img src=x" not in heat
    assert "&lt;img src=x onerror=&#34;alert(1)&#34;&gt;" in heat


def test_the_live_part_alone_answers_htmx(client: TestClient) -> None:
    browser = logged_in(client)
    fragment = browser.get("/", headers={"HX-Request": "true"})
    assert fragment.status_code == 200
    assert fragment.text.lstrip().startswith('<section id="live"')
    assert "<html" not in fragment.text
    assert fragment.headers["vary"] == "HX-Request"
    page = browser.get("/")
    assert page.text.lstrip().startswith("<!doctype html>")


def test_nodes_filter_by_hostlist_state_health_and_model_and_sort(client: TestClient) -> None:
    client.post("/api/v1/nodes", json={"names": ["gpu[001-004]", "cpu01"]})
    for name, model in (("gpu101", "NVIDIA A100-SXM4-80GB"), ("gpu102", "NVIDIA H200")):
        up_node(client, name, model=model, category="train")
    browser = logged_in(client)
    assert row_names(browser.get("/nodes").text) == [
        "cpu01",
        "gpu001",
        "gpu002",
        "gpu003",
        "gpu004",
        "gpu101",
        "gpu102",
    ]
    assert row_names(browser.get("/nodes?q=gpu[002-003,101]").text) == ["gpu002", "gpu003", "gpu101"]
    assert row_names(browser.get("/nodes?q=cpu").text) == ["cpu01"]
    assert row_names(browser.get("/nodes?state=up").text) == ["gpu101", "gpu102"]
    assert row_names(browser.get("/nodes?model=NVIDIA+H200").text) == ["gpu102"]
    assert row_names(browser.get("/nodes?category=train&sort=name&dir=desc").text) == ["gpu102", "gpu101"]
    assert row_names(browser.get("/nodes?health=unknown&q=gpu[001-002]").text) == ["gpu001", "gpu002"]
    shown = browser.get("/nodes?sort=state").text
    assert row_names(shown)[-2:] == ["gpu101", "gpu102"]  # new before up
    assert 'aria-sort="ascending"' in shown
    assert "2 matching, of 7 nodes" in browser.get("/nodes?state=up", headers={"HX-Request": "true"}).text


def test_bad_filters_get_a_clear_error_not_a_traceback(client: TestClient) -> None:
    browser = logged_in(client)
    for url, message in (
        ("/nodes?q=gpu[1-", "invalid hostlist expression"),
        ("/nodes?sort=password", "cannot sort by"),
        ("/gpus?color=rainbow", "colour by one of"),
        ("/alerts?status=maybe", "status is firing or resolved"),
    ):
        answer = browser.get(url)
        assert answer.status_code == 400, url
        assert message in answer.text
        assert "Traceback" not in answer.text


def test_drain_buttons_only_for_those_who_may_and_the_api_refuses_the_others(client: TestClient) -> None:
    up_node(client, "gpu001")
    viewer = logged_in(client, "viewer", "vera")
    operator = logged_in(client, "operator", "otto")
    assert "/api/v1/nodes/gpu001/drain" not in viewer.get("/nodes").text
    assert 'data-action="/api/v1/nodes/gpu001/drain"' in operator.get("/nodes").text
    refused = viewer.post("/api/v1/nodes/gpu001/drain", json={"reason": "x"}, headers=csrf_header(viewer))
    assert refused.status_code == 403
    no_csrf = operator.post("/api/v1/nodes/gpu001/drain", json={"reason": "bad fan"})
    assert no_csrf.status_code == 403
    drained = operator.post("/api/v1/nodes/gpu001/drain", json={"reason": "bad fan"}, headers=csrf_header(operator))
    assert drained.status_code == 200
    page = operator.get("/nodes").text
    assert 'data-action="/api/v1/nodes/gpu001/resume"' in page
    assert "bad fan (user:otto)" in page
    assert stat(operator.get("/").text, "nodes-drained") == "1"


def test_alerts_page_offers_ack_and_silence_to_operators_only(client: TestClient) -> None:
    ctx = client.app.state.ctx  # type: ignore[attr-defined]
    node_id = up_node(client, "gpu001")
    with transaction(ctx.sessions) as session:
        alert = alerts.fire(session, ctx.clock, "NodeFailed", node_id, "gpu001", "GPU 0: Xid 79", severity="critical")
        assert alert is not None
        alert_id = alert.id
    operator = logged_in(client, "operator", "otto")
    page = operator.get("/alerts?status=firing").text
    assert f'data-action="/api/v1/alerts/{alert_id}/ack"' in page
    assert 'data-action="/api/v1/silences"' in page
    assert "/ack" not in logged_in(client, "viewer", "vera").get("/alerts").text
    assert operator.post(f"/api/v1/alerts/{alert_id}/ack", headers=csrf_header(operator)).status_code == 200
    acked = operator.get("/alerts").text
    assert f'data-action="/api/v1/alerts/{alert_id}/ack"' not in acked
    assert "user:otto" in acked
    assert "No alerts." in operator.get("/alerts?status=resolved").text


def test_without_a_session_pages_redirect_and_htmx_is_told_to(client: TestClient) -> None:
    anonymous = TestClient(client.app)
    for path in ("/", "/nodes", "/gpus", "/alerts"):
        assert anonymous.get(path, follow_redirects=False).headers["location"] == "/login"
    fragment = anonymous.get("/nodes", headers={"HX-Request": "true"})
    assert fragment.status_code == 401
    assert fragment.headers["hx-redirect"] == "/login"


def test_pages_carry_the_session_csrf_token_and_the_logout_form(client: TestClient) -> None:
    page = logged_in(client).get("/nodes").text
    meta = re.search(r'<meta name="csrf-token" content="([^"]+)">', page)
    form = re.search(r'name="csrf" value="([^"]+)"', page)
    assert meta is not None
    assert form is not None
    assert meta.group(1) == form.group(1)


def test_fleet_metrics_refuse_an_unknown_series(client: TestClient) -> None:
    assert client.get("/api/v1/fleet/metrics?metric=gpu_util").json()["t"] == []
    answer = client.get("/api/v1/fleet/metrics?metric=password")
    assert answer.status_code == 400
    assert "no fleet series" in answer.json()["detail"]


def test_static_files_are_versioned_by_content_and_cached_for_long(client: TestClient) -> None:
    url = static_url("app.css")
    assert re.fullmatch(r"/static/app\.css\?v=[0-9a-f]{12}", url)
    answer = client.get(url)
    assert answer.status_code == 200
    assert "immutable" in answer.headers["cache-control"]
    assert "immutable" not in client.get("/static/app.css").headers.get("cache-control", "")
    assert client.get("/static/../dashboard/pages.py").status_code == 404


def test_the_front_end_packages_are_in_the_package(client: TestClient) -> None:
    if missing_vendor_files():
        need("dashboard front-end files", f"{missing_vendor_files()} missing (make assets copies them from npm)")
    for name in ("vendor/htmx.min.js", "vendor/uPlot.iife.min.js"):
        assert client.get(static_url(name)).status_code == 200


def test_the_node_table_pages_through_what_matched(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dashboard_nodes, "PAGE_SIZE", 2)
    client.post("/api/v1/nodes", json={"names": ["gpu[001-005]"]})
    browser = logged_in(client)
    first = browser.get("/nodes?sort=name&dir=desc").text
    assert row_names(first) == ["gpu005", "gpu004"]
    assert "1–2 of 5 nodes" in first
    assert 'rel="next"' in first
    assert 'rel="prev"' not in first
    following = re.search(r'<a rel="next" href="([^"]+)" hx-get="([^"]+)"', first)
    assert following is not None
    assert following.group(1) == following.group(2)  # the link and its live swap go to the same page
    assert row_names(browser.get(html.unescape(following.group(1))).text) == ["gpu003", "gpu002"]  # filters kept
    last = browser.get("/nodes?sort=name&dir=desc&page=3").text
    assert row_names(last) == ["gpu001"]
    assert 'rel="prev"' in last
    assert 'rel="next"' not in last
    assert row_names(browser.get("/nodes?q=gpu[002-003]").text) == ["gpu002", "gpu003"]
    assert browser.get("/nodes?page=4").status_code == 400


def test_a_node_that_is_down_has_no_current_health(client: TestClient) -> None:
    """A crashed node's last verdict (healthy) says nothing about it now: it is not counted as healthy."""
    ctx = client.app.state.ctx  # type: ignore[attr-defined]
    node_id = up_node(client, "gone1")
    up_node(client, "fine1")
    with transaction(ctx.sessions) as session:
        for node in session.query(Node):
            node.health = "healthy"
        inventory.transition(session, ctx.clock, node_id, NodeState.UP, NodeState.DOWN, "no heartbeat")
    browser = logged_in(client)
    html = browser.get("/").text
    assert (stat(html, "health-healthy"), stat(html, "health-unknown")) == ("1", "1")
    assert row_names(browser.get("/nodes?health=healthy").text) == ["fine1"]
    assert "last verdict before it went down: healthy" in browser.get("/nodes?health=unknown").text
