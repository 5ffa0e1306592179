"""Networks and the addresses gpufleet gives nodes on them (IPv4).

Adding nodes to a network gives each the next free address of the network's range, in name order,
all or nothing: a range too small for the request refuses the whole request, never half of it. An
address is never given twice on a network: the database holds it unique, so two head replicas adding
nodes at once cannot both take one (the second transaction fails, the caller retries). The gateway
and the boot server are never handed out.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpufleet.core.errors import Conflict, InvalidInput, NotFound
from gpufleet.inventory.models import Node
from gpufleet.provisioning.models import Interface, Network

_MAC = re.compile(r"^[0-9a-f]{2}([:-]?)[0-9a-f]{2}(\1[0-9a-f]{2}){4}$")
_NAME = re.compile(r"^[a-z][a-z0-9-]{0,62}$")
# Both end up in dnsmasq's configuration, and the boot file also names a file under the TFTP root:
# a DNS name, and a relative path whose parts start with a letter or digit (so no "..", no "/x").
_DOMAIN = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)
_BOOT_FILE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)*$")


@dataclass(frozen=True)
class NetworkSpec:
    name: str
    cidr: str
    range_start: str | None = None  # default: the network's second usable address
    range_end: str | None = None  # default: its last usable address
    gateway: str | None = None
    domain: str | None = None
    boot_server: str | None = None
    boot_file: str | None = None


def _address(text: str, what: str) -> ipaddress.IPv4Address:
    try:
        return ipaddress.IPv4Address(text.strip())
    except ValueError:
        raise InvalidInput(f"{what} must be an IPv4 address, not {text!r}") from None


def create_network(session: Session, spec: NetworkSpec) -> Network:
    """Raises InvalidInput for a malformed spec, Conflict for a taken name."""
    if not _NAME.fullmatch(spec.name):
        raise InvalidInput("a network name is lower-case letters, digits and '-', starting with a letter")
    try:
        net = ipaddress.IPv4Network(spec.cidr.strip(), strict=True)
    except ValueError as exc:
        raise InvalidInput(f"cidr must be an IPv4 network such as 10.141.0.0/16: {exc}") from None
    hosts = list(net.hosts()) if net.num_addresses <= 4 else None
    first = hosts[0] if hosts else net.network_address + 1
    last = hosts[-1] if hosts else net.broadcast_address - 1
    start = _address(spec.range_start, "range start") if spec.range_start else first + 1
    end = _address(spec.range_end, "range end") if spec.range_end else last
    fixed = {"gateway": spec.gateway, "boot server": spec.boot_server}
    for what, value in (("range start", start), ("range end", end)):
        if value not in net or value in (net.network_address, net.broadcast_address):
            raise InvalidInput(f"{what} {value} is not a usable address of {net}")
    if end < start:
        raise InvalidInput(f"the range {start}-{end} is empty: its end is before its start")
    for what, text in fixed.items():
        if text is not None and _address(text, what) not in net:
            raise InvalidInput(f"{what} {text} is outside {net}")
    if spec.domain is not None and not _DOMAIN.fullmatch(spec.domain):
        raise InvalidInput(f"domain must be a DNS name such as cluster.local, not {spec.domain!r}")
    if spec.boot_file is not None and (len(spec.boot_file) > 256 or not _BOOT_FILE.fullmatch(spec.boot_file)):
        raise InvalidInput(
            "boot file must be a path under the TFTP root such as gpufleet.ipxe or pxe/undionly.kpxe, "
            f"not {spec.boot_file!r}"
        )
    if session.scalar(select(Network.id).where(Network.name == spec.name)) is not None:
        raise Conflict(f"network {spec.name} exists")
    network = Network(
        name=spec.name,
        cidr=str(net),
        range_start=str(start),
        range_end=str(end),
        gateway=spec.gateway,
        domain=spec.domain,
        boot_server=spec.boot_server,
        boot_file=spec.boot_file,
    )
    session.add(network)
    session.flush()
    return network


def list_networks(session: Session) -> list[Network]:
    return list(session.scalars(select(Network).order_by(Network.name)))


def get_network(session: Session, name: str) -> Network:
    network = session.scalar(select(Network).where(Network.name == name))
    if network is None:
        raise NotFound(f"no such network: {name}")
    return network


def free_count(session: Session, network: Network) -> int:
    used = len(session.scalars(select(Interface.id).where(Interface.network_id == network.id)).all())
    return _size(network) - len(_reserved(network)) - used


def _size(network: Network) -> int:
    return int(ipaddress.IPv4Address(network.range_end)) - int(ipaddress.IPv4Address(network.range_start)) + 1


def _reserved(network: Network) -> set[int]:
    """Addresses of the range never handed out: the gateway's and the boot server's."""
    low, high = int(ipaddress.IPv4Address(network.range_start)), int(ipaddress.IPv4Address(network.range_end))
    fixed = (int(ipaddress.IPv4Address(a)) for a in (network.gateway, network.boot_server) if a)
    return {a for a in fixed if low <= a <= high}


def assign(session: Session, nodes: Sequence[Node], network: Network, interface: str = "boot") -> list[Interface]:
    """Give each node (in name order) the next free address of the network's range. All or nothing:
    raises Conflict when the range has fewer free addresses than nodes, or a node already has one."""
    ordered = sorted(nodes, key=lambda n: n.name)
    if not ordered:
        return []
    ids = [n.id for n in ordered]
    already = session.scalars(
        select(Interface.node_id).where(Interface.network_id == network.id, Interface.node_id.in_(ids))
    ).all()
    if already:
        raise Conflict(f"{len(already)} of these nodes already have an address on {network.name}")
    used = set(session.scalars(select(Interface.address_int).where(Interface.network_id == network.id)))
    used |= _reserved(network)
    low, high = int(ipaddress.IPv4Address(network.range_start)), int(ipaddress.IPv4Address(network.range_end))
    free = (a for a in range(low, high + 1) if a not in used)
    picked = [a for _, a in zip(ordered, free, strict=False)]
    if len(picked) < len(ordered):
        have = _size(network) - len(used)
        raise Conflict(
            f"network {network.name} has {have} free addresses in {network.range_start}-{network.range_end}; "
            f"{len(ordered)} nodes need one each"
        )
    rows = [
        Interface(
            node_id=n.id, network_id=network.id, name=interface, address=str(ipaddress.IPv4Address(a)), address_int=a
        )
        for n, a in zip(ordered, picked, strict=True)
    ]
    session.add_all(rows)
    session.flush()
    return rows


def networks_of(session: Session, node_id: int) -> list[Network]:
    query = select(Network).join(Interface, Interface.network_id == Network.id).where(Interface.node_id == node_id)
    return list(session.scalars(query.order_by(Network.name)))


def normalize_mac(text: str) -> str:
    value = text.strip().lower()
    if not _MAC.fullmatch(value):
        raise InvalidInput(f"not a MAC address: {text!r} (e.g. 52:54:00:aa:bb:01)")
    digits = re.sub(r"[:-]", "", value)
    return ":".join(digits[i : i + 2] for i in range(0, 12, 2))


def set_mac(session: Session, node: Node, network: Network, mac: str, interface: str | None = None) -> Interface:
    """Record the MAC of a node's interface on a network. Raises NotFound when the node has no
    address there, Conflict when another interface has that MAC."""
    mac = normalize_mac(mac)
    row = session.scalar(select(Interface).where(Interface.node_id == node.id, Interface.network_id == network.id))
    if row is None:
        raise NotFound(f"{node.name} has no address on {network.name}")
    other = session.scalar(select(Interface).where(Interface.mac == mac, Interface.id != row.id))
    if other is not None:
        raise Conflict(f"MAC {mac} is recorded for another interface already")
    row.mac = mac
    if interface:
        row.name = interface
    return row


@dataclass(frozen=True)
class HostEntry:
    node: str
    address: str
    mac: str | None
    interface: str


def hosts(session: Session, network: Network, names: Iterable[str] | None = None) -> list[HostEntry]:
    query = (
        select(Node.name, Interface.address, Interface.mac, Interface.name, Interface.address_int)
        .join(Interface, Interface.node_id == Node.id)
        .where(Interface.network_id == network.id)
        .order_by(Interface.address_int)
    )
    if names is not None:
        query = query.where(Node.name.in_(list(names)))
    return [HostEntry(node, address, mac, iface) for node, address, mac, iface, _ in session.execute(query)]


def boot_addresses(session: Session, node_ids: Iterable[int] | None = None) -> dict[int, str]:
    """Each node's boot address by node id: where provisioning (image sync, Ansible) reaches it. Its
    address on a network that boots nodes (one with a boot server or boot file) first, then on an
    interface named "boot", then on its first network by name."""
    query = select(
        Interface.node_id, Interface.name, Interface.address, Network.name, Network.boot_server, Network.boot_file
    ).join(Network, Network.id == Interface.network_id)
    if node_ids is not None:
        query = query.where(Interface.node_id.in_(list(node_ids)))
    rows = session.execute(query).all()
    ranked = sorted(rows, key=lambda r: (not (r[4] or r[5]), r[1] != "boot", r[3]))
    out: dict[int, str] = {}
    for node_id, _, address, *_rest in ranked:
        out.setdefault(node_id, address)
    return out


def boot_plan(session: Session) -> list[tuple[Network, list[HostEntry]]]:
    """Every network with its hosts, by address: what the network-boot configuration is rendered from."""
    return [(network, hosts(session, network)) for network in list_networks(session)]
