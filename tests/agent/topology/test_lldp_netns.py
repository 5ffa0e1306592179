"""The agent's LLDP reader against real lldpds in network namespaces (conftest.lldp_lab): each node reports the
switch's chassis name and the switch port its own interface is cabled to, the switch reports the nodes on its
ports, a cable pulled drops the neighbour, and an lldpd that is not there means no neighbours, not an error."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable

import pytest

from gpufleet.agent.gpu.nvml import NvmlReader
from gpufleet.agent.inventory import inventory_source
from gpufleet.agent.topology.lldp import LldpNeighbors
from gpufleet.protocol.inventory import NodeInventory
from gpufleet.protocol.topology import LinkNeighbor
from gpufleet.sim.host import simulated_host
from gpufleet.sim.nvml import SimulatedNvml
from tests.agent.topology.conftest import LldpLab
from tests.services import require_tool

pytestmark = pytest.mark.lldp


def _links(neighbors: list[LinkNeighbor]) -> list[tuple[str, str | None, str | None]]:
    return [(n.local_interface, n.system_name, n.port_name()) for n in neighbors]


def _until(read: Callable[[], list[LinkNeighbor]], done: Callable[[list[LinkNeighbor]], bool]) -> list[LinkNeighbor]:
    """Read until `done` holds (lldpd sends every second and forgets a neighbour whose TTL ran out), 15 s at most."""
    deadline = time.monotonic() + 15
    while True:
        found = read()
        if done(found) or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def test_each_node_reports_the_switch_port_it_is_cabled_to(lldp_lab: LldpLab) -> None:
    node1 = LldpNeighbors(lldp_lab.node1.socket).read()
    assert _links(node1) == [("eth0", "leaf01", "swp1"), ("eth1", "leaf01", "swp3")]
    assert [(n.port_id_type, n.port_description, n.chassis_id_type) for n in node1] == [
        ("ifname", "gpu001:eth0", "mac"),
        ("ifname", "gpu001:eth1", "mac"),
    ]
    assert node1[0].chassis_id == node1[1].chassis_id  # one switch
    assert "10.233.0.1" in node1[0].management_addresses
    assert _links(LldpNeighbors(lldp_lab.node2.socket).read()) == [("eth0", "leaf01", "swp2")]
    assert lldp_lab.cables == {"gpu001:eth0": "leaf01:swp1", "gpu002:eth0": "leaf01:swp2", "gpu001:eth1": "leaf01:swp3"}


def test_the_switch_reports_the_node_on_each_port(lldp_lab: LldpLab) -> None:
    assert _links(LldpNeighbors(lldp_lab.switch.socket).read()) == [
        ("swp1", "gpu001", "eth0"),  # a Linux host sends its MAC as port ID, its interface as description
        ("swp2", "gpu002", "eth0"),
        ("swp3", "gpu001", "eth1"),
    ]


def test_the_node_inventory_carries_them(lldp_lab: LldpLab) -> None:
    nvml = SimulatedNvml("gpu001", gpu_count=1)
    read = inventory_source(
        lambda: simulated_host("gpu001", 1),
        [NvmlReader(nvml, source="simulated")],
        LldpNeighbors(lldp_lab.node1.socket),
    )
    inventory = read()
    assert NodeInventory.model_validate_json(inventory.model_dump_json()) == inventory
    assert _links(inventory.neighbors) == [("eth0", "leaf01", "swp1"), ("eth1", "leaf01", "swp3")]


def test_a_pulled_cable_drops_the_neighbour(lldp_lab: LldpLab) -> None:
    require_tool("ip")
    reader = LldpNeighbors(lldp_lab.node2.socket)
    down = ["ip", "-n", lldp_lab.switch.namespace, "link", "set", "swp2", "down"]
    up = ["ip", "-n", lldp_lab.switch.namespace, "link", "set", "swp2", "up"]
    subprocess.run(down, check=True, timeout=10)
    try:
        assert _until(reader.read, lambda found: not found) == []  # the carrier is gone on node2's eth0
    finally:
        subprocess.run(up, check=True, timeout=10)
    assert _links(_until(reader.read, bool)) == [("eth0", "leaf01", "swp2")]


def test_no_lldpd_on_the_socket_is_no_neighbours(lldp_lab: LldpLab, caplog: pytest.LogCaptureFixture) -> None:
    reader = LldpNeighbors(lldp_lab.node1.socket + ".absent")
    with caplog.at_level("INFO", logger="gpufleet.agent.topology.lldp"):
        assert reader.read() == []
        assert reader.read() == []
    said = [r.getMessage() for r in caplog.records if r.levelname == "INFO"]
    assert len(said) == 1
    assert "unable to connect to socket" in said[0]
    assert "is lldpd running?" in said[0]
