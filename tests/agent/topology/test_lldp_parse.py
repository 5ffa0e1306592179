"""`lldpctl -f json` into LinkNeighbors, on real outputs (tests/fixtures/topology, SOURCES.md): lldpd 1.0.16
in network namespaces (one interface, several, two neighbours on one port, a neighbour without a system
name, json0) and Cumulus 3.7.12's json0 (suzieq's test data); then the shapes only older lldpd versions
write, and running lldpctl: missing, lldpd down, hanging, garbage, logged once."""

from __future__ import annotations

import json
import logging
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from gpufleet.agent.topology.lldp import LldpNeighbors, LldpParseError, parse_lldpctl_json
from gpufleet.protocol.topology import MAX_NEIGHBORS

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "topology"


def _parse(name: str) -> list[dict[str, object]]:
    return [n.model_dump(exclude_defaults=True) for n in parse_lldpctl_json((FIXTURES / name).read_text())]


def test_a_node_hears_its_switch_port() -> None:
    """One interface: lldpctl writes it as an object, the chassis keyed by its name."""
    assert _parse("lldpctl-1.0.16-netns-node.json") == [
        {
            "local_interface": "eth0",
            "chassis_id": "0e:9a:0b:da:31:77",
            "chassis_id_type": "mac",
            "system_name": "leaf01.example.net",
            "system_description": (
                "Debian GNU/Linux 12 (bookworm) Linux 6.18.44-fc-v1300 #1 SMP PREEMPT_DYNAMIC @0 x86_64"
            ),
            "port_id": "swp1",
            "port_id_type": "ifname",
            "port_description": "to node1",
            "management_addresses": ["10.232.0.1", "fe80::14cc:4fff:fe48:5e93"],
        }
    ]


def test_json0_says_the_same() -> None:
    assert _parse("lldpctl-1.0.16-netns-node.json0") == _parse("lldpctl-1.0.16-netns-node.json")


def test_a_switch_hears_each_node_on_its_own_port() -> None:
    """Several interfaces: a list of one-key objects. Linux hosts send their MAC as port ID."""
    found = parse_lldpctl_json((FIXTURES / "lldpctl-1.0.16-netns-switch.json").read_text())
    assert [(n.local_interface, n.system_name, n.port_id_type, n.port_name()) for n in found] == [
        ("swp1", "gpu-n1", "mac", "eth0"),
        ("swp2", "gpu-n2", "mac", "eth0"),
    ]


def test_two_neighbours_on_one_port_one_without_a_system_name() -> None:
    found = parse_lldpctl_json((FIXTURES / "lldpctl-1.0.16-two-neighbours-one-port.json").read_text())
    assert [n.model_dump(exclude_defaults=True) for n in found] == [
        {
            "local_interface": "ens1f0np0",
            "chassis_id": "44:4c:a8:12:34:56",
            "chassis_id_type": "mac",
            "system_name": "leaf07.dc1.example.net",
            "system_description": "Arista Networks EOS version 4.30.1F running on an Arista Networks DCS-7060DX5-64S",
            "port_id": "Ethernet12/1",
            "port_id_type": "ifname",
            "port_description": "gpu004:ens1f0np0",
            "management_addresses": ["192.0.2.17"],  # one address: a string, not a list
        },
        {
            "local_interface": "ens1f0np0",
            "chassis_id": "FOC1234X0AB",  # no system name: the chassis object is not keyed by one
            "chassis_id_type": "local",
            "port_id": "541",
            "port_id_type": "local",
            "port_description": "ge-0/0/17",
        },
    ]
    assert found[1].port_name() == "ge-0/0/17"


def test_no_neighbours() -> None:
    assert _parse("lldpctl-1.0.16-no-neighbours.json") == []


def test_cumulus_json0() -> None:
    found = parse_lldpctl_json((FIXTURES / "lldpctl-json0-cumulus-3.7.12-spine01.json").read_text())
    assert [(n.local_interface, n.system_name, n.port_id, n.chassis_id, n.management_addresses) for n in found] == [
        ("swp1", "leaf01", "swp1", "52:54:00:cb:03:66", ["10.0.0.11", "fe80::5054:ff:fecb:366"]),
        ("swp6", "exit01", "swp1", "52:54:00:75:f2:54", ["10.0.0.101", "fe80::5054:ff:fe75:f254"]),
    ]
    assert {n.system_description for n in found} == {
        "Cumulus Linux version 3.7.12 running on QEMU Standard PC (i440FX + PIIX, 1996)"
    }


def test_one_interface_in_a_list_of_one() -> None:
    """Some lldpctl builds write a single interface as a list of one object (as they write several)."""
    one = json.loads((FIXTURES / "lldpctl-1.0.16-netns-node.json").read_text())
    one["lldp"]["interface"] = [one["lldp"]["interface"]]
    assert parse_lldpctl_json(json.dumps(one)) == parse_lldpctl_json(
        (FIXTURES / "lldpctl-1.0.16-netns-node.json").read_text()
    )


def test_lldpd_09_shapes() -> None:
    """lldpd 0.9: the TTL under the chassis, one capability as an object; neighbours heard over CDP;
    an interface holding a list of neighbours; values cut to LLDP's 255 octets."""
    document = {
        "lldp": {
            "interface": {
                "eth2": [
                    {
                        "via": "CDPv2",
                        "chassis": {
                            "sw-core.example": {
                                "id": {"type": "local", "value": "sw-core.example"},
                                "ttl": "180",
                                "capability": {"type": "Router", "enabled": True},
                            }
                        },
                        "port": {"id": {"type": "ifname", "value": "GigabitEthernet1/0/13"}},
                    },
                    {"via": "LLDP", "chassis": {"id": {"type": "mac", "value": "00:35:35:35:35:35"}, "ttl": "120"},
                     "port": {"id": {"type": "ifname", "value": "g1"}, "descr": "x" * 300}},
                ]
            }
        }
    }  # fmt: skip
    found = parse_lldpctl_json(json.dumps(document))
    assert [(n.protocol, n.system_name, n.chassis_id, n.port_id) for n in found] == [
        ("lldp", None, "00:35:35:35:35:35", "g1"),
        ("cdp", "sw-core.example", "sw-core.example", "GigabitEthernet1/0/13"),
    ]
    assert found[0].port_description == "x" * 255


def test_the_list_is_bounded_sorted_and_without_duplicates() -> None:
    entry = {"chassis": {"leaf": {"id": {"type": "mac", "value": "aa:bb:cc:dd:ee:ff"}}}, "port": {"id": "p"}}
    interfaces = [{f"eth{i:03d}": entry} for i in range(MAX_NEIGHBORS + 10, 0, -1)] + [{"eth001": entry}]
    found = parse_lldpctl_json(json.dumps({"lldp": {"interface": interfaces}}))
    assert len(found) == MAX_NEIGHBORS
    assert [n.local_interface for n in found[:2]] == ["eth001", "eth002"]


def test_a_neighbour_that_names_nothing_is_left_out() -> None:
    document = {"lldp": {"interface": {"eth0": {"via": "LLDP", "chassis": {}, "port": {"descr": "?"}}}}}
    assert parse_lldpctl_json(json.dumps(document)) == []


@pytest.mark.parametrize("text", ["", "lldpctl: error", "[]", '{"other": {}}', '{"lldp": 3}'])
def test_what_is_not_lldpctls_output(text: str) -> None:
    with pytest.raises(LldpParseError):
        parse_lldpctl_json(text)


class Lldpctl:
    """Stands in for running lldpctl: each call answers the next of `answers` (a finished process or an
    exception to raise) and records the argument list."""

    def __init__(self, *answers: subprocess.CompletedProcess[bytes] | Exception) -> None:
        self.answers = list(answers)
        self.calls: list[list[str]] = []

    def __call__(self, args: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[bytes]:
        self.calls.append(list(args))
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def _done(code: int, out: bytes = b"", err: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.CompletedProcess(["lldpctl"], code, out, err)


NODE = (FIXTURES / "lldpctl-1.0.16-netns-node.json").read_bytes()
NO_SOCKET = (
    b"2026-12-06T17:38:55 [WARN/control] unable to connect to socket /run/lldpd.socket: No such file or directory\n"
)


def test_the_command_names_the_socket() -> None:
    run = Lldpctl(_done(0, NODE))
    reader = LldpNeighbors("/run/ns1/lldpd.socket", run=run, timeout_s=2)
    assert [n.system_name for n in reader()] == ["leaf01.example.net"]
    assert run.calls == [["lldpctl", "-u", "/run/ns1/lldpd.socket", "-f", "json"]]
    assert LldpNeighbors().command() == ["lldpctl", "-f", "json"]


def test_no_lldpd_means_no_neighbours_said_once(caplog: pytest.LogCaptureFixture) -> None:
    run = Lldpctl(
        FileNotFoundError(2, "not found", "lldpctl"),
        FileNotFoundError(2, "not found", "lldpctl"),
        _done(1, err=NO_SOCKET),
        _done(1, err=NO_SOCKET),
        _done(1, err=NO_SOCKET),
        subprocess.TimeoutExpired(["lldpctl"], 5),
        _done(0, b"Segmentation fault"),
        _done(0, NODE),
        _done(0, NODE),
    )
    reader = LldpNeighbors(run=run)
    with caplog.at_level(logging.DEBUG, logger="gpufleet.agent.topology.lldp"):
        answers = [reader.read() for _ in range(9)]
    assert [len(a) for a in answers] == [0, 0, 0, 0, 0, 0, 0, 1, 1]
    said = [(r.levelname, r.getMessage()) for r in caplog.records if r.levelno >= logging.INFO]
    assert said == [
        ("INFO", "no LLDP neighbours reported: lldpctl is not installed (no lldpd on this node)"),
        (
            "INFO",
            "no LLDP neighbours reported: lldpctl exited with status 1 ([WARN/control] unable to connect to socket"
            " /run/lldpd.socket: No such file or directory): is lldpd running?",
        ),
        ("WARNING", "no LLDP neighbours reported: lldpctl did not answer within 5 s"),
        ("WARNING", "no LLDP neighbours reported: lldpctl's output was not understood: not JSON: Expecting value:"
                    " line 1 column 1 (char 0)"),
        ("INFO", "lldpctl answers again: 1 LLDP neighbour(s)"),
    ]  # fmt: skip
