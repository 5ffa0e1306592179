"""The dashboard's pages and fragments over HTTP (the browser tests are in tests/browser)."""

import re

from fastapi.testclient import TestClient

from gpufleet.api.templates import missing_vendor_files, static_url
from tests.conftest import need

PASSWORD = "correct horse battery"


def _logged_in(client: TestClient, role: str = "viewer") -> TestClient:
    assert client.post("/api/v1/users", json={"username": "bob", "role": role, "password": PASSWORD}).status_code == 201
    browser = TestClient(client.app)
    found = re.search(r'name="csrf" value="([^"]+)"', browser.get("/login").text)
    assert found is not None
    answer = browser.post("/login", data={"username": "bob", "password": PASSWORD, "csrf": found.group(1)})
    assert answer.status_code == 200
    return browser


def test_overview_counts_nodes_and_lists_them(client: TestClient) -> None:
    client.post("/api/v1/nodes", json={"names": ["gpu[001-003]"]})
    page = _logged_in(client).get("/")
    assert page.status_code == 200
    assert page.headers["cache-control"] == "no-store"
    assert re.search(r'id="nodes-total"><span class="value">3<', page.text)
    assert re.search(r'id="nodes-new"><span class="value new">3<', page.text)
    assert all(f'data-node="gpu00{i}"' in page.text for i in (1, 2, 3))
    assert 'hx-trigger="every 5s"' in page.text
    assert 'aria-current="page">Overview' in page.text


def test_a_fragment_is_the_live_part_alone(client: TestClient) -> None:
    browser = _logged_in(client)
    fragment = browser.get("/fragments/overview", headers={"HX-Request": "true"})
    assert fragment.status_code == 200
    assert fragment.text.lstrip().startswith('<section id="live"')
    assert "<html" not in fragment.text
    assert browser.get("/fragments/nope").status_code == 404


def test_pages_show_the_session_csrf_token_in_a_meta_and_the_logout_form(client: TestClient) -> None:
    page = _logged_in(client).get("/nodes").text
    meta = re.search(r'<meta name="csrf-token" content="([^"]+)">', page)
    form = re.search(r'name="csrf" value="([^"]+)"', page)
    assert meta is not None
    assert form is not None
    assert meta.group(1) == form.group(1)


def test_without_a_session_pages_redirect_and_fragments_tell_htmx_to(client: TestClient) -> None:
    anonymous = TestClient(client.app)
    for path in ("/", "/nodes", "/alerts"):
        assert anonymous.get(path, follow_redirects=False).headers["location"] == "/login"
    fragment = anonymous.get("/fragments/overview")
    assert fragment.status_code == 401
    assert fragment.headers["hx-redirect"] == "/login"


def test_the_alerts_page_lists_alerts(client: TestClient) -> None:
    page = _logged_in(client).get("/alerts")
    assert page.status_code == 200
    assert "No alerts." in page.text


def test_static_files_are_versioned_by_content_and_cached_for_long(client: TestClient) -> None:
    url = static_url("app.css")
    assert re.fullmatch(r"/static/app\.css\?v=[0-9a-f]{12}", url)
    answer = client.get(url)
    assert answer.status_code == 200
    assert "immutable" in answer.headers["cache-control"]
    assert "immutable" not in client.get("/static/app.css").headers.get("cache-control", "")
    assert client.get("/static/../routers/dashboard.py").status_code == 404


def test_the_front_end_packages_are_in_the_package(client: TestClient) -> None:
    if missing_vendor_files():
        need("dashboard front-end files", f"{missing_vendor_files()} missing (make assets copies them from npm)")
    for name in ("vendor/htmx.min.js", "vendor/uPlot.iife.min.js"):
        assert client.get(static_url(name)).status_code == 200
