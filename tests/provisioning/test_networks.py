"""Networks and node addresses on both backends, and the dnsmasq configuration rendered from them,
checked by the real dnsmasq (`dnsmasq --test`)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.core.clock import FakeClock
from gpufleet.core.db import transaction
from gpufleet.core.errors import Conflict, InvalidInput, NotFound
from gpufleet.inventory import service as inventory
from gpufleet.inventory.schemas import NodeSettings
from gpufleet.provisioning import networks
from gpufleet.provisioning.dhcp import render_dnsmasq
from gpufleet.provisioning.networks import NetworkSpec
from tests.services import install_tools

INTERNAL = NetworkSpec(
    "internal",
    "10.141.0.0/16",
    "10.141.0.1",
    "10.141.0.70",
    gateway="10.141.255.254",
    domain="cluster.local",
    boot_server="10.141.0.1",
    boot_file="gpufleet.ipxe",
)


def dnsmasq() -> str:
    """Debian's dnsmasq, installed by scripts/services/dnsmasq.sh where it is missing and we are root."""
    return install_tools(("dnsmasq",), "dnsmasq.sh")["dnsmasq"]


def add(
    sessions: sessionmaker[Session], clock: FakeClock, expression: str, network: str = "internal"
) -> dict[str, str]:
    with transaction(sessions) as s:
        nodes = inventory.add_nodes(s, clock, [expression], NodeSettings(category="hgx"))
        rows = networks.assign(s, nodes, networks.get_network(s, network))
        names = {n.id: n.name for n in nodes}
        return {names[r.node_id]: r.address for r in rows}


@pytest.fixture
def internal(sessions: sessionmaker[Session]) -> sessionmaker[Session]:
    with transaction(sessions) as s:
        networks.create_network(s, INTERNAL)
    return sessions


def test_sixty_four_nodes_get_sixty_four_distinct_addresses_in_name_order(
    internal: sessionmaker[Session], clock: FakeClock
) -> None:
    given = add(internal, clock, "node[001-064]")
    assert len(given) == 64
    assert len(set(given.values())) == 64
    # 10.141.0.1 is the boot server: never handed out
    assert (given["node001"], given["node002"], given["node064"]) == ("10.141.0.2", "10.141.0.3", "10.141.0.65")
    more = add(internal, clock, "node[065-069]")
    assert sorted(more.values()) == [f"10.141.0.{i}" for i in range(66, 71)]
    assert not set(more.values()) & set(given.values())


def test_a_request_larger_than_the_free_range_changes_nothing(
    internal: sessionmaker[Session], clock: FakeClock
) -> None:
    add(internal, clock, "node[001-060]")
    with pytest.raises(Conflict, match="has 9 free addresses"):
        add(internal, clock, "big[01-10]")
    with transaction(internal, readonly=True) as s:
        assert networks.free_count(s, networks.get_network(s, "internal")) == 9
        assert [n.name for n in inventory.list_nodes(s, ["big[01-10]"])] == []  # the nodes were not added either


def test_bad_networks_are_refused_with_the_reason(sessions: sessionmaker[Session]) -> None:
    cases = [
        (NetworkSpec("x", "10.0.0.0/33"), "cidr must be"),
        (NetworkSpec("x", "10.0.0.1/24"), "cidr must be"),  # host bits set
        (NetworkSpec("x", "10.0.0.0/24", "10.0.1.5"), "not a usable address"),
        (NetworkSpec("x", "10.0.0.0/24", "10.0.0.50", "10.0.0.40"), "its end is before its start"),
        (NetworkSpec("x", "10.0.0.0/24", gateway="192.168.0.1"), "outside 10.0.0.0/24"),
        (NetworkSpec("Bad Name", "10.0.0.0/24"), "lower-case letters"),
        (NetworkSpec("x\n", "10.0.0.0/24"), "lower-case letters"),  # a tag in dnsmasq's file: one line
        # Both land in dnsmasq's configuration, and the boot file names a file under the TFTP root.
        (NetworkSpec("x", "10.0.0.0/24", domain="cluster.local\ndhcp-boot=evil"), "domain must be a DNS name"),
        (NetworkSpec("x", "10.0.0.0/24", boot_file="../../etc/x.ipxe"), "boot file must be a path under"),
        (NetworkSpec("x", "10.0.0.0/24", boot_file="/srv/tftp/x.ipxe"), "boot file must be a path under"),
    ]
    with transaction(sessions) as s:
        for spec, message in cases:
            with pytest.raises(InvalidInput, match=message):
                networks.create_network(s, spec)
        networks.create_network(s, NetworkSpec("x", "10.0.0.0/24"))
        with pytest.raises(Conflict):
            networks.create_network(s, NetworkSpec("x", "10.1.0.0/24"))


def test_macs_are_normalized_unique_and_need_an_address(internal: sessionmaker[Session], clock: FakeClock) -> None:
    add(internal, clock, "node[001-002]")
    with transaction(internal) as s:
        net = networks.get_network(s, "internal")
        node1, node2 = inventory.get_node(s, "node001"), inventory.get_node(s, "node002")
        assert networks.set_mac(s, node1, net, "52-54-00-AA-BB-01", "eno1").mac == "52:54:00:aa:bb:01"
        with pytest.raises(Conflict):
            networks.set_mac(s, node2, net, "52:54:00:aa:bb:01")
        with pytest.raises(InvalidInput):
            networks.set_mac(s, node2, net, "52:54:00:aa:bb")
        other = networks.create_network(s, NetworkSpec("ipmi", "10.142.0.0/24"))
        with pytest.raises(NotFound):
            networks.set_mac(s, node2, other, "52:54:00:aa:bb:02")


def render(sessions: sessionmaker[Session]) -> str:
    with transaction(sessions, readonly=True) as s:
        return render_dnsmasq(networks.boot_plan(s), tftp_root="/var/lib/gpufleet/tftp")


@pytest.mark.dnsmasq
def test_the_dhcp_config_of_sixty_four_nodes_is_accepted_by_dnsmasq(
    internal: sessionmaker[Session], clock: FakeClock, tmp_path: Path
) -> None:
    add(internal, clock, "node[001-064]")
    with transaction(internal) as s:
        net = networks.get_network(s, "internal")
        for i, node in enumerate(inventory.list_nodes(s, ["node[001-064]"]), start=1):
            networks.set_mac(s, node, net, f"52:54:00:aa:{i // 256:02x}:{i % 256:02x}")
        networks.create_network(s, NetworkSpec("ipmi", "10.142.0.0/24", gateway="10.142.0.254"))
    text = render(internal)
    assert text.count("dhcp-host=") == 64
    assert "dhcp-host=52:54:00:aa:00:01,set:internal,10.141.0.2,node001" in text
    assert "dhcp-boot=tag:internal,gpufleet.ipxe,,10.141.0.1" in text
    assert "dhcp-range=set:ipmi,10.142.0.0,static,255.255.255.0,12h" in text
    conf = tmp_path / "gpufleet.conf"
    conf.write_text(text)
    checked = subprocess.run(
        [dnsmasq(), "--test", f"--conf-file={conf}"], capture_output=True, text=True, timeout=30, check=False
    )
    assert checked.returncode == 0, checked.stderr
    assert "syntax check OK" in checked.stderr
    broken = tmp_path / "broken.conf"
    broken.write_text(
        text.replace("dhcp-range=set:internal,10.141.0.0,static", "dhcp-range=set:internal,10.141.0.0,nonsense")
    )
    refused = subprocess.run(
        [dnsmasq(), "--test", f"--conf-file={broken}"], capture_output=True, text=True, timeout=30, check=False
    )
    assert refused.returncode != 0  # the check can fail: dnsmasq really reads the file


def test_a_node_without_a_mac_is_listed_not_leased(internal: sessionmaker[Session], clock: FakeClock) -> None:
    add(internal, clock, "node001")
    text = render(internal)
    assert "dhcp-host=" not in text
    assert "# node001 10.141.0.2: no MAC recorded yet" in text


def test_a_nodes_boot_address_is_on_the_network_that_boots_it(
    sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    """One rule for image sync and Ansible: a network with a boot server or file first, then an
    interface named "boot", then the first network by name."""
    with transaction(sessions) as s:
        nodes = inventory.add_nodes(s, clock, ["n[1-3]"], NodeSettings())
        bmc = networks.create_network(s, NetworkSpec("bmc", "10.140.0.0/24"))
        data = networks.create_network(s, NetworkSpec("data", "10.150.0.0/24"))
        prov = networks.create_network(s, NetworkSpec("prov", "10.141.0.0/24", boot_server="10.141.0.1"))
        networks.assign(s, nodes, bmc, interface="ipmi")
        networks.assign(s, nodes[1:], data, interface="boot")
        networks.assign(s, nodes[2:], prov, interface="eno1")
        found = networks.boot_addresses(s)
        ids = {n.name: n.id for n in nodes}
        assert {name: found[i] for name, i in ids.items()} == {
            "n1": "10.140.0.2",  # its only network
            "n2": "10.150.0.2",  # the interface named boot
            "n3": "10.141.0.2",  # the network that boots nodes wins
        }
        assert networks.boot_addresses(s, [ids["n2"]]) == {ids["n2"]: "10.150.0.2"}
