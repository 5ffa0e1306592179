"""Security headers on every answer (api.security_headers), a Content-Security-Policy the dashboard's
own markup satisfies (no inline script, style or handler), and whoami telling the caller's real role.
The browser tests (tests/browser) check that Chromium logs no violation of the policy."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from gpufleet.api.dashboard.pages import NAV
from gpufleet.api.security_headers import CONTENT_SECURITY_POLICY, SecurityHeaders
from gpufleet.api.templates import STATIC_DIR
from tests.api.dashboard_helpers import logged_in, up_node, write_gpu_sample

# One database: headers, whatever the database.
pytestmark = pytest.mark.one_database

EXPECTED = {
    "content-security-policy": CONTENT_SECURITY_POLICY,
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
}
# What a policy without 'unsafe-inline' refuses to run or apply, as it would appear in served HTML.
INLINE = {
    "inline script": re.compile(r"<script(?![^>]*\bsrc=)[^>]*>", re.IGNORECASE),
    "style element": re.compile(r"<style\b", re.IGNORECASE),
    "style attribute": re.compile(r"<[^>]+\sstyle=", re.IGNORECASE),
    "event handler": re.compile(r"<[^>]+\son[a-z]+\s*=", re.IGNORECASE),
    "javascript: URL": re.compile(r"javascript:", re.IGNORECASE),
}


def _has_headers(answer: object) -> None:
    headers = answer.headers  # type: ignore[attr-defined]
    assert {name: headers.get(name) for name in EXPECTED} == EXPECTED, answer
    assert "frame-ancestors 'none'" in headers["content-security-policy"]
    assert "unsafe-inline" not in headers["content-security-policy"]


def test_every_kind_of_answer_has_the_headers(client: TestClient) -> None:
    anonymous = TestClient(client.app)
    answers = {
        "login page": anonymous.get("/login"),
        "page redirect": anonymous.get("/", follow_redirects=False),
        "page": logged_in(client).get("/nodes"),
        "fragment": logged_in(client, username="carol").get("/nodes", headers={"HX-Request": "true"}),
        "API 200": client.get("/api/v1/nodes"),
        "API 401": anonymous.get("/api/v1/nodes"),
        "API 404": client.get("/api/v1/nodes/none"),
        "API 422": client.post("/api/v1/nodes", json={}),
        "API 400 (NaN, a middleware's)": client.post(
            "/api/v1/silences", content=b'{"a": NaN}', headers={"content-type": "application/json"}
        ),
        "API 413 (a middleware's)": client.post("/api/v1/nodes", content=b"x" * 70_000),
        "static file": anonymous.get("/static/app.js"),
        "health": anonymous.get("/healthz"),
        "metrics": client.get("/metrics"),
        "no such path": anonymous.get("/nowhere"),
    }
    for what, answer in answers.items():
        assert answer.status_code < 500, what
        _has_headers(answer)


def test_a_route_cannot_loosen_them() -> None:
    """An inference service behind /services/ answers with its own headers: the head's replace them."""

    def loose(_request: object) -> PlainTextResponse:
        return PlainTextResponse("x", headers={"Content-Security-Policy": "script-src *", "X-Frame-Options": "ALLOW"})

    app = SecurityHeaders(Starlette(routes=[Route("/", loose)]))
    answer = TestClient(app).get("/")
    _has_headers(answer)
    assert answer.headers.get_list("content-security-policy") == [CONTENT_SECURITY_POLICY]


def test_no_template_or_script_needs_unsafe_inline() -> None:
    templates = sorted((STATIC_DIR.parent / "templates").rglob("*.html"))
    assert len(templates) > 20
    for path in templates:
        text = path.read_text()
        for what, pattern in INLINE.items():
            assert not pattern.search(text), f"{path.name}: {what}"
    for script in STATIC_DIR.glob("*.js"):  # our own code: no string evaluated, no style attribute written
        code = script.read_text()
        for forbidden in ("eval(", "new Function", 'setAttribute("style"', "innerHTML"):
            assert forbidden not in code, f"{script.name}: {forbidden}"


def test_every_page_as_served_needs_no_unsafe_inline(client: TestClient) -> None:
    busy = up_node(client, "busy1", gpus=4)
    write_gpu_sample(client, busy, [90.0, 60.0, 0.0, 1.0])  # the GPU map shades cells
    browser = logged_in(client, role="admin")
    for item in NAV:
        for headers in ({}, {"HX-Request": "true"}):
            page = browser.get(item.path, headers=headers)
            assert page.status_code == 200, item.path
            for what, pattern in INLINE.items():
                assert not pattern.search(page.text), f"{item.path} {headers}: {what}"
    gpus = browser.get("/gpus").text
    assert re.findall(r'class="cell in_use (v\d+)"', gpus) == ["v90", "v60"]


@pytest.mark.parametrize("role", ["viewer", "operator"])
def test_whoami_says_the_callers_real_role(client: TestClient, role: str) -> None:
    browser = logged_in(client, role=role)
    session = browser.get("/api/v1/whoami").json()
    assert (session["kind"], session["role"], session["user"], session["scope"]) == ("session", role, "bob", "write")
    made = client.post("/api/v1/tokens/user", json={"user": "bob", "scope": "read"}).json()["token"]
    token = client.get("/api/v1/whoami", headers={"Authorization": f"Bearer {made}"}).json()
    assert (token["kind"], token["role"], token["user"], token["scope"]) == ("admin", role, "bob", "read")
    assert client.get("/api/v1/whoami").json()["role"] == "admin"  # the bootstrap admin token
