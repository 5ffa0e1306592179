"""An impostor agent against a real head process, over loopback: node `evil`, with its own valid
credential, answers node `victim`'s fault command, reports on and claims to hold `victim`'s job rank,
claims `victim`'s GPU and hostname in its inventory, sends output for that rank, and sends a binary
frame. Each is refused (4403, 409, 403 for the output, dropped at its flush, 1003) and audited, and
`victim`'s command, job, output and inventory stay its own. Every other message type (hello, heartbeat,
metrics, events, logs, mig_result, node_cache) speaks only for the node whose channel carries it: sent
by evil, it lands in evil's records and none of victim's. `test_every_channel_message_type_is_sent`
fails on a new message type the attack does not send.

Every message type one by one, with every table compared before and after, is
tests/api/test_channel_impostor.py (in-process, the same code); this is the same attack end to end.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from typing import Any, get_args

import httpx
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from gpufleet.agent.daemon import channel_url
from gpufleet.protocol.inventory import GpuInfo, NodeInventory
from gpufleet.protocol.messages import CLOSE_FORBIDDEN, CLOSE_UNSUPPORTED_DATA, AnyAgentMessage
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


async def _beat(ws: ClientConnection) -> None:
    for seq in itertools.count(1):
        await ws.send(json.dumps({"type": "heartbeat", "seq": seq}))
        await asyncio.sleep(0.3)


async def _next_of(ws: ClientConnection, kind: str) -> dict[str, Any]:
    while True:
        message: dict[str, Any] = json.loads(await asyncio.wait_for(ws.recv(), 30))
        if message["type"] == kind:
            return message


def _about_victims_rank(rank: dict[str, int]) -> list[dict[str, Any]]:
    """What evil says of the victim's job rank: each closes its channel with 4403."""
    return [
        {"type": "job_update", "state": "exited", "outcome": "failed", "exit_code": 1} | rank,
        {"type": "job_held", "ranks": [rank]},
    ]


def _own_reports(now: float) -> list[dict[str, Any]]:
    """Every other report a node makes after its hello (which `_open` sends): on evil's channel, each
    speaks for evil alone."""
    entry = {"sha256": "ab" * 32, "size_bytes": 1, "copied_at": now, "last_used_at": now, "uses": 1}
    return [
        {"type": "heartbeat", "seq": 10**6},
        {"type": "metrics", "samples": [{"ts": now, "entities": [{"entity": "gpu:0", "values": {"gpu_util": 99.0}}]}]},
        {"type": "events", "events": [{"ts": now, "kind": "xid", "gpu": 0, "code": 79, "message": "evil's"}]},
        {"type": "logs", "lines": [{"ts": now, "source": "kernel", "line": "NVRM: Xid (PCI:0000:01:00): 79, evil's"}]},
        {"type": "mig_result", "id": 1, "errors": {"0": "forged"}},
        {"type": "node_cache", "limit_bytes": 10, "entries": [entry]},
    ]


def test_every_channel_message_type_is_sent() -> None:
    rank = {"job_id": 1, "run": 1, "rank": 0}
    output = {"type": "job_output"}
    sent = {m["type"] for m in [*_about_victims_rank(rank), *_own_reports(0.0), output]} | {"hello", "fault_result"}
    assert sent == {model.model_fields["type"].default for model in get_args(AnyAgentMessage)}


def _victims(head: Head, job_id: int) -> dict[str, Any]:
    """What the head says of the victim: its node (less the times its own channel moves), its metrics,
    its log lines and its job's output."""
    node = head.api("GET", "/api/v1/nodes/victim")
    metrics = {"metric": "gpu_util", "entity": "gpu:0", "since": "1h"}
    return {
        "node": {k: v for k, v in node.items() if k not in ("last_seen", "state_since")},
        "metrics": head.api("GET", "/api/v1/nodes/victim/metrics", params=metrics)["points"],
        "logs": head.api("GET", "/api/v1/logs", params={"node": "victim"}),
        "output": head.api("GET", f"/api/v1/jobs/{job_id}/output")["chunks"],
    }


def _evils_reports_stored(head: Head) -> bool:
    metrics = {"metric": "gpu_util", "entity": "gpu:0", "since": "1h"}
    audited = {r["action"] for r in head.api("GET", "/api/v1/audit", params={"actor": "node:evil"})}
    return (
        bool(head.api("GET", "/api/v1/nodes/evil/metrics", params=metrics)["points"])
        and bool(head.api("GET", "/api/v1/logs", params={"node": "evil"}))
        and "agent.channel.job_output" in audited
    )


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
        # The victim beats as an agent does: its node stays up through the scenario however slow the
        # machine (a second's interval, down after 2.5 without a beat), and holds its GPU and hostname.
        beating = asyncio.create_task(_beat(victim_ws))
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
        for forged in _about_victims_rank(rank):
            evil_ws = await _open(head, evil)
            await evil_ws.send(json.dumps(forged))
            assert await _closed_with(evil_ws) == CLOSE_FORBIDDEN
        assert head.api("GET", f"/api/v1/jobs/{job['id']}")["state"] == "running"

        # Every other report, and output for the victim's rank (dropped and audited at its flush).
        before = await asyncio.to_thread(_victims, head, job["id"])
        evil_ws = await _open(head, evil)
        for own in _own_reports(time.time()):
            await evil_ws.send(json.dumps(own))
        chunk = {"type": "job_output", "stream": "stdout", "offset": 0, "data": "forged\n"} | rank
        await evil_ws.send(json.dumps(chunk))
        await asyncio.to_thread(wait_for, lambda: _evils_reports_stored(head), 30)
        await evil_ws.close()
        assert await asyncio.to_thread(_victims, head, job["id"]) == before

        # A binary frame.
        evil_ws = await _open(head, evil)
        await evil_ws.send(b'{"type": "heartbeat", "seq": 1}')
        assert await _closed_with(evil_ws) == CLOSE_UNSUPPORTED_DATA

        # Evil's inventory naming the victim's GPU or hostname, while the victim is up and holds them (a
        # node that is down holds neither: a card moved to another chassis is reported by its new node).
        assert (await asyncio.to_thread(head.api, "GET", "/api/v1/nodes/victim"))["state"] == "up"
        for claim in (_inventory("evil.cluster", [VICTIMS_GPU]), _inventory("victim.cluster", [])):
            answer = await asyncio.to_thread(
                httpx.put,
                head.url + "/api/v1/agent/inventory",
                content=claim.model_dump_json(),
                headers={"Authorization": f"Bearer {evil}", "Content-Type": "application/json"},
                timeout=30,
            )
            assert answer.status_code == 409, answer.text
            assert "victim" in answer.json()["detail"]
        beating.cancel()
        await victim_ws.close()

    asyncio.run(scenario())

    victim_node = head.api("GET", "/api/v1/nodes/victim")
    assert (victim_node["hostname"], victim_node["gpu_count"]) == ("victim.cluster", 1)
    assert head.api("GET", "/api/v1/nodes/evil")["gpu_count"] == 0
    records = head.api("GET", "/api/v1/audit", params={"actor": "node:evil"})
    refused = sorted(r["action"] for r in records if r["result"] in (403, 409))
    channel = ["agent.channel.fault_result", "agent.channel.job_held", "agent.channel.job_output"]
    assert refused[:4] == [*channel, "agent.channel.job_update"]
    assert len(refused) == 6  # and the two inventories
    assert "Traceback" not in head.log()
