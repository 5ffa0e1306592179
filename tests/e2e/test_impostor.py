"""An impostor agent against a real head process, over loopback: node `evil`, with its own valid
credential, answers node `victim`'s fault command, reports on and claims to hold `victim`'s job rank,
claims `victim`'s GPU and hostname in its inventory, and sends a binary frame. Each is refused (4403,
409, 1003) and audited, and `victim`'s command, job and inventory stay its own.

Every message type one by one, with the head's records compared before and after, is
tests/api/test_channel_impostor.py (in-process, the same code); this is the same attack end to end.
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from gpufleet.agent.daemon import channel_url
from gpufleet.protocol.inventory import GpuInfo, NodeInventory
from gpufleet.protocol.messages import CLOSE_FORBIDDEN, CLOSE_UNSUPPORTED_DATA
from tests.e2e.conftest import ADMIN, Head, wait_for

pytestmark = pytest.mark.e2e

VICTIMS_GPU = GpuInfo(
    index=0, uuid="GPU-0b7c7a10-victim", model="NVIDIA H200", pci_bus_id="00000000:01:00.0", memory_total_mib=143771
)


def _inventory(hostname: str, gpus: list[GpuInfo]) -> NodeInventory:
    return NodeInventory(hostname=hostname, cpus=8, memory_total_mib=1024, gpu_source="nvml", gpus=gpus)


def _join(head: Head, name: str, inventory: NodeInventory) -> str:
    answer = httpx.post(
        head.url + "/api/v1/agent/join",
        json={"name": name, "inventory": inventory.model_dump()},
        headers={"Authorization": f"Bearer {head.join_token(1)}"},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    token: str = answer.json()["credential"]
    return token


async def _open(head: Head, token: str) -> ClientConnection:
    ws = await connect(channel_url(head.agent_url), additional_headers={"Authorization": f"Bearer {token}"})
    await ws.send(json.dumps({"type": "hello", "heartbeat_interval_s": 1.0}))
    assert json.loads(await ws.recv())["type"] == "welcome"
    return ws


async def _next_of(ws: ClientConnection, kind: str) -> dict[str, Any]:
    while True:
        message: dict[str, Any] = json.loads(await asyncio.wait_for(ws.recv(), 30))
        if message["type"] == kind:
            return message


async def _closed_with(ws: ClientConnection) -> int | None:
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            await asyncio.wait_for(ws.recv(), 30)
    return closed.value.rcvd.code if closed.value.rcvd is not None else None


def test_an_impostor_agent_is_refused_end_to_end(head: Head) -> None:
    victim = _join(head, "victim", _inventory("victim.cluster", [VICTIMS_GPU]))
    evil = _join(head, "evil", _inventory("evil.cluster", []))
    admin = {"Authorization": f"Bearer {ADMIN}"}

    async def scenario() -> None:
        victim_ws = await _open(head, victim)
        await asyncio.to_thread(wait_for, lambda: head.api("GET", "/api/v1/nodes/victim")["state"] == "up", 20)

        # The victim's fault command, answered first by evil with the id it names.
        fault: dict[str, httpx.Response] = {}

        def inject() -> None:
            fault["http"] = httpx.post(
                head.url + "/api/v1/nodes/victim/faults",
                json={"action": "inject", "kind": "xid79"},
                headers=admin,
                timeout=30,
            )

        sender = threading.Thread(target=inject, daemon=True)
        sender.start()
        command = await _next_of(victim_ws, "fault")
        evil_ws = await _open(head, evil)
        await evil_ws.send(json.dumps({"type": "fault_result", "id": command["id"], "ok": False, "message": "evil"}))
        assert await _closed_with(evil_ws) == CLOSE_FORBIDDEN
        await victim_ws.send(json.dumps({"type": "fault_result", "id": command["id"], "ok": True, "message": "own"}))
        await asyncio.to_thread(sender.join, 30)
        assert fault["http"].json() == {"node": "victim", "ok": True, "message": "own"}

        # The victim's job rank: evil reports it failed, then claims to hold it.
        await asyncio.to_thread(head.api, "POST", "/api/v1/users", json={"username": "alice"})
        submit = {"user": "alice", "argv": ["sleep", "600"], "gpus_per_node": 1}
        job = await asyncio.to_thread(head.api, "POST", "/api/v1/jobs", json=submit)
        start = await _next_of(victim_ws, "job_start")
        rank = {"job_id": job["id"], "run": start["run"], "rank": start["rank"]}
        for forged in (
            {"type": "job_update", "state": "exited", "outcome": "failed", "exit_code": 1} | rank,
            {"type": "job_held", "ranks": [rank]},
        ):
            evil_ws = await _open(head, evil)
            await evil_ws.send(json.dumps(forged))
            assert await _closed_with(evil_ws) == CLOSE_FORBIDDEN
        assert head.api("GET", f"/api/v1/jobs/{job['id']}")["state"] == "running"

        # A binary frame.
        evil_ws = await _open(head, evil)
        await evil_ws.send(b'{"type": "heartbeat", "seq": 1}')
        assert await _closed_with(evil_ws) == CLOSE_UNSUPPORTED_DATA
        await victim_ws.close()

    asyncio.run(scenario())

    # Evil's inventory naming the victim's GPU or hostname.
    for claim in (_inventory("evil.cluster", [VICTIMS_GPU]), _inventory("victim.cluster", [])):
        answer = httpx.put(
            head.url + "/api/v1/agent/inventory",
            content=claim.model_dump_json(),
            headers={"Authorization": f"Bearer {evil}", "Content-Type": "application/json"},
            timeout=30,
        )
        assert answer.status_code == 409, answer.text
        assert "victim" in answer.json()["detail"]

    victim_node = head.api("GET", "/api/v1/nodes/victim")
    assert (victim_node["hostname"], victim_node["gpu_count"]) == ("victim.cluster", 1)
    assert head.api("GET", "/api/v1/nodes/evil")["gpu_count"] == 0
    records = head.api("GET", "/api/v1/audit", params={"actor": "node:evil"})
    refused = sorted(r["action"] for r in records if r["result"] in (403, 409))
    assert refused[:3] == ["agent.channel.fault_result", "agent.channel.job_held", "agent.channel.job_update"]
    assert len(refused) == 5  # and the two inventories
    assert "Traceback" not in head.log()
