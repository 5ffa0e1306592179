"""The node's checks on their way out: run off the event loop, attached to every sample, whole in a split one."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import cast

from gpufleet.agent.checks.runner import HostChecks
from gpufleet.agent.credentials import Credential, CredentialStore
from gpufleet.agent.daemon import Agent, AgentOptions
from gpufleet.agent.gpu.nvml import NvmlReader
from gpufleet.agent.inventory import inventory_source
from gpufleet.agent.metrics.gpu import GpuCollector
from gpufleet.agent.metrics.outbox import Outbox
from gpufleet.agent.metrics.sampler import Sampler
from gpufleet.client import AgentHttp
from gpufleet.protocol.messages import Heartbeat, Metrics, agent_message_adapter
from gpufleet.protocol.metrics import CheckResult, Sample
from gpufleet.sim.checks import SimulatedChecks
from gpufleet.sim.host import simulated_host
from gpufleet.sim.nvml import SimulatedNvml
from gpufleet.sim.runner import SimOptions, Simulation
from tests.agent.fake_head import FakeHead

INTERVAL = 0.05
FAILED = CheckResult(name="nhc", status=1, message="check_fs_mount: /scratch not mounted")


class BlockingChecks:
    """A check round that lasts until the test lets it end."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def run(self) -> list[CheckResult]:
        self.release.wait(10)
        return [FAILED]


def _agent(tmp_path: Path, port: int, checks: object, *, checks_interval_s: float = INTERVAL) -> Agent:
    server = f"http://127.0.0.1:{port}"
    store = CredentialStore(tmp_path / "credential.json")
    store.save(Credential(server=server, node="n1", node_id=1, token="gfn_test", heartbeat_interval_s=INTERVAL))
    nvml = SimulatedNvml("n1", gpu_count=1)
    options = AgentOptions(
        server=server,
        name="n1",
        heartbeat_interval_s=INTERVAL,
        backoff_initial_s=0.02,
        backoff_max_s=0.05,
        metrics=Sampler([GpuCollector(nvml)]),
        metrics_interval_s=INTERVAL,
        checks=checks,  # type: ignore[arg-type]
        checks_interval_s=checks_interval_s,
    )
    read = inventory_source(lambda: simulated_host("n1", 1), [NvmlReader(nvml, source="simulated")])
    return Agent(options, store, cast(AgentHttp, None), read)


@contextlib.asynccontextmanager
async def running(agent: Agent) -> AsyncIterator[None]:
    task = asyncio.create_task(agent.run())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _samples(head: FakeHead) -> list[Sample]:
    return [s for m in head.of(Metrics) for s in m.samples]


def test_every_sample_carries_the_latest_checks(tmp_path: Path) -> None:
    async def scenario() -> None:
        head = FakeHead()
        checks = SimulatedChecks()
        checks.set([FAILED])
        agent = _agent(tmp_path, await head.start(), checks)
        async with running(agent):
            await head.until(lambda: len(_samples(head)) >= 2)
            assert all(s.checks == [FAILED] for s in _samples(head))  # the first one too

            checks.set([])  # repaired: the next rounds say so
            await head.until(lambda: _samples(head)[-1].checks == [])
        await head.stop()

    asyncio.run(scenario())


def test_a_slow_check_round_holds_no_heartbeat_and_the_first_sample_waits_for_it(tmp_path: Path) -> None:
    async def scenario() -> None:
        head = FakeHead()
        checks = BlockingChecks()
        agent = _agent(tmp_path, await head.start(), checks, checks_interval_s=60)
        async with running(agent):
            await head.until(lambda: len(head.of(Heartbeat)) >= 5)
            assert _samples(head) == []  # a sample without checks would clear the head's verdict

            checks.release.set()
            await head.until(lambda: _samples(head))
            assert _samples(head)[0].checks == [FAILED]
        await head.stop()

    asyncio.run(scenario())


def test_real_checks_reach_the_head(tmp_path: Path) -> None:
    checks_dir = tmp_path / "checks.d"
    checks_dir.mkdir()
    check = checks_dir / "scratch"
    check.write_text("#!/bin/sh\necho '/scratch is read-only'\nexit 3\n")
    check.chmod(0o755)

    async def scenario() -> None:
        head = FakeHead()
        source = HostChecks(checks_dir, timeout_s=5, mounts=["/"], enforce_owner=False)
        agent = _agent(tmp_path, await head.start(), source, checks_interval_s=60)
        async with running(agent):
            await head.until(lambda: _samples(head))
            got = {c.name: (c.status, c.message) for c in _samples(head)[0].checks}
            assert got["scratch"] == (2, "/scratch is read-only")
            assert got["mount:-"][0] == 0
        await head.stop()

    asyncio.run(scenario())


def test_a_split_sample_carries_the_checks_whole_in_its_first_part() -> None:
    entities = [{"entity": f"gpu:{i}", "values": {f"m{j}": float(j) for j in range(30)}} for i in range(200)]
    checks = [CheckResult(name=f"c{i}", status=i % 3, message="x" * 200) for i in range(100)]  # about 24 KB
    big = Sample.model_validate({"ts": 7.0, "entities": entities, "checks": checks})
    outbox = Outbox()

    outbox.add_sample(big)
    parts = []
    while (message := outbox.next_message()) is not None:
        parsed = agent_message_adapter.validate_json(message.text)
        assert isinstance(parsed, Metrics)
        parts.extend(parsed.samples)
        outbox.sent(message)

    assert len(parts) >= 2
    assert parts[0].checks == checks
    assert all(p.checks == [] for p in parts[1:])
    assert parts[0].entities  # the checks leave room for entities
    assert [e for p in parts for e in p.entities] == big.entities


def test_the_simulator_runs_no_host_checks_unless_asked() -> None:
    plain = Simulation(SimOptions(server="http://127.0.0.1:9", join_token=None, nodes=1))
    checked = Simulation(SimOptions(server="http://127.0.0.1:9", join_token=None, nodes=1, checks_interval_s=2.0))
    plain.build()
    checked.build()

    assert plain.agents["sim001"].options.checks is None
    options = checked.agents["sim001"].options
    assert isinstance(options.checks, SimulatedChecks)
    assert options.checks.run() == []
    assert options.checks_interval_s == 2.0
    asyncio.run(plain.close())
    asyncio.run(checked.close())
