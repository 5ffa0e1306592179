"""The daemon applies the head's MIG layouts over a real channel: the inventory with the new devices goes
out before the answer, a GPU that cannot change is named with why, and an agent without MIG control says so."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

from gpufleet.agent.credentials import Credential, CredentialStore
from gpufleet.agent.daemon import Agent, AgentOptions
from gpufleet.agent.gpu.nvml import NvmlReader
from gpufleet.agent.inventory import inventory_source
from gpufleet.client import AgentHttp
from gpufleet.protocol.inventory import NodeInventory
from gpufleet.protocol.mig import MigApply, MigResult
from gpufleet.sim.host import simulated_host
from gpufleet.sim.nvml import SimulatedNvml
from tests.agent.fake_head import FakeHead
from tests.agent.test_daemon_metrics import running

INTERVAL = 0.05


class Uploads:
    """The head's HTTP side: records each inventory put, and when."""

    def __init__(self, head: FakeHead) -> None:
        self.head = head
        self.sent: list[tuple[NodeInventory, int]] = []  # (inventory, channel messages seen by then)

    async def put_inventory(self, credential: str, inventory: NodeInventory) -> None:
        self.sent.append((inventory, len(self.head.messages)))


def _agent(tmp_path: Path, port: int, uploads: Uploads, *, control: bool = True) -> tuple[Agent, SimulatedNvml]:
    server = f"http://127.0.0.1:{port}"
    store = CredentialStore(tmp_path / "credential.json")
    store.save(Credential(server=server, node="n1", node_id=1, token="gfn_test", heartbeat_interval_s=INTERVAL))
    nvml = SimulatedNvml("n1", gpu_count=2)
    reader = NvmlReader(nvml, source="simulated")
    options = AgentOptions(server=server, name="n1", heartbeat_interval_s=INTERVAL, mig=reader if control else None)
    read = inventory_source(lambda: simulated_host("n1", 2), [reader])
    return Agent(options, store, cast(AgentHttp, uploads), read), nvml


async def _answer(head: FakeHead, command: MigApply) -> MigResult:
    await head.send(command)
    await head.until(lambda: any(r.id == command.id for r in head.of(MigResult)))
    return next(r for r in head.of(MigResult) if r.id == command.id)


def test_a_layout_is_applied_and_the_inventory_goes_out_before_the_answer(tmp_path: Path) -> None:
    async def scenario() -> dict[str, Any]:
        head = FakeHead()
        port = await head.start()
        uploads = Uploads(head)
        agent, nvml = _agent(tmp_path, port, uploads)
        async with running(agent):
            await head.until(lambda: head.connection is not None)
            result = await _answer(head, MigApply(id=7, gpus={0: "all-1g.18gb"}))
            answered_at = next(i for i, m in enumerate(head.messages) if isinstance(m, MigResult))
            busy = uploads.sent[-1][0].gpus[0].mig[0].uuid
            nvml.attach([busy])
            refused = await _answer(head, MigApply(id=8, gpus={0: "none", 1: "3g.71gb+4g.71gb"}))
        await head.stop()
        return {"result": result, "uploads": uploads.sent, "answered_at": answered_at, "refused": refused}

    found = asyncio.run(scenario())
    assert found["result"].errors == {}
    inventory, seen = found["uploads"][0]
    assert [len(g.mig) for g in inventory.gpus] == [7, 0]
    assert seen <= found["answered_at"]  # the new devices were on the head before the answer
    assert list(found["refused"].errors) == [0]
    assert "in use" in found["refused"].errors[0]
    assert [g.mig_mode for g in found["uploads"][-1][0].gpus] == ["enabled", "enabled"]


def test_an_agent_without_mig_control_refuses_every_gpu(tmp_path: Path) -> None:
    async def scenario() -> MigResult:
        head = FakeHead()
        agent, _ = _agent(tmp_path, await head.start(), Uploads(head), control=False)
        async with running(agent):
            await head.until(lambda: head.connection is not None)
            result = await _answer(head, MigApply(id=1, gpus={0: "all-1g.18gb", 1: "none"}))
        await head.stop()
        return result

    assert asyncio.run(scenario()).errors == {0: "this agent manages no MIG", 1: "this agent manages no MIG"}


class _Ranks:
    """The agent's job supervisor as far as MIG goes: the GPUs its ranks hold."""

    def __init__(self, gpus: set[int]) -> None:
        self.gpus = gpus

    def gpus_in_use(self) -> set[int]:
        return self.gpus


def test_a_gpu_a_rank_of_this_node_holds_is_not_changed_even_before_cuda_sees_it(tmp_path: Path) -> None:
    agent, nvml = _agent(tmp_path, 1, Uploads(FakeHead()))
    agent.options.jobs = cast(Any, _Ranks({1}))  # a rank placed on GPU 1, still staging: NVML sees nothing

    result = asyncio.run(agent.apply_mig(MigApply(id=3, gpus={0: "all-1g.18gb", 1: "all-1g.18gb"})))

    assert list(result.errors) == [1]
    assert "a job of this node holds the GPU" in result.errors[1]
    nvml.nvmlInit()
    modes = [nvml.nvmlDeviceGetMigMode(nvml.nvmlDeviceGetHandleByIndex(i))[0] for i in (0, 1)]
    assert modes == [1, 0]
