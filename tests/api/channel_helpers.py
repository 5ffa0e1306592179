"""What the agent channel's in-process tests share: nodes with credentials, an open channel, a job
running on a node, the audit records a node's refused messages left."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import select
from starlette.testclient import WebSocketTestSession

from gpufleet.core.db import transaction
from gpufleet.inventory import service as inventory
from gpufleet.inventory.models import Node
from gpufleet.inventory.states import NodeState
from gpufleet.jobs.tick import run_tick
from gpufleet.protocol.inventory import GpuInfo, NodeInventory
from gpufleet.workers.job_loops import tick_settings

CHANNEL = "/api/v1/agent/channel"


def gpus_of(name: str, count: int) -> list[GpuInfo]:
    return [
        GpuInfo(
            index=i,
            uuid=f"GPU-{name}-{i}",
            model="NVIDIA H200",
            pci_bus_id=f"00000000:{i + 1:02x}:00.0",
            memory_total_mib=143771,
        )
        for i in range(count)
    ]


def report_of(name: str, gpus: int = 0, hostname: str | None = None) -> NodeInventory:
    """Node `name`'s own inventory: its hostname, and `gpus` GPUs with UUIDs of its own."""
    return NodeInventory(
        hostname=hostname or f"{name}.cluster",
        cpus=8,
        memory_total_mib=1024,
        gpu_source="nvml" if gpus else "none",
        gpus=gpus_of(name, gpus),
    )


def credential(client: TestClient, name: str) -> str:
    """Join node `name` with a fresh join token; its node credential."""
    join = client.post("/api/v1/tokens/join", json={"expires_in_s": 600}).json()["token"]
    response = client.post("/api/v1/agent/join", json={"name": name}, headers={"Authorization": f"Bearer {join}"})
    assert response.status_code == 200, response.text
    token: str = response.json()["credential"]
    return token


def bring_up(client: TestClient, name: str, gpus: int) -> int:
    """Node `name` up and healthy with its own inventory (as its agent would have it); its id."""
    ctx = client.app.state.ctx  # type: ignore[attr-defined]
    with transaction(ctx.sessions) as session:
        node = session.scalars(select(Node).where(Node.name == name)).one()
        inventory.apply_inventory(session, ctx.clock, node, report_of(name, gpus))
        node.state = NodeState.UP
        node.health = "healthy"
        return node.id


def node_id(client: TestClient, name: str) -> int:
    ctx = client.app.state.ctx  # type: ignore[attr-defined]
    with transaction(ctx.sessions, readonly=True) as session:
        found: int = session.scalars(select(Node.id).where(Node.name == name)).one()
        return found


@contextmanager
def channel(client: TestClient, token: str) -> Iterator[WebSocketTestSession]:
    """An agent channel past its hello."""
    with client.websocket_connect(CHANNEL, headers={"Authorization": f"Bearer {token}"}) as ws:
        ws.send_text(json.dumps({"type": "hello", "heartbeat_interval_s": 1.0}))
        assert ws.receive_json()["type"] == "welcome"
        yield ws


def running_job(client: TestClient, gpus: int = 1) -> int:
    """A job placed by the scheduler (on the only node with GPUs free), its rank running; its id."""
    ctx = client.app.state.ctx  # type: ignore[attr-defined]
    if client.get("/api/v1/users/alice").status_code == 404:
        assert client.post("/api/v1/users", json={"username": "alice"}).status_code == 201
    made = client.post("/api/v1/jobs", json={"user": "alice", "argv": ["sleep", "600"], "gpus_per_node": gpus})
    assert made.status_code == 201, made.text
    job_id: int = made.json()["id"]
    assert job_id in run_tick(ctx.sessions, ctx.clock, tick_settings(ctx.settings)).placed
    return job_id


def rank_of(client: TestClient, job_id: int) -> dict[str, Any]:
    ranks: list[dict[str, Any]] = client.get(f"/api/v1/jobs/{job_id}").json()["ranks"]
    assert len(ranks) == 1
    return ranks[0]


def refusals(client: TestClient, node: str) -> list[dict[str, Any]]:
    """The audit records of the channel messages `node` sent that the head refused."""
    found: list[dict[str, Any]] = client.get("/api/v1/audit", params={"actor": f"node:{node}"}).json()
    return [r for r in found if r["result"] == 403]


def wait_until(predicate: Callable[[], object], what: str, seconds: float = 5.0) -> None:
    """The channel is served on another thread: poll (briefly) for what it does asynchronously."""
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.01)
