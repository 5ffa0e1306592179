"""The real agent in-process against a real head: inventory changes travel, credentials persist."""

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from gpufleet.agent.credentials import CredentialStore
from gpufleet.agent.daemon import Agent, AgentOptions
from gpufleet.agent.gpu.nvml import NvmlReader
from gpufleet.agent.inventory import inventory_source
from gpufleet.client import AgentHttp
from gpufleet.protocol.inventory import NodeInventory
from gpufleet.sim.host import simulated_host
from gpufleet.sim.nvml import SimulatedNvml
from tests.e2e.conftest import Head

pytestmark = pytest.mark.e2e


class FlakyGpus:
    """A GPU backend whose GPU count the test changes, as when a GPU falls off the bus."""

    def __init__(self) -> None:
        self.count = 8

    def reader(self) -> NvmlReader:
        return NvmlReader(SimulatedNvml("n1", gpu_count=self.count), source="simulated")


async def _until(predicate: Callable[[], object], seconds: float) -> None:
    """Poll a condition that needs blocking HTTP calls (hence the thread) without stalling the agent."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not await asyncio.to_thread(predicate):
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {seconds}s")
        await asyncio.sleep(0.2)


def test_changed_inventory_is_resent_and_credential_reused(head: Head, tmp_path: Path) -> None:
    gpus = FlakyGpus()
    store = CredentialStore(tmp_path / "agent" / "credential.json")

    def read() -> NodeInventory:
        return inventory_source(lambda: simulated_host("n1", gpus.count), [gpus.reader()])()

    def gpu_count() -> int:
        count: int = head.api("GET", "/api/v1/nodes/n1")["gpu_count"]
        return count

    async def scenario() -> None:
        async with httpx.AsyncClient() as http:
            options = AgentOptions(server=head.url, name="n1", join_token=head.join_token(1), inventory_check_s=0.5)
            agent = Agent(options, store, AgentHttp(head.url, http), read)
            task = asyncio.create_task(agent.run())
            await _until(lambda: head.nodes() and head.nodes()[0]["state"] == "up", 20)
            assert gpu_count() == 8
            gpus.count = 7  # a GPU fell off the bus
            await _until(lambda: gpu_count() == 7, 10)
            await _until(lambda: agent.acked_seq > 0, 5)  # heartbeats are acknowledged
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            # A restart uses the stored credential: no join token needed, the join token is spent anyway.
            restarted = Agent(AgentOptions(server=head.url, name="n1"), store, AgentHttp(head.url, http), read)
            task = asyncio.create_task(restarted.run())
            await _until(lambda: restarted.connected, 10)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    asyncio.run(scenario())
    assert store.load() is not None


def test_simulated_metrics_reach_the_head_and_faults_reach_the_simulated_node(head: Head, tmp_path: Path) -> None:
    """The simulator's wiring end to end: samples stored by the real head, a fault through its API and channel."""
    from gpufleet.sim.runner import SimOptions, Simulation

    def series(entity: str, metric: str) -> list[float]:
        query = {"metric": metric, "entity": entity, "since": "5m", "step": "1s"}
        try:
            answer = head.api("GET", "/api/v1/nodes/sim001/metrics", params=query)
        except httpx.HTTPStatusError as exc:
            if exc.response.status_code == 404:
                return []  # the node has not joined yet
            raise
        return [point["value"] for point in answer["points"]]

    def fault(**body: object) -> dict[str, object]:
        result: dict[str, object] = head.api("POST", "/api/v1/nodes/sim001/faults", json=body)
        return result

    async def scenario() -> None:
        options = SimOptions(
            server=head.url, join_token=head.join_token(1), nodes=1, state_dir=tmp_path / "sim", metrics_interval_s=0.5
        )
        simulation = Simulation(options)
        task = asyncio.create_task(simulation.run())
        try:
            await _until(lambda: series("gpu:3", "gpu_temp_c"), 20)
            assert max(series("gpu:3", "gpu_temp_c")) < 50

            outcome = await asyncio.to_thread(fault, kind="thermal", gpu=3)
            assert outcome == {"node": "sim001", "ok": True, "message": "GPU 3 overheats: thermal slowdown"}
            await _until(lambda: max(series("gpu:3", "gpu_temp_c")) >= 90, 10)
            assert series("ib:mlx5_0/1", "ib_state")[-1] == 4

            healed = await asyncio.to_thread(fault, action="heal")
            assert healed["ok"]
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    asyncio.run(scenario())


def test_simulated_nodes_whose_credentials_the_head_does_not_know_join_it_again(head: Head, tmp_path: Path) -> None:
    """`gpufleet sim` run again against a new head: the credentials it kept are another head's, and with a
    join token its nodes join this one instead of stopping on "unknown token"."""
    from gpufleet.agent.credentials import Credential
    from gpufleet.sim.runner import SimOptions, Simulation

    state = tmp_path / "sim"
    for node_id, name in enumerate(("sim001", "sim002"), start=1):
        stale = Credential(server=head.url, node=name, node_id=node_id, token="gfn_issued_by_another_head")
        CredentialStore(state / "nodes" / f"{name}.json").save(stale)

    async def scenario() -> None:
        simulation = Simulation(
            SimOptions(
                server=head.url, join_token=head.join_token(2), nodes=2, state_dir=state, metrics_interval_s=None
            )
        )
        task = asyncio.create_task(simulation.run())
        try:
            await _until(lambda: [n["state"] for n in head.nodes()] == ["up", "up"], 20)
            assert simulation.failures == {}
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    asyncio.run(scenario())
    for name in ("sim001", "sim002"):
        kept = CredentialStore(state / "nodes" / f"{name}.json").load()
        assert kept is not None
        assert kept.token != "gfn_issued_by_another_head"  # the new head's credential, kept for the next run
