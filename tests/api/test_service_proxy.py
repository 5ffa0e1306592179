"""The service proxy against real HTTP replicas on loopback: what it forwards (never the caller's
credentials), a replica that refuses connections skipped for the next, and the errors when none can
answer. The whole path through the head, with a real model, is tests/e2e/test_inference_service.py."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request, Response
from fastapi.testclient import TestClient

from gpufleet.api import errors
from gpufleet.api.service_proxy import Route, ServiceProxy
from gpufleet.core.errors import NotFound
from tests.api.dashboard_helpers import logged_in
from tests.api.loopback_replica import echo_replica


@pytest.fixture
def replica() -> Iterator[str]:
    with echo_replica() as address:
        yield address


def _closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"  # nothing listens once the socket closes


def _app(routes: dict[str, Route]) -> tuple[FastAPI, ServiceProxy]:
    def lookup(name: str, _user: str | None, _admin: bool) -> Route:
        if name not in routes:
            raise NotFound(f"no service {name}")
        return routes[name]

    proxy = ServiceProxy(lookup, timeout_s=5)
    app = FastAPI()
    errors.install(app)

    @app.api_route("/services/{name}/{path:path}", methods=["GET", "POST"])
    async def call(name: str, path: str, request: Request) -> Response:
        return await proxy.forward(request, name, path, "carol", admin=False)

    return app, proxy


async def _call(app: FastAPI, method: str, url: str, **kwargs: Any) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://head") as client:
        return await client.request(method, url, **kwargs)


def _route(*addresses: str, may_call: bool = True) -> Route:
    return Route(may_call, tuple(addresses), len(addresses), time.monotonic())


def test_a_call_reaches_the_replica_without_the_callers_credentials(replica: str) -> None:
    asyncio.run(_a_call_reaches_the_replica_without_the_callers_credentials(replica))


async def _a_call_reaches_the_replica_without_the_callers_credentials(replica: str) -> None:
    app, proxy = _app({"embed": _route(replica)})
    answer = await _call(
        app,
        "POST",
        "/services/embed/v1/embed?x=1",
        json={"texts": ["hi"]},
        headers={"Authorization": "Bearer gft_secret", "Cookie": "gpufleet_session=s", "X-Trace": "t1"},
    )
    assert answer.status_code == 201
    seen = answer.json()
    assert (seen["method"], seen["path"], json.loads(seen["body"])) == ("POST", "/v1/embed?x=1", {"texts": ["hi"]})
    sent = {k.lower() for k in seen["headers"]}
    assert "authorization" not in sent
    assert "cookie" not in sent
    assert {k.lower(): v for k, v in seen["headers"].items()}["x-trace"] == "t1"
    assert answer.headers["x-replica"] == replica.rsplit(":", 1)[1]
    # Served from the head's origin: sandboxed, so a replica's page runs no script there.
    assert answer.headers["content-security-policy"] == "sandbox"
    assert proxy.stats("embed")["requests_per_s"] > 0
    await proxy.close()


def test_a_replica_that_refuses_connections_is_skipped(replica: str) -> None:
    asyncio.run(_a_replica_that_refuses_connections_is_skipped(replica))


async def _a_replica_that_refuses_connections_is_skipped(replica: str) -> None:
    app, proxy = _app({"embed": _route(_closed_port(), replica)})
    for _ in range(4):  # round robin starts at each replica in turn: every call still lands
        answer = await _call(app, "GET", "/services/embed/health")
        assert answer.status_code == 201
    await proxy.close()


def test_no_replica_unknown_service_and_outsiders_get_clear_errors(replica: str) -> None:
    asyncio.run(_no_replica_unknown_service_and_outsiders_get_clear_errors(replica))


async def _no_replica_unknown_service_and_outsiders_get_clear_errors(replica: str) -> None:
    routes = {"down": _route(), "dead": _route(_closed_port()), "private": _route(replica, may_call=False)}
    app, proxy = _app(routes)
    down = await _call(app, "GET", "/services/down/health")
    assert down.status_code == 503
    assert "no healthy replica" in down.json()["detail"]
    assert (await _call(app, "GET", "/services/dead/health")).status_code == 503
    assert (await _call(app, "GET", "/services/nosuch/health")).status_code == 404
    private = await _call(app, "GET", "/services/private/health")
    assert private.status_code == 403
    assert proxy.stats("down")["requests_per_s"] == 0.0
    await proxy.close()


def test_a_browser_session_cannot_call_a_service(client: TestClient) -> None:
    """Only tokens: a page a replica serves comes from the head's origin and must not act as the
    logged-in user, so the dashboard's cookie alone is refused before any replica is looked up."""
    browser = logged_in(client, role="admin", username="root2")
    answer = browser.get("/services/embed/health")
    assert answer.status_code == 401
    assert "token" in answer.json()["detail"]
