"""Issue 26's must-show for the network, with real processes: a head polling two switches it was told of
through the CLI and the API, one of them snmpsim serving a real Arista's recording (tests/network/conftest.py:
its values changed between polls as a test needs), the other Debian's snmpd counting a real veth pair; and the
nodes behind them, real agent code: a simulated node (`gpufleet sim`) that the Arista's LLDP-MIB names on
Ethernet47, and a node whose own lldpd hears snmpd's end of the veth pair (an lldpd on each end; the node's
agent reads its neighbours with the agent's LLDP reader and sends them in its inventory).

Shown: a port that was up going down fires SwitchPortDown naming the switch, the port and the node behind it
(even though the node's lldpd forgets the switch as soon as the cable is gone); an error counter rising fires
SwitchPortErrors naming them; a 64-bit counter going back and a 32-bit counter wrapping between two polls give
no rate spike and no alert.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.agent.credentials import CredentialStore
from gpufleet.agent.daemon import Agent, AgentOptions
from gpufleet.agent.gpu.nvml import NvmlReader
from gpufleet.agent.inventory import inventory_source
from gpufleet.agent.topology.lldp import LldpNeighbors
from gpufleet.client import AgentHttp
from gpufleet.network import snmp
from gpufleet.sim.host import simulated_host
from gpufleet.sim.nvml import SimulatedNvml
from tests.e2e.conftest import ADMIN, Head, cli_json, run_cli, start_sim, stop, wait_for
from tests.network.conftest import Recordings, SnmpAgents, SnmpLink
from tests.services import need

pytestmark = [pytest.mark.e2e, pytest.mark.snmp]

FAST = {"GPUFLEET_SWITCH_POLL_INTERVAL_S": "1", "GPUFLEET_SNMP_TIMEOUT_S": "1", "GPUFLEET_SNMP_RETRIES": "1"}
ARISTA = "arista-dcs-7150s-52-cl"  # snmpsim's community for the recording; registered as arista01
ETHERNET47, ETHERNET48 = 47, 48  # the Arista's ifIndexes; its LLDP-MIB remote row for Ethernet47 is 0.47.2
LLDP_ROW_47 = "0.47.2"
LLDPD = "/usr/sbin/lldpd"
LLDPD_RUN = Path("/run/gpufleet-lldpd-e2e")  # lldpd's unprivileged half must reach its socket and configuration


# -- the head, the switches and what they say --------------------------------------------------------------
@contextlib.contextmanager
def fast_head(tmp_path: Path) -> Iterator[Head]:
    """A head polling its switches every second; stopped afterwards, also when it never became healthy."""
    started = Head(tmp_path, env=FAST).start(wait=False)
    try:
        started.wait_healthy(60)  # a machine busy with other tests can take a while
        yield started
    finally:
        started.kill(signal.SIGTERM)


@pytest.fixture
def head(tmp_path: Path) -> Iterator[Head]:
    with fast_head(tmp_path) as started:
        yield started


def add_switches(head: Head, tmp_path: Path, agents: SnmpAgents) -> None:
    """arista01 (snmpsim, v2c) with the CLI, its community from the environment; linux01 (snmpd, v3 with SHA
    and AES) through the API."""
    added = run_cli(
        tmp_path,
        *("switch", "add", "arista01", agents.host, "--port", str(agents.snmpsim_port)),
        *("--community-env", "E2E_ARISTA_COMMUNITY", "-o", "json"),
        server=head.url,
        env={"E2E_ARISTA_COMMUNITY": ARISTA},
    )
    assert added.returncode == 0, added.stderr
    v3 = agents.v3["sha"]
    head.api(
        "POST",
        "/api/v1/switches",
        json={
            "name": "linux01",
            "address": agents.host,
            "port": agents.snmpd_port,
            "version": "3",
            "v3_user": v3.user,
            "v3_auth_protocol": v3.auth_protocol,
            "v3_auth_key": v3.auth_key,
            "v3_priv_protocol": v3.priv_protocol,
            "v3_priv_key": v3.priv_key,
        },
    )
    assert {s["name"] for s in cli_json(tmp_path, head.url, "switch", "list")} == {"arista01", "linux01"}


def port(head: Head, switch: str, name: str) -> dict[str, Any]:
    """One port of a switch as the API shows it (GET /api/v1/switches/NAME); {} before it was polled."""
    ports = head.api("GET", f"/api/v1/switches/{switch}")["ports"]
    return next((p for p in ports if p["name"] == name), {})


def alerts(head: Head, status: str | None = None) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = head.api("GET", "/api/v1/alerts", params={"status": status} if status else {})
    return found


def port_alerts(head: Head, rule: str, switch: str, port_name: str, status: str = "firing") -> list[dict[str, Any]]:
    return [
        a
        for a in alerts(head, status)
        if a["rule"] == rule and a["labels"].get("switch") == switch and a["labels"].get("port") == port_name
    ]


def metric(head: Head, name: str, switch: str, port_name: str) -> tuple[float, str] | None:
    """A port's sample in the head's /metrics (snmp_exporter's names): its value and its `node` label."""
    response = httpx.get(head.url + "/metrics", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30)
    response.raise_for_status()
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples if family.name == name else []:  # the parser adds _total to a counter's
            if sample.labels.get("switch") == switch and sample.labels["ifName"] == port_name:
                return sample.value, sample.labels["node"]
    return None


def until(head: Head, what: str, predicate: Callable[[], bool], timeout: float = 60) -> None:
    """wait_for, failing with what was awaited, the switches as the head has them, and the head's log.
    (A generous bound: the head polls every second, but a machine busy with other tests is slow.)"""
    try:
        wait_for(predicate, timeout, interval=0.2)
    except AssertionError:
        switches = [
            (s["name"], s["polled_at"], s["last_error"], s["nodes"]) for s in head.api("GET", "/api/v1/switches")
        ]
        pytest.fail(f"{what}: not so within {timeout:g} s; switches {switches}; the head's log ends:\n{head.log()}")


# -- the nodes ------------------------------------------------------------------------------------------------
class NodeAgent:
    """A node's real agent (gpufleet.agent.daemon.Agent, as `gpufleet agent` and the simulator run it) in a
    thread of this test, over a simulated host and NVML, its LLDP neighbours read at each inventory pass by
    the agent's own reader (LldpNeighbors, `lldpctl -u SOCKET -f json`) from an lldpd the test runs. It joins
    with a join token, keeps its channel, and sends its inventory again when it changed (checked each
    second: a neighbour lost or found reaches the head at once)."""

    def __init__(self, server: str, name: str, join_token: str, lldpd_socket: str, state_dir: Path) -> None:
        self.server = server
        self.name = name
        self.join_token = join_token
        self.neighbors = LldpNeighbors(lldpd_socket)
        self.store = CredentialStore(state_dir / f"{name}.credential.json")
        self.error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), name=f"agent-{name}", daemon=True)

    def start(self) -> NodeAgent:
        self._thread.start()
        assert self._started.wait(10), "the agent's event loop did not start"
        return self

    async def _run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        self._started.set()
        nvml = SimulatedNvml(self.name, gpu_count=1)
        read = inventory_source(
            lambda: simulated_host(self.name, 1), [NvmlReader(nvml, source="simulated")], self.neighbors
        )
        options = AgentOptions(server=self.server, name=self.name, join_token=self.join_token, inventory_check_s=1.0)
        async with httpx.AsyncClient() as http:
            agent = Agent(options, self.store, AgentHttp(self.server, http), read)
            running = asyncio.create_task(agent.run())
            stopping = asyncio.create_task(self._stopping.wait())
            await asyncio.wait({running, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if running.done() and not running.cancelled() and running.exception() is not None:
                self.error = running.exception()
            for task in (running, stopping):
                task.cancel()
            await asyncio.gather(running, stopping, return_exceptions=True)

    def stop(self) -> None:
        if self._loop is not None and self._stopping is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join(15)


@dataclass
class Lldpd:
    """One lldpd of the test's: its process and its control socket."""

    proc: subprocess.Popen[bytes]
    socket: str

    def stop(self) -> None:
        stop(self.proc, timeout=5)


def start_lldpd(run_dir: Path, logs: Path, name: str, hostname: str, interface: str, netns: str | None = None) -> Lldpd:
    """lldpd on `interface` only, announcing `hostname`, sending every second; in namespace `netns` if given.
    Port IDs are interface names (`portidsubtype ifname`), as a switch sends them."""
    conf = run_dir / f"{name}.conf"
    conf.write_text(
        f"configure system hostname {hostname}\nconfigure lldp tx-interval 1\nconfigure lldp portidsubtype ifname\n"
    )
    conf.chmod(0o644)
    socket = str(run_dir / f"{name}.sock")
    command = [LLDPD, "-d", "-u", socket, "-O", str(conf), "-I", interface]
    if netns is not None:
        command = ["ip", "netns", "exec", netns, *command]
    with (logs / f"lldpd-{name}.log").open("wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    return Lldpd(proc, socket)


@pytest.fixture
def cabled(snmpd_link: SnmpLink, snmp_agents: SnmpAgents, tmp_path: Path) -> Iterator[Lldpd]:
    """An lldpd at each end of snmpd's veth pair: on snmpd's end, announcing snmpd's sysName with the port's
    name as its port ID (as a switch's LLDP does); on the far end (the node's port, in its namespace), the
    node's own. Yields the node's lldpd once it hears the switch's."""
    if os.geteuid() != 0 or not os.access(LLDPD, os.X_OK):
        need("lldpd", "an lldpd at each end of snmpd's veth pair needs lldpd and root")
    run_dir = LLDPD_RUN / snmpd_link.name
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    for directory in (LLDPD_RUN, run_dir):
        directory.chmod(0o755)
    switch_side = start_lldpd(run_dir, tmp_path, "switch", "gpufleet-snmpd", snmpd_link.name)
    node_side = start_lldpd(run_dir, tmp_path, "node", "gpu002", snmpd_link.peer, netns=snmpd_link.netns)
    try:
        reader = LldpNeighbors(node_side.socket)
        heard = [(snmpd_link.peer, "gpufleet-snmpd", snmpd_link.name)]
        wait_for(lambda: [(n.local_interface, n.system_name, n.port_id) for n in reader.read()] == heard, 20, 0.2)
        yield node_side
    finally:
        node_side.stop()
        switch_side.stop()
        shutil.rmtree(run_dir, ignore_errors=True)
        with contextlib.suppress(OSError):
            LLDPD_RUN.rmdir()  # unless another worker's is there


@pytest.fixture
def gpu002(head: Head, cabled: Lldpd, tmp_path: Path) -> Iterator[NodeAgent]:
    """The node behind snmpd's port: its agent reports what its lldpd hears."""
    agent = NodeAgent(head.url, "gpu002", head.join_token(1), cabled.socket, tmp_path).start()
    try:
        until(
            head,
            "gpu002 joined and up",
            lambda: any(n["name"] == "gpu002" and n["state"] == "up" for n in head.nodes()),
        )
        yield agent
    finally:
        agent.stop()
    assert agent.error is None, f"the agent of gpu002 stopped: {agent.error!r}"


@pytest.fixture
def gpu001(head: Head, tmp_path: Path) -> Iterator[str]:
    """A simulated node, gpu001 (`gpufleet sim --prefix gpu`)."""
    sim = start_sim(tmp_path, head.url, head.join_token(1), 1, "--prefix", "gpu", "--gpus-per-node", "1")
    try:
        until(
            head,
            "gpu001 joined and up",
            lambda: any(n["name"] == "gpu001" and n["state"] == "up" for n in head.nodes()),
        )
        yield "gpu001"
    finally:
        stop(sim, signal.SIGINT)


def cable_gpu001_to_ethernet47(recordings: Recordings) -> None:
    """The Arista's LLDP-MIB says who is on Ethernet47: gpu001's eth0 (what gpu001's lldpd would announce),
    in place of the recording's neighbour switch."""
    recordings.set(
        ARISTA,
        {
            f"{snmp.LLDP_REM_SYS_NAME}.{LLDP_ROW_47}": b"gpu001".hex(),  # recorded as hex (its tag is 4x)
            f"{snmp.LLDP_REM_PORT_ID}.{LLDP_ROW_47}": "eth0",  # subtype 5: an interface name
        },
    )


# -- the tests ------------------------------------------------------------------------------------------------
def test_a_port_taken_down_fires_switch_port_down_naming_switch_port_and_node(
    head: Head, tmp_path: Path, snmp_agents: SnmpAgents, snmpd_link: SnmpLink, gpu002: NodeAgent
) -> None:
    link = snmpd_link
    add_switches(head, tmp_path, snmp_agents)

    def up_with_gpu002_behind() -> bool:
        found = port(head, "linux01", link.name)
        return found.get("oper_up") is True and found.get("node") == "gpu002"

    until(head, f"linux01 {link.name} up with gpu002 behind it", up_with_gpu002_behind)
    assert port(head, "linux01", link.name)["node_interface"] == link.peer
    (plugged,) = head.api("GET", "/api/v1/nodes/gpu002/links")
    assert (plugged["interface"], plugged["switch"], plugged["switch_port"]) == (link.peer, "linux01", link.name)
    assert "node" in plugged["seen_by"]  # gpu002's own lldpd said so
    assert port_alerts(head, "SwitchPortDown", "linux01", link.name) == []

    link.set_peer(up=False)  # the cable pulled at the node's end
    until(head, "SwitchPortDown firing", lambda: bool(port_alerts(head, "SwitchPortDown", "linux01", link.name)))
    (alert,) = port_alerts(head, "SwitchPortDown", "linux01", link.name)
    assert alert["node_name"] == "linux01"
    assert alert["labels"]["behind"] == "gpu002"
    assert alert["summary"] == f"switch linux01 port {link.name} (node gpu002 {link.peer}) went down"
    firing = cli_json(tmp_path, head.url, "alert", "list", "--status", "firing")
    assert ("SwitchPortDown", "linux01", link.name, "gpu002") in {
        (a["rule"], a["node_name"], a["labels"].get("port"), a["labels"].get("behind")) for a in firing
    }
    # The node's lldpd no longer hears the switch, and its agent said so; the port, down, still names it.
    until(head, "gpu002's lldpd forgot the switch", lambda: gpu002.neighbors.read() == [])

    def said_by_the_switch_only() -> bool:
        return ["node" in k["seen_by"] for k in head.api("GET", "/api/v1/nodes/gpu002/links")] == [False]

    until(head, "gpu002's inventory without the neighbour", said_by_the_switch_only)
    down = port(head, "linux01", link.name)
    assert (down["oper_up"], down["admin_up"], down["node"]) == (False, True, "gpu002")

    link.set_peer(up=True)
    until(head, "SwitchPortDown resolved", lambda: not port_alerts(head, "SwitchPortDown", "linux01", link.name))
    assert [a["labels"]["behind"] for a in port_alerts(head, "SwitchPortDown", "linux01", link.name, "resolved")] == [
        "gpu002"
    ]


def test_errors_rising_on_a_port_fire_switch_port_errors_naming_switch_port_and_node(
    head: Head, tmp_path: Path, snmp_agents: SnmpAgents, snmpsim_recordings: Recordings, gpu001: str
) -> None:
    cable_gpu001_to_ethernet47(snmpsim_recordings)
    add_switches(head, tmp_path, snmp_agents)
    # Two polls at least (a rate needs two), gpu001 found behind Ethernet47 by the switch's own LLDP.

    def polled_twice_with_gpu001_behind() -> bool:
        found = port(head, "arista01", "Ethernet47")
        return found.get("node") == "gpu001" and "in_errors_per_s" in found.get("rates", {})

    until(head, "arista01 Ethernet47 polled twice, gpu001 behind it", polled_twice_with_gpu001_behind)
    ethernet47 = port(head, "arista01", "Ethernet47")
    assert (ethernet47["oper_up"], ethernet47["node_interface"], ethernet47["neighbor_system"]) == (
        True,
        "eth0",
        "gpu001",
    )
    assert ethernet47["rates"]["in_errors_per_s"] == 0.0
    assert [a for a in alerts(head) if a["labels"].get("switch") == "arista01" and "port" in a["labels"]] == []

    snmpsim_recordings.set(ARISTA, {f"{snmp.IF_IN_ERRORS}.{ETHERNET47}": 120})  # recorded: 0
    until(
        head, "SwitchPortErrors firing", lambda: bool(port_alerts(head, "SwitchPortErrors", "arista01", "Ethernet47"))
    )
    (alert,) = port_alerts(head, "SwitchPortErrors", "arista01", "Ethernet47")
    assert (alert["node_name"], alert["labels"]["behind"]) == ("arista01", "gpu001")
    assert alert["summary"].startswith("switch arista01 port Ethernet47 (node gpu001 eth0): errors rising, ")
    firing = cli_json(tmp_path, head.url, "alert", "list", "--status", "firing")
    assert ("SwitchPortErrors", "arista01", "Ethernet47", "gpu001") in {
        (a["rule"], a["node_name"], a["labels"].get("port"), a["labels"].get("behind")) for a in firing
    }
    assert metric(head, "ifInErrors", "arista01", "Ethernet47") == (120.0, "gpu001")
    # Only that port: its neighbour Ethernet48, whose counters did not move, fired nothing.
    assert port_alerts(head, "SwitchPortErrors", "arista01", "Ethernet48") == []


def test_counters_wrapping_between_polls_give_no_spike_and_no_alert(
    head: Head, tmp_path: Path, snmp_agents: SnmpAgents, snmpsim_recordings: Recordings
) -> None:
    # Before the switch is registered (so no poll sees these values arrive): Ethernet47's 64-bit
    # ifHCInOctets 1,000 short of its end; Ethernet48 a port with 32-bit counters only (its HC columns
    # taken away, as on a switch without them), ifInOctets 1,000 short of 2^32, and 5,000 errors counted.
    snmpsim_recordings.set(
        ARISTA,
        {
            f"{snmp.IF_HC_IN_OCTETS}.{ETHERNET47}": 2**64 - 1_000,
            f"{snmp.IF_HC_IN_OCTETS}.{ETHERNET48}": None,
            f"{snmp.IF_HC_OUT_OCTETS}.{ETHERNET48}": None,
            f"{snmp.IF_IN_OCTETS}.{ETHERNET48}": 2**32 - 1_000,
            f"{snmp.IF_IN_ERRORS}.{ETHERNET48}": 5_000,
        },
    )
    add_switches(head, tmp_path, snmp_agents)
    until(
        head,
        "Ethernet47 and Ethernet48 polled twice",
        lambda: all("in_bps" in port(head, "arista01", name).get("rates", {}) for name in ("Ethernet47", "Ethernet48")),
    )
    assert metric(head, "ifHCInOctets", "arista01", "Ethernet47") == (float(2**64 - 1_000), "")
    assert metric(head, "ifInOctets", "arista01", "Ethernet48") == (float(2**32 - 1_000), "")  # 32-bit, so named

    # Between two polls: 5,000 octets later both octet counters are past their end, at 4,000; the errors
    # counter went back to 0 (cleared, as `clear counters` does).
    snmpsim_recordings.set(
        ARISTA,
        {
            f"{snmp.IF_HC_IN_OCTETS}.{ETHERNET47}": 4_000,
            f"{snmp.IF_IN_OCTETS}.{ETHERNET48}": 4_000,
            f"{snmp.IF_IN_ERRORS}.{ETHERNET48}": 0,
        },
    )
    seen: dict[str, list[dict[str, float]]] = {"Ethernet47": [], "Ethernet48": []}

    def both_wraps_polled() -> bool:
        for name, rates in seen.items():
            rates.append(port(head, "arista01", name)["rates"])
        wrapped32 = any(r.get("in_bps", 0) > 0 for r in seen["Ethernet48"])
        went_back64 = any("out_bps" in r and "in_bps" not in r for r in seen["Ethernet47"])
        return wrapped32 and went_back64

    until(head, "the polls across both wraps", both_wraps_polled)
    until(head, "the polls after them", lambda: metric(head, "ifInOctets", "arista01", "Ethernet48") == (4_000.0, ""))
    # The 32-bit counter's wrap is its true growth, 5,000 octets over the interval of about a second
    # (a wrap read as a fall, or as 2^32 - 5,000 octets, would be tens of Gb/s on this 10 Gb/s port).
    wrapped = [r["in_bps"] for r in seen["Ethernet48"] if r.get("in_bps", 0) > 0]
    assert all(5_000 * 8 / 10 < bps < 5_000 * 8 / 0.2 for bps in wrapped), wrapped
    # The 64-bit counter going back cannot be a wrap (2^64 octets take years at any speed): that interval
    # has no inbound rate at all, and no poll shows any.
    assert all(r.get("in_bps", 0) == 0 for r in seen["Ethernet47"]), seen["Ethernet47"]
    # Cleared errors are no errors: no rate rose, no alert fired (or fired and resolved) for either port.
    assert all(r.get("in_errors_per_s", 0) == 0 for rates in seen.values() for r in rates)
    assert metric(head, "ifHCInOctets", "arista01", "Ethernet47") == (4_000.0, "")
    touched = [a for a in alerts(head) if a["labels"].get("port") in ("Ethernet47", "Ethernet48")]
    assert touched == []
