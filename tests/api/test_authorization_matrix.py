"""Every API route against every role, a node credential and no token, generated from the route table.

A new route cannot be added without a decision: it must name a permission (or be listed below as
authenticated some other way), and then this matrix checks the policy table is what the server does.
"""

import re
from typing import Any

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.api.deps import PermissionCheck
from gpufleet.api.served_routes import API_PREFIX, API_ROUTERS, ROOT_ROUTERS
from gpufleet.auth import service as auth
from gpufleet.auth.policy import Permission, Role, allowed
from gpufleet.core.clock import FakeClock
from gpufleet.core.db import transaction

# Routes authenticated by something other than the policy table, and why.
OTHERWISE_AUTHENTICATED = {
    ("POST", "/api/v1/agent/join"): "takes a join token, spent by the route itself",
    ("POST", "/api/v1/login"): "takes a user name and password, checked by auth.identity",
    ("POST", "/api/v1/login/sso"): "takes an ID token from the sign-on provider, checked by directory.oidc",
    ("GET", "/api/v1/sso"): "public: where the CLI signs on (issuer, client id, scopes), no secret",
}


def _permission(route: APIRoute) -> Permission | None:
    found: list[Permission] = []

    def walk(dependant: Any) -> None:
        for dep in dependant.dependencies:
            if isinstance(dep.call, PermissionCheck):
                found.append(dep.call.permission)
            walk(dep)

    walk(route.dependant)
    assert len(found) <= 1, f"{route.path} names several permissions: {found}"
    return found[0] if found else None


def _api_routes(client: TestClient) -> list[tuple[str, str, Permission | None]]:
    """Every HTTP route under /api (the routers the app serves, and the app's own: the schema), and
    those of the routers served elsewhere (GET /metrics)."""
    found = [(API_PREFIX + r.path, r) for router in API_ROUTERS for r in router.routes]
    found += [(r.path, r) for router in ROOT_ROUTERS for r in router.routes]
    found += [(r.path, r) for r in client.app.router.routes if getattr(r, "path", "").startswith("/api")]  # type: ignore[attr-defined]
    return [
        (method, path, _permission(route))
        for path, route in found
        if isinstance(route, APIRoute)
        for method in sorted(route.methods)
    ]


@pytest.fixture
def callers(client: TestClient, sessions: sessionmaker[Session], clock: FakeClock) -> dict[str, str | None]:
    tokens: dict[str, str | None] = {"anonymous": None}
    with transaction(sessions) as s:
        for role in (Role.ADMIN, Role.OPERATOR, Role.MEMBER, Role.VIEWER):
            tokens[role.value] = auth.create_api_token(s, clock, f"{role} token", role, None)
    join = client.post("/api/v1/tokens/join", json={"expires_in_s": 60}).json()["token"]
    node = client.post("/api/v1/agent/join", json={"name": "matrix"}, headers={"Authorization": f"Bearer {join}"})
    tokens[Role.NODE.value] = node.json()["credential"]
    return tokens


def test_every_api_route_has_a_decision(client: TestClient) -> None:
    undecided = [
        (method, path)
        for method, path, permission in _api_routes(client)
        if permission is None and (method, path) not in OTHERWISE_AUTHENTICATED
    ]
    assert undecided == []


def test_route_role_matrix(client: TestClient, callers: dict[str, str | None]) -> None:
    checked = 0
    for method, path, permission in _api_routes(client):
        if permission is None:
            continue
        url = re.sub(r"\{[^}]+\}", "matrix", path)
        for who, token in callers.items():
            headers = {"Authorization": f"Bearer {token}" if token else ""}
            kwargs: dict[str, Any] = {"json": {}} if method in {"POST", "PUT", "PATCH"} else {}
            status = client.request(method, url, headers=headers, **kwargs).status_code
            if token is None:
                expected_ok = False
                assert status == 401, (method, path, who, status)
            else:
                expected_ok = allowed(Role(who), permission)
                if expected_ok:
                    assert status not in (401, 403), (method, path, who, status)
                else:
                    assert status == 403, (method, path, who, status)
            checked += 1
    assert checked >= 8 * len(callers)  # the matrix really covered the routes


def test_the_matrix_covers_routes_outside_the_api(client: TestClient) -> None:
    assert ("GET", "/metrics", Permission.METRICS_READ) in _api_routes(client)
