"""Where a node is plugged: what its agent reports about the network around it.

`LinkNeighbor`: one neighbour a node's own port sees over LLDP (or CDP, EDP, FDP, SONMP, which lldpd
also speaks), read from `lldpctl -f json`; it travels in the node's inventory (`NodeInventory.neighbors`).

`IbFabric`: an InfiniBand fabric as `ibnetdiscover` describes it: switches, channel adapters (HCAs) and
the links between their ports. One fabric is the same for every node on it and can be large (a
10,000-GPU fabric has some 10,000 HCAs and 30,000 links), so it does not travel in each node's
inventory: an agent with `fabric_interval_s` set reads it (`agent.topology.ibnet`) and sends it on its own
(`PUT /api/v1/agent/fabric`) when its digest changed; the head keeps each reporter's latest (docs/network.md).

The bounds are the protocols' own: IEEE 802.1AB caps an LLDP chassis or port ID, system name, system
description and port description at 255 octets; an InfiniBand NodeDescription is 64 bytes, a LID 16 bits,
a port number 8 bits. The agent cuts what it reads to them, so an odd switch never costs the whole
inventory.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from gpufleet.protocol.bounds import replace_nul

LLDP_TEXT_MAX = 255  # IEEE 802.1AB: chassis ID, port ID, system name and description, port description
INTERFACE_MAX = 64  # the head's column; a Linux interface name is at most 15 characters
ADDRESS_MAX = 64  # an IPv6 address with a zone, as text
MAX_NEIGHBORS = 64  # per node
MAX_MANAGEMENT_ADDRESSES = 4  # per neighbour

LldpText = Annotated[str, StringConstraints(min_length=1, max_length=LLDP_TEXT_MAX)]
IdKind = Annotated[str, StringConstraints(min_length=1, max_length=32)]
# How the neighbour was heard: lldpd's "via", lower-cased without the CDP version.
LinkProtocol = Literal["lldp", "cdp", "edp", "fdp", "sonmp"]


class LinkNeighbor(BaseModel):
    """One neighbour seen on one of this node's ports: who it is (chassis, system name) and which of its
    ports faces this one. Fields the neighbour did not send are None."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    local_interface: Annotated[str, StringConstraints(min_length=1, max_length=INTERFACE_MAX)]
    chassis_id: LldpText | None = None
    chassis_id_type: IdKind | None = None  # lldpd's word: mac, ip, ifname, ifalias, local
    system_name: LldpText | None = None
    system_description: LldpText | None = None
    port_id: LldpText | None = None
    port_id_type: IdKind | None = None  # mac, ip, ifname, ifalias, local
    port_description: LldpText | None = None
    management_addresses: list[Annotated[str, StringConstraints(min_length=1, max_length=ADDRESS_MAX)]] = Field(
        default_factory=list, max_length=MAX_MANAGEMENT_ADDRESSES
    )
    protocol: LinkProtocol = "lldp"

    @model_validator(mode="before")
    @classmethod
    def _no_nul(cls, data: Any) -> Any:
        return replace_nul(data)  # stored whole: PostgreSQL's text holds no NUL (protocol.bounds)

    def port_name(self) -> str | None:
        """The neighbour's port as its operator names it: the port ID where that is a name, the description
        where the ID is a MAC or address, or a bare number (Junos sends its SNMP ifIndex, "541", and puts
        "ge-0/0/17" in the description)."""
        by_number = self.port_id_type == "local" and (self.port_id or "").isdigit()
        if self.port_id_type in ("mac", "ip") or by_number:
            return self.port_description or self.port_id
        return self.port_id or self.port_description


# -- InfiniBand ----------------------------------------------------------------------------------------
GUID_PATTERN = r"^[0-9a-f]{16}$"
Guid = Annotated[str, StringConstraints(pattern=GUID_PATTERN)]  # 16 lower-case hex digits, zero-padded
NodeDescription = Annotated[str, StringConstraints(max_length=64)]
PortNumber = Annotated[int, Field(ge=0, le=255)]
Lid = Annotated[int, Field(ge=0, le=0xFFFF)]
MAX_IB_SWITCHES = 8_192
MAX_IB_CAS = 49_151  # one unicast LID each at least: 0x0001-0xBFFF
MAX_IB_LINKS = 262_144
# The head's limit on one fabric report's body. A 10,000-GPU fabric (10,000 HCAs, 600 switches, 30,000
# links) is under 5 MiB of JSON and some 2 s to validate; the counts above at their bounds would be 39 MiB
# and 14 s of the head's interpreter lock, which no node's report should be able to take.
MAX_FABRIC_BYTES = 8 * 1024 * 1024
IbSpeed = Literal["SDR", "DDR", "QDR", "FDR10", "FDR", "EDR", "HDR", "NDR", "XDR"]
# One lane's rate in Gb/s as InfiniBand names links and the kernel's rate file counts them: 4X HDR is
# 200, 4X QDR 40 (the agent's ib_rate_gbps metric uses the same figures).
LANE_GBPS: dict[str, float] = {
    "SDR": 2.5,
    "DDR": 5.0,
    "QDR": 10.0,
    "FDR10": 10.0,
    "FDR": 14.0,
    "EDR": 25.0,
    "HDR": 50.0,
    "NDR": 100.0,
    "XDR": 200.0,
}


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class IbSwitch(_Frozen):
    """A switch: its node GUID, NodeDescription (e.g. "MF0;leaf01:MQM8700/U1"), port 0's LID, port count."""

    guid: Guid
    description: NodeDescription = ""
    lid: Lid | None = None
    port_count: PortNumber = 0


class IbCaPort(_Frozen):
    """One port of a channel adapter: its number, port GUID and LID (None where the output lacked them)."""

    number: PortNumber
    guid: Guid | None = None
    lid: Lid | None = None


class IbCa(_Frozen):
    """A channel adapter (an HCA, or a router): node GUID, NodeDescription, its ports."""

    guid: Guid
    description: NodeDescription = ""
    kind: Literal["ca", "router"] = "ca"
    port_count: PortNumber = 0
    ports: list[IbCaPort] = Field(default_factory=list, max_length=255)

    def host(self) -> str | None:
        """The host this HCA is in, from its NodeDescription: Linux sets it to "<hostname> <device>"
        ("gpu001 mlx5_0"; "node24 HCA-1" with older drivers). None where the description is not of that
        form (a storage appliance, an unset description)."""
        words = self.description.split()
        return words[0] if len(words) == 2 else None

    def device(self) -> str | None:
        """The device name in the NodeDescription ("mlx5_0"), or None."""
        words = self.description.split()
        return words[1] if len(words) == 2 else None


class IbEnd(_Frozen):
    """One end of a link: a node's GUID and its port number."""

    guid: Guid
    port: PortNumber


class IbLink(_Frozen):
    """A cable between two ports: active width in lanes (1, 2, 4, 8, 12) and speed, as ibnetdiscover saw
    them (None where it printed none). `a` is the end that sorts first."""

    a: IbEnd
    b: IbEnd
    width: Annotated[int, Field(ge=1, le=32)] | None = None
    speed: IbSpeed | None = None

    def rate_gbps(self) -> float | None:
        """The link's data rate as InfiniBand names it (4X HDR: 200), or None when width or speed is unknown."""
        if self.width is None or self.speed is None:
            return None
        return self.width * LANE_GBPS[self.speed]


@dataclass(frozen=True)
class IbAttachment:
    """Where one HCA port is plugged: the switch and switch port on the other end of its cable."""

    host: str | None
    device: str | None
    ca_guid: str
    ca_port: int
    switch_guid: str
    switch_description: str
    switch_port: int
    width: int | None
    speed: str | None


class IbFabric(_Frozen):
    """An InfiniBand fabric as one `ibnetdiscover` run saw it, in a canonical order (by GUID, then port),
    so the same fabric always has the same `digest`."""

    switches: list[IbSwitch] = Field(default_factory=list, max_length=MAX_IB_SWITCHES)
    cas: list[IbCa] = Field(default_factory=list, max_length=MAX_IB_CAS)
    links: list[IbLink] = Field(default_factory=list, max_length=MAX_IB_LINKS)

    @model_validator(mode="before")
    @classmethod
    def _no_nul(cls, data: Any) -> Any:
        return replace_nul(data)

    def digest(self) -> str:
        """A SHA-256 of the content: whether the fabric changed since it was last sent."""
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()

    def attachments(self) -> list[IbAttachment]:
        """Every HCA port whose cable ends on a switch, with that switch and port: the "which leaf is this
        node under" answer, sorted by host, device and port."""
        switches = {s.guid: s for s in self.switches}
        cas = {c.guid: c for c in self.cas}
        found: list[IbAttachment] = []
        for link in self.links:
            for ca_end, sw_end in ((link.a, link.b), (link.b, link.a)):
                ca, switch = cas.get(ca_end.guid), switches.get(sw_end.guid)
                if ca is None or switch is None:
                    continue
                found.append(
                    IbAttachment(
                        host=ca.host(),
                        device=ca.device(),
                        ca_guid=ca.guid,
                        ca_port=ca_end.port,
                        switch_guid=switch.guid,
                        switch_description=switch.description,
                        switch_port=sw_end.port,
                        width=link.width,
                        speed=link.speed,
                    )
                )
        return sorted(found, key=lambda a: (a.host or "", a.device or "", a.ca_guid, a.ca_port))
