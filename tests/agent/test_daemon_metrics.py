"""The daemon's heartbeats, metrics, events and faults over a real channel to an in-process head: what the
agent sends."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import cast

import pytest

from gpufleet.agent.credentials import Credential, CredentialStore
from gpufleet.agent.daemon import Agent, AgentOptions
from gpufleet.agent.faults import REFUSED_ON_REAL_NODES
from gpufleet.agent.gpu.nvml import NvmlReader
from gpufleet.agent.inventory import inventory_source
from gpufleet.agent.metrics.gpu import GpuCollector
from gpufleet.agent.metrics.sampler import Sampler
from gpufleet.agent.metrics.xid import XidBook, XidWatcher
from gpufleet.client import AgentHttp
from gpufleet.protocol.messages import MAX_CHANNEL_MESSAGE_BYTES, Events, FaultResult, Heartbeat, Metrics
from gpufleet.protocol.metrics import FaultCommand, NodeEvent
from gpufleet.sim.faults import SimulatedFaults
from gpufleet.sim.host import simulated_host
from gpufleet.sim.infiniband import SimulatedInfiniband
from gpufleet.sim.nvml import SimulatedNvml
from tests.agent.fake_head import FakeHead

INTERVAL = 0.05


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _agent(
    tmp_path: Path, port: int, *, simulated: bool = True, interval: float = INTERVAL, http: object = None
) -> Agent:
    """An agent over 8 simulated H200s with a stored credential, so it goes straight to the channel."""
    server = f"http://127.0.0.1:{port}"
    store = CredentialStore(tmp_path / "credential.json")
    store.save(Credential(server=server, node="n1", node_id=1, token="gfn_test", heartbeat_interval_s=INTERVAL))
    nvml = SimulatedNvml("n1")
    xids = XidBook()
    options = AgentOptions(
        server=server,
        name="n1",
        heartbeat_interval_s=INTERVAL,
        backoff_initial_s=0.02,
        backoff_max_s=0.05,
        metrics=Sampler([GpuCollector(nvml, xids=xids)]),
        events=XidWatcher(nvml, xids, blocking=False),
        faults=SimulatedFaults(nvml, SimulatedInfiniband(2)) if simulated else None,
        metrics_interval_s=interval,
    )
    read = inventory_source(lambda: simulated_host("n1", 8), [NvmlReader(nvml, source="simulated")])
    return Agent(options, store, cast(AgentHttp, http), read)  # None: the fake head never asks for the inventory


@contextlib.asynccontextmanager
async def running(agent: Agent) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(agent.run())
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _command(head: FakeHead, command: FaultCommand) -> FaultResult:
    await head.send(command)
    await head.until(lambda: any(r.id == command.id for r in head.of(FaultResult)))
    return next(r for r in head.of(FaultResult) if r.id == command.id)


def _xids(head: FakeHead) -> list[tuple[int | None, int | None]]:
    return [(e.gpu, e.code) for m in head.of(Events) for e in m.events if e.kind == "xid"]


class SlowInventoryUpload:
    """The head's HTTP side in a join storm: the inventory upload takes `seconds`."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.uploaded = asyncio.Event()

    async def put_inventory(self, credential: str, inventory: object) -> None:
        await asyncio.sleep(self.seconds)
        self.uploaded.set()


def test_heartbeats_go_out_while_the_inventory_upload_waits_for_the_head(tmp_path: Path) -> None:
    """The head counts a node alive from its hello; a node silent while its upload waits is marked down."""

    async def scenario() -> None:
        head = FakeHead(inventory_wanted=True)
        upload = SlowInventoryUpload(seconds=20 * INTERVAL)
        async with running(_agent(tmp_path, await head.start(), interval=10.0, http=upload)):
            await head.until(lambda: len(head.of(Heartbeat)) >= 5, seconds=upload.seconds)
            assert not upload.uploaded.is_set()
            await asyncio.wait_for(upload.uploaded.wait(), timeout=5)
        await head.stop()

    asyncio.run(scenario())


def test_samples_flow_and_an_injected_xid_goes_out_at_once(tmp_path: Path) -> None:
    async def scenario() -> None:
        head = FakeHead()
        # Metrics every 10 s: the Xid must not wait for a round.
        agent = _agent(tmp_path, await head.start(), interval=10.0)
        async with running(agent):
            await head.until(lambda: head.of(Metrics))
            sample = head.of(Metrics)[0].samples[0]
            assert {e.entity for e in sample.entities} == {f"gpu:{i}" for i in range(8)} | {"host"}

            result = await _command(head, FaultCommand(id=1, action="inject", kind="xid79", gpu=2))
            assert (result.ok, result.message) == (True, "GPU 2 fell off the bus (Xid 79)")
            await head.until(lambda: _xids(head), seconds=2)
            assert _xids(head) == [(2, 79)]

            healed = await _command(head, FaultCommand(id=2, action="heal"))
            assert healed.ok
        await head.stop()

    asyncio.run(scenario())


def test_a_lost_gpu_is_reported_and_left_out_of_the_samples(tmp_path: Path) -> None:
    async def scenario() -> None:
        head = FakeHead()
        agent = _agent(tmp_path, await head.start())
        async with running(agent):
            await head.until(lambda: head.of(Metrics))
            await _command(head, FaultCommand(id=1, action="inject", kind="xid79", gpu=4))

            def lost() -> list[NodeEvent]:
                return [e for m in head.of(Events) for e in m.events if e.kind == "gpu_lost"]

            await head.until(lost)
            assert [e.gpu for e in lost()] == [4]
            count = len(head.of(Metrics))
            await head.until(lambda: len(head.of(Metrics)) > count)
            latest = head.of(Metrics)[-1].samples[-1]
            assert "gpu:4" not in {e.entity for e in latest.entities}
        await head.stop()

    asyncio.run(scenario())


def test_a_real_agent_refuses_every_fault(tmp_path: Path) -> None:
    async def scenario() -> None:
        head = FakeHead()
        agent = _agent(tmp_path, await head.start(), simulated=False)
        async with running(agent):
            await head.until(lambda: head.connection is not None)
            for number, (action, kind) in enumerate([("inject", "xid79"), ("inject", "node-crash"), ("heal", None)]):
                result = await _command(head, FaultCommand(id=number, action=action, kind=kind))  # type: ignore[arg-type]
                assert (result.ok, result.message) == (False, REFUSED_ON_REAL_NODES)
            assert not agent.crashed
        await head.stop()

    asyncio.run(scenario())


def test_a_fault_the_node_cannot_take_is_answered_with_the_reason(tmp_path: Path) -> None:
    async def scenario() -> None:
        head = FakeHead()
        agent = _agent(tmp_path, await head.start())
        async with running(agent):
            await head.until(lambda: head.connection is not None)
            bad_gpu = await _command(head, FaultCommand(id=1, action="inject", kind="thermal", gpu=9))
            no_kind = await _command(head, FaultCommand(id=2, action="inject"))
            assert (bad_gpu.ok, bad_gpu.message) == (False, "this node has no GPU 9 (it has 8)")
            assert (no_kind.ok, no_kind.message) == (False, "inject needs a fault kind")
        await head.stop()

    asyncio.run(scenario())


async def _quiet(head: FakeHead, kinds: tuple[type, ...], seconds: float) -> bool:
    """Whether no message of these kinds arrives for `seconds`."""
    before = len([m for m in head.messages if isinstance(m, kinds)])
    await asyncio.sleep(seconds)
    return len([m for m in head.messages if isinstance(m, kinds)]) == before


def test_node_crash_silences_the_node_but_heal_still_reaches_it(tmp_path: Path) -> None:
    async def scenario() -> None:
        head = FakeHead()
        agent = _agent(tmp_path, await head.start())
        async with running(agent):
            await head.until(lambda: head.of(Metrics) and head.of(Heartbeat))

            crashed = await _command(head, FaultCommand(id=1, action="inject", kind="node-crash"))
            assert crashed.ok
            assert await _quiet(head, (Heartbeat, Metrics, Events), 10 * INTERVAL)

            healed = await _command(head, FaultCommand(id=2, action="heal"))
            assert healed.ok
            assert healed.message.endswith("the agent runs normally again")
            beats, samples = len(head.of(Heartbeat)), len(head.of(Metrics))
            await head.until(lambda: len(head.of(Heartbeat)) > beats and len(head.of(Metrics)) > samples)
        await head.stop()

    asyncio.run(scenario())


def test_agent_hang_keeps_heartbeats_and_stops_metrics(tmp_path: Path) -> None:
    async def scenario() -> None:
        head = FakeHead()
        agent = _agent(tmp_path, await head.start())
        async with running(agent):
            await head.until(lambda: head.of(Metrics))

            assert (await _command(head, FaultCommand(id=1, action="inject", kind="agent-hang"))).ok
            await asyncio.sleep(2 * INTERVAL)  # a round already under way may still land
            beats = len(head.of(Heartbeat))
            assert (await _command(head, FaultCommand(id=2, action="inject", kind="ecc-dbe", gpu=3))).ok
            assert await _quiet(head, (Metrics, Events), 10 * INTERVAL)
            assert len(head.of(Heartbeat)) > beats

            assert (await _command(head, FaultCommand(id=3, action="heal"))).ok
            samples = len(head.of(Metrics))
            await head.until(lambda: len(head.of(Metrics)) > samples)
            await head.until(lambda: _xids(head))  # the Xid of the hang waited in NVML's queue
            assert _xids(head) == [(3, 48)]
        await head.stop()

    asyncio.run(scenario())


def test_samples_taken_while_the_head_was_away_arrive_oldest_first_under_the_size_limit(tmp_path: Path) -> None:
    async def scenario() -> None:
        port = _free_port()
        agent = _agent(tmp_path, port, interval=0.01)
        async with running(agent):
            head = FakeHead()
            await head.until(lambda: agent.outbox.pending[0] >= 20, seconds=10)  # sampled, nowhere to send
            await head.start(port)
            await head.until(lambda: sum(len(m.samples) for m in head.of(Metrics)) >= 20)
            samples = [s for m in head.of(Metrics) for s in m.samples]
            assert [s.ts for s in samples] == sorted(s.ts for s in samples)
            assert max(head.sizes) <= MAX_CHANNEL_MESSAGE_BYTES
            assert any(len(m.samples) > 1 for m in head.of(Metrics))  # the backlog went in batches
            await head.stop()

    asyncio.run(scenario())


@pytest.mark.parametrize("kind", ["xid79", "ecc-dbe", "nvlink-down"])
def test_every_xid_fault_reaches_the_head(tmp_path: Path, kind: str) -> None:
    codes = {"xid79": 79, "ecc-dbe": 48, "nvlink-down": 74}

    async def scenario() -> None:
        head = FakeHead()
        agent = _agent(tmp_path, await head.start(), interval=10.0)
        async with running(agent):
            await head.until(lambda: head.connection is not None)
            await _command(head, FaultCommand(id=1, action="inject", kind=kind, gpu=1))  # type: ignore[arg-type]
            await head.until(lambda: _xids(head), seconds=2)
            assert _xids(head) == [(1, codes[kind])]
        await head.stop()

    asyncio.run(scenario())
