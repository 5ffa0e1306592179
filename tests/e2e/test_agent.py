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
