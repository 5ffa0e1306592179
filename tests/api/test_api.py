"""The REST API through a real ASGI stack, on both databases."""

from pathlib import Path

import anyio.to_thread
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.api.app import create_app
from gpufleet.auth import service as auth
from gpufleet.auth.policy import Role
from gpufleet.core.clock import FakeClock
from gpufleet.core.config import load_settings
from gpufleet.core.db import transaction
from gpufleet.protocol.inventory import GpuInfo, NodeInventory

# One database: HTTP translation (the services' own tests run both).
pytestmark = pytest.mark.one_database


def _join(client: TestClient, name: str, uses: int = 1) -> str:
    join = client.post("/api/v1/tokens/join", json={"expires_in_s": 600, "uses": uses}).json()["token"]
    response = client.post("/api/v1/agent/join", json={"name": name}, headers={"Authorization": f"Bearer {join}"})
    assert response.status_code == 200, response.text
    credential: str = response.json()["credential"]
    return credential


def test_every_api_route_needs_a_token_except_healthz(client: TestClient) -> None:
    anonymous = {"Authorization": ""}
    assert client.get("/healthz", headers=anonymous).status_code == 200
    for path in ("/api/v1/nodes", "/api/v1/tokens", "/api/openapi.json", "/api/v1/whoami"):
        response = client.get(path, headers=anonymous)
        assert response.status_code == 401, path
        assert response.headers["www-authenticate"] == "Bearer"
    assert client.get("/api/v1/nodes", headers={"Authorization": "Bearer gfa_wrong"}).status_code == 401
    spec = client.get("/api/openapi.json").json()
    assert "/api/v1/nodes" in spec["paths"]


def test_node_lifecycle(client: TestClient) -> None:
    created = client.post("/api/v1/nodes", json={"names": ["gpu[001-003]"], "category": "h200"})
    assert created.status_code == 201
    listed = client.get("/api/v1/nodes").json()
    assert [(n["name"], n["state"], n["gpu_count"]) for n in listed] == [
        ("gpu001", "new", 0),
        ("gpu002", "new", 0),
        ("gpu003", "new", 0),
    ]
    dup = client.post("/api/v1/nodes", json={"names": ["gpu003"]})
    assert dup.status_code == 409
    assert "gpu003" in dup.json()["detail"]
    bad = client.post("/api/v1/nodes", json={"names": ["gpu[1-"]})
    assert bad.status_code == 400
    cloned = client.post("/api/v1/nodes/gpu001/clone", json={"names": ["gpu004"]})
    assert cloned.status_code == 201
    assert cloned.json()[0]["category"] == "h200"
    assert client.get("/api/v1/nodes/nope").status_code == 404
    assert client.delete("/api/v1/nodes", params={"names": "gpu[001-002],nope"}).status_code == 404
    assert client.delete("/api/v1/nodes", params={"names": "gpu[001-002]"}).json() == ["gpu001", "gpu002"]
    assert [n["name"] for n in client.get("/api/v1/nodes").json()] == ["gpu003", "gpu004"]
    assert [n["name"] for n in client.get("/api/v1/nodes", params={"names": "gpu004"}).json()] == ["gpu004"]


def test_join_token_single_use_and_unknown(client: TestClient) -> None:
    join = client.post("/api/v1/tokens/join", json={"expires_in_s": 600}).json()["token"]
    headers = {"Authorization": f"Bearer {join}"}
    assert client.post("/api/v1/agent/join", json={"name": "n1"}, headers=headers).status_code == 200
    reused = client.post("/api/v1/agent/join", json={"name": "n2"}, headers=headers)
    assert reused.status_code == 401
    assert "already used" in reused.json()["detail"]
    unknown = client.post("/api/v1/agent/join", json={"name": "n3"}, headers={"Authorization": "Bearer gfj_x"})
    assert unknown.status_code == 401
    assert [n["name"] for n in client.get("/api/v1/nodes").json()] == ["n1"]


def test_join_cannot_take_over_a_live_node(client: TestClient) -> None:
    _join(client, "n1")
    loops = client.app.state.ctx.loops  # type: ignore[attr-defined]
    loops.book.record(1, loops.clock.now(), 1.0, 1)
    loops.flush_once()
    assert client.get("/api/v1/nodes/n1").json()["state"] == "up"
    join = client.post("/api/v1/tokens/join", json={"expires_in_s": 600}).json()["token"]
    taken = client.post("/api/v1/agent/join", json={"name": "n1"}, headers={"Authorization": f"Bearer {join}"})
    assert taken.status_code == 409
    assert "is up with another agent" in taken.json()["detail"]
    # the failed join spent nothing: the token still works for another node
    other = client.post("/api/v1/agent/join", json={"name": "n2"}, headers={"Authorization": f"Bearer {join}"})
    assert other.status_code == 200


def test_join_token_expiry_is_enforced(client: TestClient) -> None:
    join = client.post("/api/v1/tokens/join", json={"expires_in_s": 60}).json()["token"]
    client.app.state.ctx.clock.advance(61)  # type: ignore[attr-defined]
    expired = client.post("/api/v1/agent/join", json={"name": "n1"}, headers={"Authorization": f"Bearer {join}"})
    assert expired.status_code == 401
    assert "expired" in expired.json()["detail"]


def test_node_credential_acts_only_as_its_node(client: TestClient) -> None:
    credential = _join(client, "n1")
    headers = {"Authorization": f"Bearer {credential}"}
    assert client.get("/api/v1/nodes", headers=headers).status_code == 403
    assert client.post("/api/v1/tokens/join", json={}, headers=headers).status_code == 403
    inventory = NodeInventory(
        hostname="other-name-in-body",
        cpus=8,
        memory_total_mib=1000,
        gpus=[GpuInfo(index=0, uuid="GPU-1", model="NVIDIA H200", pci_bus_id="00000000:18:00.0", memory_total_mib=1)],
    )
    put = client.put("/api/v1/agent/inventory", content=inventory.model_dump_json(), headers=headers)
    assert put.status_code == 204
    node = client.get("/api/v1/nodes/n1").json()
    assert node["gpu_count"] == 1
    assert node["hostname"] == "other-name-in-body"


@pytest.mark.parametrize(
    ("body", "status", "reason"),
    [
        (b"{not json", 400, "malformed inventory"),
        (b'{"hostname": "h", "cpus": -1, "memory_total_mib": 1}', 400, "cpus"),
        (b'{"hostname": "h", "cpus": 1, "memory_total_mib": 1, "extra": 1}', 400, "extra"),
        (b'{"hostname": "' + b"h" * 70_000 + b'"}', 413, "larger than"),
    ],
)
def test_bad_inventory_is_rejected_and_stores_nothing(
    client: TestClient, body: bytes, status: int, reason: str
) -> None:
    credential = _join(client, "n1")
    response = client.put("/api/v1/agent/inventory", content=body, headers={"Authorization": f"Bearer {credential}"})
    assert response.status_code == status
    assert reason in response.json()["detail"]
    node = client.get("/api/v1/nodes/n1").json()
    assert node["hostname"] is None
    assert node["gpus"] == []


def test_duplicate_gpu_indexes_are_a_400(client: TestClient) -> None:
    credential = _join(client, "n1")
    gpu = {"index": 0, "uuid": "GPU-1", "model": "NVIDIA H200", "pci_bus_id": "0:1:0.0", "memory_total_mib": 1}
    body = {"hostname": "h", "cpus": 1, "memory_total_mib": 1, "gpus": [gpu, gpu | {"uuid": "GPU-2"}]}
    response = client.put("/api/v1/agent/inventory", json=body, headers={"Authorization": f"Bearer {credential}"})
    assert response.status_code == 400
    assert "unique" in response.json()["detail"]


def test_operators_revoke_join_tokens_but_not_api_tokens(
    client: TestClient, sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    with transaction(sessions) as s:
        operator = auth.create_api_token(s, clock, "ops", Role.OPERATOR, None)
    as_operator = {"Authorization": f"Bearer {operator}"}
    join = client.post("/api/v1/tokens/join", json={"expires_in_s": 60}, headers=as_operator).json()
    assert client.delete(f"/api/v1/tokens/{join['id']}", headers=as_operator).status_code == 204
    admin_token_id = 1
    refused = client.delete(f"/api/v1/tokens/{admin_token_id}", headers=as_operator)
    assert refused.status_code == 403
    assert "operators revoke join tokens" in refused.json()["detail"]
    assert client.get("/api/v1/nodes").status_code == 200  # the admin token still works


def test_blocking_handlers_get_the_configured_number_of_threads(
    sessions: sessionmaker[Session], clock: FakeClock, tmp_path: Path
) -> None:
    """Not anyio's 40: that many busy threads starve the event loop that reads heartbeats."""
    settings = load_settings(client_file=tmp_path / "none.toml", data_dir=tmp_path, request_threads=3)
    with TestClient(create_app(settings, sessions, clock, run_loops=False)) as client:
        assert client.portal is not None
        assert client.portal.call(lambda: anyio.to_thread.current_default_thread_limiter().total_tokens) == 3
