"""`ibnetdiscover` into an IbFabric, on real outputs (tests/fixtures/topology, SOURCES.md): infiniband-diags 44.0
on an ibsim HDR leaf/spine fabric, the SDR example of rdma-core's man page (grouping heading, 1x links, an HCA
with two ports cabled), and two QDR outputs from ibtopotool's tests (one without its CAs' blocks)."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from gpufleet.agent.topology.ibnet import (
    IbnetParseError,
    TopologyReadError,
    guid,
    parse_ibnetdiscover,
    read_fabric,
)
from gpufleet.protocol.topology import IbCaPort, IbFabric

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "topology"


def _fabric(name: str) -> IbFabric:
    return parse_ibnetdiscover((FIXTURES / name).read_text())


def test_an_hdr_leaf_spine_fabric() -> None:
    fabric = _fabric("ibnetdiscover-44.0-ibsim-hdr-leaf-spine.txt")
    assert [(s.guid, s.description, s.lid, s.port_count) for s in fabric.switches] == [
        ("b8cef60300a0a001", "MF0;spine01:MQM8700/U1", 1, 40),
        ("b8cef60300a0b001", "MF0;leaf01:MQM8700/U1", 2, 40),
        ("b8cef60300a0c001", "MF0;leaf02:MQM8700/U1", 3, 40),
    ]
    assert len(fabric.cas) == 6
    assert len(fabric.links) == 10  # 6 HCA cables, 4 leaf-spine uplinks: each once though printed from both ends
    gpu001 = next(c for c in fabric.cas if c.description == "gpu001 mlx5_0")
    assert (gpu001.guid, gpu001.port_count, gpu001.host(), gpu001.device()) == (
        "0c42a10300d1e001",
        1,
        "gpu001",
        "mlx5_0",
    )
    # ibnetdiscover prints the port GUID without its leading zero: read as 16 digits
    assert gpu001.ports == [IbCaPort(number=1, guid="0c42a10300d1e002", lid=10)]
    placed = [(a.host, a.device, a.switch_description, a.switch_port, a.width, a.speed) for a in fabric.attachments()]
    assert placed == [
        ("gpu001", "mlx5_0", "MF0;leaf01:MQM8700/U1", 1, 4, "HDR"),
        ("gpu001", "mlx5_1", "MF0;leaf01:MQM8700/U1", 2, 4, "HDR"),
        ("gpu002", "mlx5_0", "MF0;leaf01:MQM8700/U1", 3, 4, "HDR"),
        ("gpu002", "mlx5_1", "MF0;leaf01:MQM8700/U1", 4, 4, "HDR"),
        ("gpu003", "mlx5_0", "MF0;leaf02:MQM8700/U1", 1, 4, "HDR"),
        ("gpu003", "mlx5_1", "MF0;leaf02:MQM8700/U1", 2, 1, "HDR"),  # a cable running on one lane of four
    ]
    uplinks = [link for link in fabric.links if {link.a.guid, link.b.guid} == {"b8cef60300a0a001", "b8cef60300a0c001"}]
    assert [(u.a.port, u.b.port, u.rate_gbps()) for u in uplinks] == [(3, 39, 200.0), (4, 40, 200.0)]


def test_the_man_pages_sdr_example() -> None:
    fabric = _fabric("ibnetdiscover-rdma-core-man-voltaire-sdr.txt")
    assert [(s.description, s.lid, s.port_count) for s in fabric.switches] == [
        ("SW-6IB4 Voltaire", 3, 8),
        ("ISR9024 Voltaire", 6, 24),
    ]
    two_ports = next(c for c in fabric.cas if c.guid == "0008f10403960558")
    assert two_ports.ports == [
        IbCaPort(number=1, guid="0008f10403960559", lid=10),
        IbCaPort(number=2, guid="0008f1040396055a", lid=14),
    ]
    assert two_ports.host() is None  # "MT23108 InfiniHost Mellanox Technologies": no host in it
    assert len(fabric.links) == 7
    # The two ends of these cables disagree in this (edited) example: the slower report is kept.
    inter_switch = {
        (link.a.port, link.b.port): (link.width, link.speed)
        for link in fabric.links
        if {link.a.guid, link.b.guid} == {"0008f10400410015", "005442ba00003080"}
    }
    assert inter_switch == {(1, 10): (1, "SDR"), (3, 6): (4, "SDR")}
    hca_port1 = next(link for link in fabric.links if link.a.guid == two_ports.guid)
    assert (hca_port1.a.port, hca_port1.b.port, hca_port1.width) == (1, 12, 1)


def test_cas_known_only_from_the_switches_lines() -> None:
    fabric = _fabric("ibnetdiscover-ibtopotool-bx900-two-switches-qdr.txt")
    assert [s.description for s in fabric.switches] == ["bx900-04-IB-SW-CB3", "bx900-02-IB-SW-CB3"]
    assert len(fabric.cas) == 20
    assert len(fabric.links) == 25  # 20 HCAs, 5 inter-switch cables
    first = next(a for a in fabric.attachments() if a.host == "bx900-02-01")
    assert (first.device, first.ca_port, first.switch_port, first.switch_description) == (
        "HCA-1",
        2,
        1,
        "bx900-02-IB-SW-CB3",
    )
    hca = next(c for c in fabric.cas if c.guid == first.ca_guid)
    assert (hca.port_count, hca.ports) == (0, [IbCaPort(number=2, guid="0002c903000413c2", lid=1)])


def test_one_switch_one_hca() -> None:
    fabric = _fabric("ibnetdiscover-ibtopotool-sun-dcs36-qdr.txt")
    (attachment,) = fabric.attachments()
    assert (attachment.host, attachment.ca_port, attachment.switch_port, attachment.width, attachment.speed) == (
        "nsn33-43",
        2,
        23,
        4,
        "QDR",
    )
    assert fabric.switches[0].lid == 15
    assert fabric.cas[0].ports == [IbCaPort(number=2, guid="0003ba000100e38a", lid=14)]


def test_the_same_fabric_has_the_same_digest_whatever_the_order() -> None:
    text = (FIXTURES / "ibnetdiscover-44.0-ibsim-hdr-leaf-spine.txt").read_text()
    blocks = text.split("\n\n")
    reordered = "\n\n".join([blocks[0], *reversed(blocks[1:])])
    assert parse_ibnetdiscover(reordered).digest() == parse_ibnetdiscover(text).digest()


def test_noise_and_odd_lines_are_skipped() -> None:
    text = "\n".join(
        [
            "ibwarn: [23236] sim_connect: attached as client 0",
            'Switch\t40 "S-zz"\t\t# "bad guid" enhanced port 0 lid 1 lmc 0',
            '[1]\t"H-0c42a10300d1e001"[1](c42a10300d1e002) \t\t# "gpu001 mlx5_0" lid 10 4xHDR',
            "",
            'Switch\t40 "S-b8cef60300a0b001"\t\t# "leaf" enhanced port 0 lid 99999 lmc 0',
            '[300]\t"H-0c42a10300d1e001"[1]\t\t# "gpu001 mlx5_0" lid 10 4xHDR',
            '[2]\t"H-0c42a10300d1e001"[1](c42a10300d1e002)\t\t# "gpu001 mlx5_0" lid 10 4xWARP',
        ]
    )
    fabric = parse_ibnetdiscover(text)
    assert [(s.guid, s.lid) for s in fabric.switches] == [("b8cef60300a0b001", None)]  # LID beyond 16 bits
    assert [(link.b.port, link.width, link.speed) for link in fabric.links] == [(2, 4, None)]
    assert parse_ibnetdiscover("") == IbFabric()


def test_guids() -> None:
    assert guid("0x2c9020040c7a8") == "0002c9020040c7a8"
    assert guid("C42A10300D1E002") == "0c42a10300d1e002"
    assert guid("12345678901234567") is None
    assert guid("xyz") is None


def test_a_fabric_beyond_the_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("gpufleet.agent.topology.ibnet.MAX_IB_LINKS", 5)
    with pytest.raises(IbnetParseError, match="10 links"):
        _fabric("ibnetdiscover-44.0-ibsim-hdr-leaf-spine.txt")


def test_running_ibnetdiscover() -> None:
    calls: list[list[str]] = []
    text = (FIXTURES / "ibnetdiscover-ibtopotool-sun-dcs36-qdr.txt").read_bytes()

    def run(args: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[bytes]:
        calls.append(list(args))
        return subprocess.CompletedProcess(args, 0, text, b"")

    assert len(read_fabric(ca="mlx5_0", port=1, run=run).links) == 1
    assert calls == [["ibnetdiscover", "-C", "mlx5_0", "-P", "1"]]

    def failing(args: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[bytes]:
        return subprocess.CompletedProcess(args, 255, b"", b"ibwarn: [1] umad_init: can't init UMAD library\n")

    with pytest.raises(TopologyReadError, match=r"status 255: ibwarn: .* can't init UMAD library"):
        read_fabric(run=failing)

    def missing(args: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[bytes]:
        raise FileNotFoundError(2, "No such file", "ibnetdiscover")

    with pytest.raises(TopologyReadError, match="not installed"):
        read_fabric(run=missing)
