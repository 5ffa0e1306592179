"""Accounts on nodes end to end: a user made on a real head appears on an agent's (throwaway) root, and is
locked there when disabled."""

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from gpufleet.agent.accounts import AccountSync
from gpufleet.agent.credentials import CredentialStore
from gpufleet.agent.daemon import Agent, AgentOptions
from gpufleet.agent.gpu.nvml import NvmlReader
from gpufleet.agent.inventory import inventory_source
from gpufleet.agent.passwd import read_local_accounts
from gpufleet.client import AgentHttp
from gpufleet.sim.host import simulated_host
from gpufleet.sim.nvml import SimulatedNvml
from tests.agent.test_accounts import KEY_A, make_root, need_account_tools
from tests.e2e.conftest import Head

pytestmark = pytest.mark.e2e


async def _until(predicate: Callable[[], object], seconds: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not await asyncio.to_thread(predicate):
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {seconds}s")
        await asyncio.sleep(0.1)


def test_users_made_on_the_head_become_accounts_on_the_node(head: Head, tmp_path: Path) -> None:
    need_account_tools()
    root = make_root(tmp_path, homes=True)
    head.api("POST", "/api/v1/users", json={"username": "bob", "uid": 20001, "ssh_keys": [KEY_A]})
    sync = AccountSync(root, tmp_path / "agent" / "accounts.json")
    read = inventory_source(
        lambda: simulated_host("n1", 1), [NvmlReader(SimulatedNvml("n1", gpu_count=1), source="simulated")]
    )

    def shadow_of(name: str) -> str:
        entry = read_local_accounts(root).shadow.get(name)
        return f"{entry.password}:{entry.expire}" if entry else ""

    async def scenario() -> None:
        async with httpx.AsyncClient() as http:
            options = AgentOptions(
                server=head.url, name="n1", join_token=head.join_token(1), accounts=sync, accounts_interval_s=0.2
            )
            agent = Agent(
                options, CredentialStore(tmp_path / "agent" / "credential.json"), AgentHttp(head.url, http), read
            )
            task = asyncio.create_task(agent.run())
            keys = root / "home" / "bob" / ".ssh" / "authorized_keys"
            await _until(lambda: agent.accounts_version is not None, 20)  # set once the whole pass is done
            assert KEY_A in keys.read_text()
            assert shadow_of("bob") == "*:"
            first = agent.accounts_version
            head.api("PATCH", "/api/v1/users/bob", json={"enabled": False})
            await _until(lambda: agent.accounts_version != first, 20)
            assert shadow_of("bob") == "!*:1"
            assert KEY_A not in keys.read_text()
            assert agent.connected  # the channel lived through it all
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    asyncio.run(scenario())
    assert read_local_accounts(root).users["bob"].uid == 20001
