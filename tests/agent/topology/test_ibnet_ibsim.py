"""The agent's ibnetdiscover reader against a real ibnetdiscover (infiniband-diags) discovering a fabric that
ibsim simulates (scripts/services/ibsim.sh): the fixture's HDR leaf/spine fabric, then the same fabric with a
cable pulled, and the agent's fabric round sending it to a head. One ibsim at a time on the machine (its
socket is not per process): xdist workers take turns."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
from fastapi.testclient import TestClient
from filelock import FileLock

from gpufleet.agent.credentials import Credential, CredentialStore
from gpufleet.agent.daemon import Agent, AgentOptions, FabricSource
from gpufleet.agent.topology.ibnet import Runner, parse_ibnetdiscover, read_fabric
from gpufleet.client import AgentHttp
from gpufleet.protocol.inventory import NodeInventory
from gpufleet.protocol.topology import IbFabric
from tests.services import install_tools, need

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "topology"
NET = FIXTURES / "ibsim-hdr-leaf-spine.net"
LOCK = Path("/tmp") / "gpufleet-test-ibsim.lock"


@contextlib.contextmanager
def ibsim(net: Path) -> Iterator[dict[str, str]]:
    """ibsim serving `net`, until the block ends; yields the tools' paths."""
    tools = install_tools(("ibsim", "ibsim-run", "ibnetdiscover"), "ibsim.sh")
    with FileLock(str(LOCK)):
        server = subprocess.Popen(
            [tools["ibsim"], "-s", "-n", str(net)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            assert server.stdout is not None
            for line in server.stdout:  # it says when it listens
                if b"simulator ready" in line:
                    break
            else:
                need("ibsim", f"ibsim exited with status {server.wait()} before it was ready")
            yield tools
        finally:
            server.terminate()
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


def _through(tools: dict[str, str]) -> Runner:
    """A runner for read_fabric that runs ibnetdiscover under ibsim-run (libumad2sim preloaded)."""

    def run(args: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[bytes]:
        command = [tools["ibsim-run"], tools["ibnetdiscover"], *args[1:]]
        return subprocess.run(command, capture_output=True, timeout=timeout_s, check=False)

    return run


def test_ibnetdiscover_on_a_simulated_fabric(tmp_path: Path) -> None:
    with ibsim(NET) as tools:
        live = read_fabric(run=_through(tools), timeout_s=60)
    recorded = parse_ibnetdiscover((FIXTURES / "ibnetdiscover-44.0-ibsim-hdr-leaf-spine.txt").read_text())
    assert live == recorded  # the same fabric as the capture, whatever order ibnetdiscover walked it in
    assert [(a.host, a.device, a.switch_port) for a in live.attachments()][:2] == [
        ("gpu001", "mlx5_0", 1),
        ("gpu001", "mlx5_1", 2),
    ]


def test_a_pulled_cable_is_gone_from_the_fabric(tmp_path: Path) -> None:
    # gpu002's mlx5_1 unplugged: its block and the leaf's line for it left out of the net file.
    blocks = [b for b in NET.read_text().split("\n\n") if 'Ca\t1 "H-0c42a10300d1e102"' not in b]
    leaf_line = '[4]\t"H-0c42a10300d1e102"[1](0c42a10300d1e102)\t\t# "gpu002 mlx5_1" lid 13 4xHDR\n'
    net = tmp_path / "net"
    net.write_text("\n\n".join(blocks).replace(leaf_line, ""))
    assert "0c42a10300d1e102" not in net.read_text()
    with ibsim(net) as tools:
        started = time.monotonic()
        fabric: IbFabric = read_fabric(run=_through(tools), timeout_s=60)
    assert time.monotonic() - started < 60
    assert len(fabric.cas) == 5
    assert ("gpu002", "mlx5_1") not in {(a.host, a.device) for a in fabric.attachments()}
    assert len(fabric.links) == 9


def test_the_agent_reads_the_simulated_fabric_and_the_head_places_the_nodes(client: TestClient) -> None:
    """The agent's fabric round (real ibnetdiscover under ibsim) through its real HTTP client into the head:
    gpu001's two HCAs are on leaf01's ports 1 and 2."""
    join = client.post("/api/v1/tokens/join", json={"expires_in_s": 600}).json()["token"]
    joined = client.post("/api/v1/agent/join", json={"name": "gpu001"}, headers={"Authorization": f"Bearer {join}"})
    credential = Credential(server="http://head", node="gpu001", node_id=1, token=joined.json()["credential"])

    def inventory() -> NodeInventory:
        raise AssertionError("not needed")

    async def report(read: FabricSource) -> list[bool]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=client.app)) as http:
            options = AgentOptions(server="http://head", name="gpu001", fabric=read)
            agent = Agent(options, CredentialStore(Path("/nonexistent")), AgentHttp("http://head", http), inventory)
            return [await agent.report_fabric(credential, read), await agent.report_fabric(credential, read)]

    with ibsim(NET) as tools:
        runner = _through(tools)
        sent = asyncio.run(report(lambda: read_fabric(run=runner, timeout_s=60)))
    assert sent == [True, False]  # the second round found the same fabric: not sent again
    shown = client.get("/api/v1/fabric").json()
    assert shown["reported_by"] == "gpu001"
    assert (len(shown["switches"]), len(shown["cas"]), len(shown["links"])) == (3, 6, 10)
    links = client.get("/api/v1/nodes/gpu001/links").json()
    assert [(ln["interface"], ln["switch"], ln["switch_port"], ln["rate"]) for ln in links] == [
        ("mlx5_0/1", "MF0;leaf01:MQM8700/U1", "1", "4xHDR"),
        ("mlx5_1/1", "MF0;leaf01:MQM8700/U1", "2", "4xHDR"),
    ]
