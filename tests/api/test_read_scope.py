"""A token with scope `read` acts on nothing: every route that changes something (any method but GET,
HEAD and OPTIONS) refuses it, whatever its role, unless the route is marked `reads_only` (a dry run, a
rendered template), and those are called here with a read token and must leave every table as it was.
Generated from the app's routes, so a new route is covered without naming it."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.routing import APIRoute, iter_route_contexts
from fastapi.testclient import TestClient
from sqlalchemy import MetaData, select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.api.deps import SAFE_METHODS, PermissionCheck
from gpufleet.power.ports import BmcTarget

# Routes that take no API token at all (no PermissionCheck), and why.
NO_TOKEN = {
    ("POST", "/api/v1/agent/join"): "a join token",
    ("POST", "/api/v1/login"): "a user name and password",
    ("POST", "/api/v1/login/sso"): "an ID token from the sign-on provider",
    ("POST", "/login"): "the dashboard's login form",
    ("POST", "/logout"): "the dashboard's session cookie",
}
# Tables a read may write: the audit log (every request is on record) and a token's last use.
WRITTEN_BY_READS = {"audit_records", "api_tokens", "alembic_version"}


def _check(route: APIRoute) -> PermissionCheck | None:
    found: list[PermissionCheck] = []

    def walk(dependant: Any) -> None:
        for dep in dependant.dependencies:
            if isinstance(dep.call, PermissionCheck):
                found.append(dep.call)
            walk(dep)

    walk(route.dependant)
    return found[0] if found else None


def mutating_routes(client: TestClient) -> list[tuple[str, str, PermissionCheck | None]]:
    """(method, path, its permission check) of every route of the app whose method may change something."""
    found = []
    for context in iter_route_contexts(client.app.routes):  # type: ignore[attr-defined]
        route = context.original_route
        if isinstance(route, APIRoute):
            for method in sorted(context.methods or ()):
                if method not in SAFE_METHODS:
                    found.append((method, context.path or "", _check(route)))
    return found


@pytest.fixture
def read_token(client: TestClient) -> str:
    """A read-only token of an admin, the role that may do the most."""
    user = {"username": "reader", "role": "admin", "password": "correct horse battery"}
    made = client.post("/api/v1/users", json=user)
    assert made.status_code == 201, made.text
    created = client.post("/api/v1/tokens/user", json={"user": "reader", "expires_in_s": 3600, "scope": "read"})
    assert created.status_code == 201, created.text
    token: str = created.json()["token"]
    return token


class CountingBmcs:
    """Every BMC connection the head makes; none may be made for a read-only token."""

    def __init__(self) -> None:
        self.targets: list[BmcTarget] = []

    def __call__(self, target: BmcTarget) -> Any:
        self.targets.append(target)
        raise AssertionError(f"a BMC was contacted: {target.address}")


def _with_bmc(client: TestClient) -> CountingBmcs:
    assert client.post("/api/v1/nodes", json={"names": ["gpu01"]}).status_code == 201
    bmc = {"protocol": "ipmi", "address": "10.140.0.1", "username": "admin", "password": "secret"}
    assert client.put("/api/v1/nodes/gpu01/bmc", json=bmc).status_code == 200
    counting = CountingBmcs()
    client.app.state.power_connect = counting  # type: ignore[attr-defined]
    return counting


def _power_plan(client: TestClient) -> tuple[str, dict[str, Any]]:
    _with_bmc(client)
    return "/api/v1/power/plans", {"action": "off", "nodes": "gpu01"}


# The routes marked reads_only, each with a request that succeeds. A route newly marked must get one.
READS_ONLY: dict[tuple[str, str], Callable[[TestClient], tuple[str, dict[str, Any]]]] = {
    ("POST", "/api/v1/power/plans"): _power_plan,
    ("POST", "/api/v1/images/plans"): lambda c: ("/api/v1/images/plans", {"name": "x", "debootstrap": "bookworm"}),
    ("POST", "/api/v1/templates/{name}/render"): lambda c: (
        "/api/v1/templates/single-gpu/render",
        {"values": {"script": "train.py"}},
    ),
}


def test_a_read_token_is_refused_by_every_route_that_acts(client: TestClient, read_token: str) -> None:
    routes = mutating_routes(client)
    unmarked = {(m, p) for m, p, check in routes if check is None}
    assert unmarked == set(NO_TOKEN)  # every other mutating route names a permission
    refused = 0
    for method, path, check in routes:
        if check is None or check.reads_only:
            continue
        url = re.sub(r"\{[^}]+\}", "x", path)
        answer = client.request(method, url, json={}, headers={"Authorization": f"Bearer {read_token}"})
        assert answer.status_code == 403, (method, path, answer.status_code, answer.text[:200])
        refused += 1
    assert refused > 50  # the enumeration reached the API


def _tables(sessions: sessionmaker[Session]) -> dict[str, list[str]]:
    with sessions() as session:
        tables = MetaData()
        tables.reflect(session.get_bind())
        return {
            name: sorted(repr(tuple(row)) for row in session.execute(select(table)))
            for name, table in tables.tables.items()
            if name not in WRITTEN_BY_READS
        }


def test_reads_only_routes_change_nothing_for_a_read_token(
    client: TestClient, read_token: str, sessions: sessionmaker[Session]
) -> None:
    marked = {(m, p) for m, p, check in mutating_routes(client) if check is not None and check.reads_only}
    assert marked == set(READS_ONLY)  # a route marked reads_only needs a request here
    for (method, _path), request in READS_ONLY.items():
        url, body = request(client)
        before = _tables(sessions)
        answer = client.request(method, url, json=body, headers={"Authorization": f"Bearer {read_token}"})
        assert answer.status_code == 200, (url, answer.text[:300])
        assert _tables(sessions) == before, url


def test_a_read_token_starts_no_power_task_and_reaches_no_bmc(client: TestClient, read_token: str) -> None:
    bmcs = _with_bmc(client)
    headers = {"Authorization": f"Bearer {read_token}"}
    for action in ("status", "on", "off", "cycle", "reset"):
        answer = client.post(f"/api/v1/power/{action}", json={"nodes": "gpu01"}, headers=headers)
        assert answer.status_code == 403, (action, answer.text)
        assert "read-only token" in answer.json()["detail"]
    assert client.get("/api/v1/tasks").json() == []
    assert bmcs.targets == []
    assert client.get("/api/v1/power", headers=headers).status_code == 200  # reading what is known stays open
