"""Issue 26's must-show for the topology, with real processes and real LLDP: the lab of conftest.lldp_lab
(Debian's lldpd in network namespaces: switch leaf01 with bridge ports swp1-swp3; gpu001's eth0 cabled to swp1
and its eth1 to swp3, gpu002's eth0 to swp2). Each node's real agent reads its neighbours from its own lldpd
with the agent's LLDP reader and sends them in its inventory to a real head; leaf01 answers SNMP for its own
ports (Debian's snmpd run in the switch's namespace, reached over a management veth pair), and the head polls
it. The head's node page and links API, and the switch's page and API, say which node port is on which switch
port: eth0 on swp1 and eth1 on swp3 for gpu001, eth0 on swp2 for gpu002.
"""

from __future__ import annotations

import html
import os
import re
import secrets
import subprocess
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpufleet.api.deps import SESSION_COOKIE
from gpufleet.core.errors import GpufleetError
from gpufleet.network import snmp
from gpufleet.network.snmp import SnmpCredential, SnmpTarget
from tests.agent.topology.conftest import LldpLab
from tests.e2e.conftest import Head, run_cli, stop, wait_for
from tests.network.test_switches_e2e import NodeAgent, fast_head, until
from tests.services import find_tool, need

pytestmark = [pytest.mark.lldp, pytest.mark.e2e]

PASSWORD = "correct horse battery"
SWITCH_PORTS = {"swp1", "swp2", "swp3"}


@dataclass(frozen=True)
class SwitchSnmp:
    """Where leaf01's snmpd answers, and its v2c community."""

    address: str
    community: str


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, timeout=30, capture_output=True)


@pytest.fixture
def leaf01_snmp(lldp_lab: LldpLab, tmp_path: Path) -> Iterator[SwitchSnmp]:
    """snmpd in leaf01's namespace (so it counts swp1-swp3), sysName leaf01, listening on a management veth
    pair whose other end is here; the pair is deleted afterwards."""
    daemon = find_tool("snmpd")
    if daemon is None or os.geteuid() != 0:
        need("snmpd in the switch's namespace", "needs Debian's snmpd (scripts/services/snmp.sh install) and root")
    assert daemon is not None
    tag = lldp_lab.service_env["GPUFLEET_LLDP_TAG"]
    worker = re.sub(r"\D", "", tag)  # the tag is gfl<xdist worker index>: one subnet per worker
    net = f"10.234.{int(worker) % 256 if worker else zlib.crc32(tag.encode()) % 256}"
    here, there = f"{tag}mgmt", f"{tag}mgmts"
    namespace = lldp_lab.switch.namespace
    subprocess.run(["ip", "link", "del", here], capture_output=True, timeout=30, check=False)  # a dead run's
    community = f"gf-{secrets.token_hex(8)}"
    conf = tmp_path / "leaf01-snmpd.conf"
    conf.write_text(f"sysName leaf01\nsysLocation gpufleet tests\nrocommunity {community} {net}.0/30\n")
    proc = None
    try:
        _ip("link", "add", here, "type", "veth", "peer", "name", there)
        _ip("link", "set", there, "netns", namespace)
        _ip("-n", namespace, "link", "set", there, "name", "mgmt0")
        _ip("addr", "add", f"{net}.1/30", "dev", here)
        _ip("link", "set", here, "up")
        _ip("-n", namespace, "addr", "add", f"{net}.2/30", "dev", "mgmt0")
        _ip("-n", namespace, "link", "set", "mgmt0", "up")
        (tmp_path / "snmpd-persist").mkdir()
        log, listen = tmp_path / "leaf01-snmpd.log", f"udp:{net}.2:161"
        proc = subprocess.Popen(
            [*("ip", "netns", "exec", namespace, daemon, "-f", "-C", "-c", str(conf)), "-Lf", str(log), listen],
            env={**os.environ, "SNMP_PERSISTENT_DIR": str(tmp_path / "snmpd-persist")},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        target = SnmpTarget(f"{net}.2", 161, SnmpCredential("2c", community=community), timeout_s=0.5, retries=0)

        def answers() -> bool:
            try:
                return {p.name for p in snmp.poll(target).ports} >= SWITCH_PORTS
            except GpufleetError:
                return False

        wait_for(answers, 20, interval=0.2)
        yield SwitchSnmp(f"{net}.2", community)
    finally:
        if proc is not None:
            stop(proc, timeout=5)
        subprocess.run(["ip", "link", "del", here], capture_output=True, timeout=30, check=False)


@pytest.fixture
def head(tmp_path: Path) -> Iterator[Head]:
    """A head polling its switches every second."""
    with fast_head(tmp_path) as started:
        yield started


def browser(head: Head) -> httpx.Client:
    """A browser logged in to the head's dashboard as a new viewer (its form's CSRF value, its session cookie)."""
    head.api("POST", "/api/v1/users", json={"username": "vera", "role": "viewer", "password": PASSWORD})
    client = httpx.Client(base_url=head.url, timeout=30, follow_redirects=True)
    found = re.search(r'name="csrf" value="([^"]+)"', client.get("/login").text)
    assert found is not None
    answer = client.post("/login", data={"username": "vera", "password": PASSWORD, "csrf": found.group(1)})
    assert (answer.status_code, answer.url.path) == (200, "/"), answer.text[-2000:]
    assert client.cookies.get(SESSION_COOKIE)
    return client


def text(fragment: str) -> str:
    """What a piece of a page reads as: tags dropped, entities read, spaces collapsed."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", fragment)).split())


def links(head: Head, node: str) -> list[tuple[Any, ...]]:
    """A node's links from the API: (its interface, switch, switch port, whether its own lldpd said so)."""
    return [
        (k["interface"], k["switch"], k["switch_port"], "node" in k["seen_by"])
        for k in head.api("GET", f"/api/v1/nodes/{node}/links")
    ]


def test_the_node_and_switch_pages_say_which_node_port_is_on_which_switch_port(
    head: Head, tmp_path: Path, lldp_lab: LldpLab, leaf01_snmp: SwitchSnmp
) -> None:
    agents = [
        NodeAgent(head.url, node.name, head.join_token(1), node.socket, tmp_path)
        for node in (lldp_lab.node1, lldp_lab.node2)
    ]
    try:
        for agent in agents:
            agent.start()
        until(
            head,
            "gpu001 and gpu002 up",
            lambda: {n["name"] for n in head.nodes() if n["state"] == "up"} == {"gpu001", "gpu002"},
        )
        added = run_cli(
            tmp_path,
            *("switch", "add", "leaf01", leaf01_snmp.address, "--community-stdin"),
            server=head.url,
            stdin=leaf01_snmp.community + "\n",
        )
        assert added.returncode == 0, added.stderr

        # The API: the switch's ports, each with the node and node port behind it (as the nodes' lldpds
        # name leaf01 and its port), once leaf01 was polled and both inventories arrived.
        def behind() -> dict[str, tuple[Any, ...]]:
            ports = head.api("GET", "/api/v1/switches/leaf01")["ports"]
            return {
                p["name"]: (p["oper_up"], p["node"], p["node_interface"]) for p in ports if p["name"] in SWITCH_PORTS
            }

        cabling = {"swp1": (True, "gpu001", "eth0"), "swp2": (True, "gpu002", "eth0"), "swp3": (True, "gpu001", "eth1")}
        until(head, "leaf01's ports with the nodes behind them", lambda: behind() == cabling)
        leaf01 = head.api("GET", "/api/v1/switches/leaf01")
        assert (leaf01["sys_name"], leaf01["nodes"]) == ("leaf01", 2)
        # And each node's links: one per node port, the switch's port table and the node's lldpd agreeing.
        assert links(head, "gpu001") == [("eth0", "leaf01", "swp1", True), ("eth1", "leaf01", "swp3", True)]
        assert links(head, "gpu002") == [("eth0", "leaf01", "swp2", True)]
        assert head.api("GET", "/api/v1/nodes/gpu001")["labels"]["switch"] == "leaf01"  # the scheduler's label

        # The dashboard, logged in: the node's page and the switch's page.
        web = browser(head)
        node_page = web.get("/nodes/gpu001")
        assert node_page.status_code == 200
        found = re.search(r'<dd id="links">(.*?)</dd>', node_page.text, re.S)
        assert found is not None, node_page.text[-2000:]
        shown_links = [text(line) for line in found.group(1).split("<br>")]
        assert [line.split(" (", 1)[0] for line in shown_links] == ["eth0 → leaf01 swp1", "eth1 → leaf01 swp3"]
        assert all(line.endswith("node)") for line in shown_links), shown_links  # "(LLDP of the ... node)"
        assert found.group(1).count('href="/switches/leaf01"') == 2

        switch_page = web.get("/switches/leaf01")
        assert switch_page.status_code == 200
        rows = re.findall(
            r'<tr id="port-\d+" data-port="([^"]+)" data-state="([^"]+)" data-node="([^"]*)">(.*?)</tr>',
            switch_page.text,
            re.S,
        )
        shown = {port: (state, node, text(row)) for port, state, node, row in rows if port in SWITCH_PORTS}
        assert {port: (state, node) for port, (state, node, _row) in shown.items()} == {
            "swp1": ("up", "gpu001"),
            "swp2": ("up", "gpu002"),
            "swp3": ("up", "gpu001"),
        }
        assert "gpu001 eth0" in shown["swp1"][2]
        assert "gpu002 eth0" in shown["swp2"][2]
        assert "gpu001 eth1" in shown["swp3"][2]
        assert 'href="/nodes/gpu001"' in switch_page.text
        # And the state of the node behind each port, in the API and as the page's last column.
        node_states = {
            p["name"]: (p["node_state"], p["node_health"])
            for p in head.api("GET", "/api/v1/switches/leaf01")["ports"]
            if p["name"] in SWITCH_PORTS
        }
        assert {name: state for name, (state, _health) in node_states.items()} == dict.fromkeys(SWITCH_PORTS, "up")
        for port, _state, _node, row in rows:
            if port in SWITCH_PORTS:
                state, health = node_states[port]
                last_cell = text(re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)[-1])
                assert last_cell == (state if health in (None, "unknown") else f"{state}, {health}")
        web.close()
    finally:
        for agent in agents:
            agent.stop()
    assert [agent.error for agent in agents] == [None, None]
