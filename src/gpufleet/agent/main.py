"""`gpufleet agent`: build the real agent (NVML, then nvidia-smi, then no GPUs) and run it."""

from __future__ import annotations

import asyncio

import httpx

from gpufleet.agent.credentials import CredentialStore
from gpufleet.agent.daemon import Agent, AgentOptions
from gpufleet.agent.gpu.nvml import NvmlReader
from gpufleet.agent.gpu.smi import NvidiaSmiReader
from gpufleet.agent.host import read_host_facts
from gpufleet.agent.inventory import inventory_source
from gpufleet.client import AgentHttp
from gpufleet.core.config import Settings


def run_agent(settings: Settings, name: str, join_token: str | None, heartbeat_interval_s: float | None) -> None:
    """Run until interrupted. Raises Unauthorized/AgentStopped (clear messages) when the head refuses the node."""
    store = CredentialStore(settings.agent_state_dir / "credential.json")
    read = inventory_source(read_host_facts, [NvmlReader(), NvidiaSmiReader()])

    async def main() -> None:
        async with httpx.AsyncClient() as http:
            options = AgentOptions(
                server=settings.server,
                name=name,
                join_token=join_token,
                heartbeat_interval_s=heartbeat_interval_s,
            )
            await Agent(options, store, AgentHttp(settings.server, http), read).run()

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        return
