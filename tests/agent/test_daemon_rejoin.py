"""A stored credential the head refuses (issued by another head, or revoked): with a join token the node
joins again and says so; without one it stops with a message that says what to do."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import httpx
import pytest

from gpufleet.agent.credentials import Credential, CredentialStore
from gpufleet.agent.daemon import Agent, AgentOptions, AgentStopped
from gpufleet.agent.gpu.nvml import NvmlReader
from gpufleet.agent.inventory import inventory_source
from gpufleet.client import AgentHttp
from gpufleet.protocol.messages import Heartbeat, JoinResponse
from gpufleet.sim.host import simulated_host
from gpufleet.sim.nvml import SimulatedNvml
from tests.agent.fake_head import FakeHead

JOIN_TOKEN = "gfj_join"
STALE = "gfn_from_another_head"
INTERVAL = 0.05


class JoinDesk:
    """The head's join endpoint: trades JOIN_TOKEN for a new credential, which the fake head then takes
    unless `broken` (a head that refuses what it has just issued)."""

    def __init__(self, head: FakeHead, broken: bool = False, busy: int = 0, store: Path | None = None) -> None:
        self.head = head
        self.broken = broken
        self.busy = busy  # the first joins answer 503 (the head's database busy)
        self.store = store
        self.stored_while_joining: list[str | None] = []
        self.issued: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/api/v1/agent/join"
        if self.store is not None:
            kept = CredentialStore(self.store).load()
            self.stored_while_joining.append(kept.token if kept else None)
        if self.busy > 0:
            self.busy -= 1
            return httpx.Response(503, json={"detail": "database is locked"})
        if request.headers["Authorization"] != f"Bearer {JOIN_TOKEN}":
            return httpx.Response(401, json={"detail": "unknown token"})
        credential = f"gfn_new{len(self.issued)}"
        self.issued.append(credential)
        if self.head.credentials is not None and not self.broken:
            self.head.credentials.add(credential)
        name = json.loads(request.content)["name"]
        answer = JoinResponse(node_id=1, name=name, credential=credential, heartbeat_interval_s=INTERVAL)
        return httpx.Response(200, content=answer.model_dump_json())


async def run_agent(tmp_path: Path, desk: JoinDesk, join_token: str | None) -> None:
    """The agent of node n1, its stored credential STALE, against the desk's head: until it has sent
    three heartbeats on a channel the head took, or it stopped (its error raised)."""
    head = desk.head
    port = await head.start()
    server = f"http://127.0.0.1:{port}"
    store = CredentialStore(tmp_path / "credential.json")
    store.save(Credential(server=server, node="n1", node_id=7, token=STALE, heartbeat_interval_s=INTERVAL))
    nvml = SimulatedNvml("n1", gpu_count=1)
    read = inventory_source(lambda: simulated_host("n1", 1), [NvmlReader(nvml, source="simulated")])
    options = AgentOptions(server=server, name="n1", join_token=join_token, backoff_initial_s=0.02, backoff_max_s=0.05)
    async with httpx.AsyncClient(transport=httpx.MockTransport(desk)) as http:
        agent = Agent(options, store, AgentHttp(server, http), read)
        task = asyncio.create_task(agent.run())
        beating = asyncio.create_task(head.until(lambda: len(head.of(Heartbeat)) >= 3))
        try:
            await asyncio.wait({task, beating}, return_when=asyncio.FIRST_COMPLETED)
            if task.done():
                task.result()
            beating.result()
        finally:
            task.cancel()
            beating.cancel()
            await asyncio.gather(task, beating, return_exceptions=True)
            await head.stop()


def test_a_refused_credential_is_replaced_by_joining_again(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    head = FakeHead(credentials={"gfn_other_node"})
    desk = JoinDesk(head)
    with caplog.at_level(logging.WARNING, logger="gpufleet.agent.daemon"):
        asyncio.run(run_agent(tmp_path, desk, JOIN_TOKEN))
    assert desk.issued == ["gfn_new0"]  # one join, with the join token
    assert head.presented[0] == STALE
    assert set(head.presented[1:]) == {"gfn_new0"}  # the channel the head took carries the new credential
    stored = CredentialStore(tmp_path / "credential.json").load()
    assert stored is not None
    assert stored.token == "gfn_new0"
    assert "refused the stored credential of node n1 (unknown token); joining again with the join token" in caplog.text


def test_without_a_join_token_a_refused_credential_stops_the_node_saying_why(tmp_path: Path) -> None:
    head = FakeHead(credentials={"gfn_other_node"})
    desk = JoinDesk(head)
    with pytest.raises(AgentStopped, match=r"refused the credential of node n1 \(unknown token\).*pass --join-token"):
        asyncio.run(run_agent(tmp_path, desk, None))
    assert head.presented == [STALE]
    assert desk.issued == []
    stored = CredentialStore(tmp_path / "credential.json").load()
    assert stored is not None
    assert stored.token == STALE  # left for the admin to look at


def test_a_credential_refused_right_after_the_join_stops_the_node_rather_than_joining_again(tmp_path: Path) -> None:
    head = FakeHead(credentials={"gfn_other_node"})
    desk = JoinDesk(head, broken=True)
    with pytest.raises(AgentStopped, match=r"refused the credential it had just issued to node n1"):
        asyncio.run(run_agent(tmp_path, desk, JOIN_TOKEN))
    assert head.presented == [STALE, "gfn_new0"]
    assert desk.issued == ["gfn_new0"]  # one join, not a join token spent again and again


def test_a_join_that_fails_keeps_the_stored_credential_until_the_new_one_is_saved(tmp_path: Path) -> None:
    """A refused credential is replaced, never first deleted: a join the head cannot answer for a while
    leaves the node with what it had."""
    head = FakeHead(credentials={"gfn_other_node"})
    desk = JoinDesk(head, busy=2, store=tmp_path / "credential.json")
    asyncio.run(run_agent(tmp_path, desk, JOIN_TOKEN))
    assert desk.stored_while_joining == [STALE, STALE, STALE]  # two busy answers, then the join that worked
    stored = CredentialStore(tmp_path / "credential.json").load()
    assert stored is not None
    assert stored.token == "gfn_new0"
