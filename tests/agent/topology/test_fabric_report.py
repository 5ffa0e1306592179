"""The agent's InfiniBand fabric task: ibnetdiscover read in a thread every fabric_interval_s, the fabric sent
at start and then only when its digest changed; a failing ibnetdiscover or head is logged, never fatal."""

from __future__ import annotations

import asyncio
import logging
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import cast

import pytest

from gpufleet.agent import main as agent_main
from gpufleet.agent.credentials import Credential, CredentialStore
from gpufleet.agent.daemon import Agent, AgentOptions, FabricSource
from gpufleet.agent.topology import ibnet
from gpufleet.client import AgentHttp
from gpufleet.core.errors import PayloadTooLarge, Unavailable
from gpufleet.protocol.inventory import NodeInventory
from gpufleet.protocol.topology import IbFabric

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "topology"
HDR = (FIXTURES / "ibnetdiscover-44.0-ibsim-hdr-leaf-spine.txt").read_bytes()
SUN = (FIXTURES / "ibnetdiscover-ibtopotool-sun-dcs36-qdr.txt").read_bytes()
CREDENTIAL = Credential(server="http://head", node="gpu001", node_id=1, token="gfn_x")


class FakeRunner:
    """ibnetdiscover's answers in turn: bytes (its output, status 0), an int (that exit status), or an
    exception to raise; the last answer repeats."""

    def __init__(self, *answers: bytes | int | Exception) -> None:
        self.answers = list(answers)
        self.calls: list[list[str]] = []

    def __call__(self, args: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[bytes]:
        self.calls.append(list(args))
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        if isinstance(answer, int):
            return subprocess.CompletedProcess(args, answer, b"", b"ibwarn: mad_rpc_open_port: can't open UMAD port")
        return subprocess.CompletedProcess(args, 0, answer, b"")


class StubHttp:
    """Takes fabrics like the head, or raises the errors queued for it."""

    def __init__(self, *errors: Exception | None) -> None:
        self.errors = list(errors)
        self.sent: list[tuple[str, IbFabric]] = []

    async def put_fabric(self, credential: str, fabric: IbFabric) -> None:
        error = self.errors.pop(0) if self.errors else None
        if error is not None:
            raise error
        self.sent.append((credential, fabric))


def _agent(tmp_path: Path, http: StubHttp, read: FabricSource, interval_s: float = 600.0) -> Agent:
    options = AgentOptions(server="http://head", name="gpu001", fabric=read, fabric_interval_s=interval_s)

    def inventory() -> NodeInventory:
        raise AssertionError("not needed")

    return Agent(options, CredentialStore(tmp_path / "credential.json"), cast(AgentHttp, http), inventory)


def _reader(runner: FakeRunner) -> FabricSource:
    return lambda: ibnet.read_fabric(run=runner)


def test_the_fabric_is_sent_at_start_and_then_only_when_it_changed(tmp_path: Path) -> None:
    runner = FakeRunner(HDR, HDR, SUN, SUN, HDR)
    http = StubHttp()
    agent = _agent(tmp_path, http, _reader(runner))

    async def rounds() -> list[bool]:
        return [await agent.report_fabric(CREDENTIAL, _reader(runner)) for _ in range(5)]

    assert asyncio.run(rounds()) == [True, False, True, False, True]
    assert runner.calls == [["ibnetdiscover"]] * 5
    assert [len(f.switches) for _, f in http.sent] == [3, 1, 3]
    assert {c for c, _ in http.sent} == {"gfn_x"}
    assert http.sent[0][1] == ibnet.parse_ibnetdiscover(HDR.decode())
    assert agent.fabric_digest == http.sent[-1][1].digest()


def test_a_failing_ibnetdiscover_or_head_is_logged_and_tried_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    runner = FakeRunner(FileNotFoundError("ibnetdiscover"), 1, subprocess.TimeoutExpired("ibnetdiscover", 120), HDR)
    http = StubHttp(Unavailable("cannot reach the head node"), PayloadTooLarge("request body larger than 1 bytes"))
    agent = _agent(tmp_path, http, _reader(runner))

    async def rounds() -> list[bool]:
        return [await agent.report_fabric(CREDENTIAL, _reader(runner)) for _ in range(7)]

    with caplog.at_level(logging.WARNING, logger="gpufleet.agent.daemon"):
        sent = asyncio.run(rounds())
    # not installed, exit 1, timed out, then read: refused twice by the head (its digest not kept), then taken
    assert sent == [False, False, False, False, False, True, False]
    assert len(http.sent) == 1
    said = caplog.text
    assert "ibnetdiscover is not installed (infiniband-diags)" in said
    assert "ibnetdiscover exited with status 1: ibwarn: mad_rpc_open_port" in said
    assert "did not finish within 120 s" in said
    assert "InfiniBand fabric not sent: cannot reach the head node" in said


def test_an_unexpected_error_in_the_reader_does_not_end_the_task(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[int] = []
    fabric = ibnet.parse_ibnetdiscover(HDR.decode())

    def read() -> IbFabric:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("boom")
        return fabric

    http = StubHttp()
    agent = _agent(tmp_path, http, read, interval_s=0.01)

    async def run_a_while() -> None:
        task = asyncio.create_task(agent._watch_fabric(CREDENTIAL, read))
        for _ in range(500):
            await asyncio.sleep(0.01)
            if len(calls) >= 4:
                break
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    with caplog.at_level(logging.WARNING, logger="gpufleet.agent.daemon"):
        asyncio.run(run_a_while())
    assert len(calls) >= 4  # the loop went on after the error
    assert [f for _, f in http.sent] == [fabric]  # sent once: unchanged afterwards
    assert "InfiniBand fabric not read or not sent" in caplog.text


def test_the_source_is_ibnetdiscover_only_when_the_interval_is_set_and_it_is_installed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert agent_main.fabric_source(0, which=lambda _: "/usr/sbin/ibnetdiscover") is None
    assert agent_main.fabric_source(600, which=lambda _: "/usr/sbin/ibnetdiscover") is ibnet.read_fabric
    with caplog.at_level(logging.WARNING):
        assert agent_main.fabric_source(600, which=lambda _: None) is None
    assert "fabric_interval_s is set but ibnetdiscover is not installed" in caplog.text


def test_the_setting_is_off_by_default_and_never_a_busy_loop(tmp_path: Path) -> None:
    from gpufleet.core.config import load_settings

    none = tmp_path / "none.toml"
    assert load_settings(client_file=none, data_dir=tmp_path).fabric_interval_s == 0
    assert load_settings(client_file=none, data_dir=tmp_path, fabric_interval_s=900).fabric_interval_s == 900
    with pytest.raises(Exception, match="must be 0 \\(off\\) or at least 60 seconds"):
        load_settings(client_file=none, data_dir=tmp_path, fabric_interval_s=5)
