"""The LLDP neighbours in the node's inventory: read with the rest, sent to a head that takes them, and
to a head older than them (its inventory model refuses unknown keys) sent without them, so the node joins
and keeps its channel either way."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ConfigDict, ValidationError, create_model

from gpufleet.agent.credentials import Credential, CredentialStore
from gpufleet.agent.daemon import Agent, AgentOptions
from gpufleet.agent.gpu.nvml import NvmlReader
from gpufleet.agent.inventory import inventory_source
from gpufleet.client import AgentHttp
from gpufleet.core.errors import describe
from gpufleet.protocol.inventory import NodeInventory
from gpufleet.protocol.messages import Heartbeat, JoinResponse
from gpufleet.protocol.topology import LinkNeighbor
from gpufleet.sim.host import simulated_host
from gpufleet.sim.nvml import SimulatedNvml
from tests.agent.fake_head import FakeHead

INTERVAL = 0.05
LEAF = LinkNeighbor(local_interface="eth0", system_name="leaf01", port_id="swp1", port_id_type="ifname")
OLD_INVENTORY: Any = create_model(
    "OldNodeInventory",
    __config__=ConfigDict(extra="forbid"),
    **{n: (f.annotation, f) for n, f in NodeInventory.model_fields.items() if n != "neighbors"},  # type: ignore[call-overload]
)


def _read(neighbors: list[LinkNeighbor]) -> Any:
    nvml = SimulatedNvml("n1", gpu_count=1)
    return inventory_source(lambda: simulated_host("n1", 1), [NvmlReader(nvml, source="simulated")], lambda: neighbors)


def test_the_inventory_carries_what_lldpd_hears() -> None:
    assert _read([LEAF])().neighbors == [LEAF]
    nvml = SimulatedNvml("n1", gpu_count=1)
    assert inventory_source(lambda: simulated_host("n1", 1), [NvmlReader(nvml, source="simulated")])().neighbors == []


class HeadDesk:
    """The head's HTTP side: the join and the inventory, parsed by the current model or, for an `older`
    head, by one without the neighbours that refuses them as the real head refuses a malformed inventory."""

    def __init__(self, older: bool) -> None:
        self.older = older
        self.inventories: list[dict[str, Any]] = []
        self.refused = 0
        self.joins: list[dict[str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if request.url.path == "/api/v1/agent/join":
            self.joins.append(body)
            if self.older and body.get("inventory") is not None:
                OLD_INVENTORY.model_validate(body["inventory"])
            answer = JoinResponse(node_id=1, name="n1", credential="gfn_new", heartbeat_interval_s=INTERVAL)
            return httpx.Response(200, content=answer.model_dump_json())
        assert request.url.path == "/api/v1/agent/inventory"
        try:
            (OLD_INVENTORY if self.older else NodeInventory).model_validate_json(request.content)
        except ValidationError as exc:
            self.refused += 1
            return httpx.Response(400, json={"detail": f"malformed inventory: {describe(exc)}"})
        self.inventories.append(body)
        return httpx.Response(204)


async def _run(tmp_path: Path, desk: HeadDesk, *, joined: bool) -> Agent:
    """The agent of n1 (stored credential, or a join token) until it has beaten three times on a channel
    whose head wanted its inventory."""
    head = FakeHead(inventory_wanted=True)
    port = await head.start()
    server = f"http://127.0.0.1:{port}"
    store = CredentialStore(tmp_path / "credential.json")
    if joined:
        store.save(Credential(server=server, node="n1", node_id=1, token="gfn_old", heartbeat_interval_s=INTERVAL))
    options = AgentOptions(server=server, name="n1", join_token=None if joined else "gfj_join")
    async with httpx.AsyncClient(transport=httpx.MockTransport(desk)) as http:
        agent = Agent(options, store, AgentHttp(server, http), _read([LEAF]))
        task = asyncio.create_task(agent.run())
        try:
            await head.until(lambda: len(head.of(Heartbeat)) >= 3 and desk.inventories)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await head.stop()
    return agent


def test_a_head_that_takes_neighbours_gets_them(tmp_path: Path) -> None:
    desk = HeadDesk(older=False)
    agent = asyncio.run(_run(tmp_path, desk, joined=True))
    assert desk.refused == 0
    assert desk.inventories[0]["neighbors"][0]["system_name"] == "leaf01"
    assert agent.head_takes_neighbors


def test_an_older_head_gets_the_inventory_without_them(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    desk = HeadDesk(older=True)
    with caplog.at_level(logging.WARNING, logger="gpufleet.agent.daemon"):
        agent = asyncio.run(_run(tmp_path, desk, joined=True))
    assert desk.refused == 1  # once: the agent remembers
    assert "neighbors" not in desk.inventories[0]
    assert not agent.head_takes_neighbors
    assert "does not take LLDP neighbours (it is older than this agent)" in caplog.text


def test_a_node_joins_an_older_head(tmp_path: Path) -> None:
    desk = HeadDesk(older=True)
    asyncio.run(_run(tmp_path, desk, joined=False))
    assert len(desk.joins) == 1
    assert "neighbors" not in desk.joins[0]["inventory"]  # joined without them, which an older head refuses
