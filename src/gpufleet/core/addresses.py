"""Addresses a node must never fetch an operator's URL from: the node itself (loopback), a cloud's metadata
service (link-local, and the few metadata addresses outside it) and multicast. Stdlib only: the head checks
a URL's spelled address when it is registered, and the agent checks every address it connects to when it
fetches (the name's resolution, and each redirect), which the head cannot see."""

from __future__ import annotations

import ipaddress
import socket

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# Metadata services outside 169.254.0.0/16 and fe80::/10: AWS's IPv6 one and Alibaba Cloud's.
METADATA_ADDRESSES = frozenset(ipaddress.ip_address(a) for a in ("fd00:ec2::254", "100.100.100.200"))


def spelled(host: str) -> IpAddress | None:
    """The IP address a URL's host spells, in any form an HTTP client reads as one (169.254.169.254,
    0xa9fea9fe, 2852039166, 169.254.43518, [::ffff:a9fe:a9fe]); None for a name."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    try:
        return ipaddress.IPv4Address(socket.inet_aton(host))  # the inet_aton forms, as curl and libc read them
    except OSError:
        return None


def refused(address: IpAddress, *, loopback: bool = True) -> str | None:
    """Why a node must not fetch from `address`, or None. With `loopback` False a node's own address passes
    (an object store on the node itself: only a URL an operator spells is refused that, at the head)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if loopback and (address.is_loopback or address.is_unspecified):
        return "a loopback address; the nodes would each fetch from themselves"
    if address.is_link_local or address in METADATA_ADDRESSES:
        return "a link-local address (a cloud's metadata service answers there, with the node's credentials)"
    if address.is_multicast:
        return "a multicast address"
    return None


def refused_host(host: str) -> str | None:
    """Why a node must not fetch from `host` as spelled (no name lookup), or None."""
    name = host.rstrip(".").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return "a loopback host; the nodes would each fetch from themselves"
    address = spelled(name)
    return refused(address) if address is not None else None


def refused_resolved(host: str, port: int) -> str | None:
    """Why a node must not fetch from `host`, checking every address the name resolves to here (loopback
    allowed); None when all are allowed. A name that does not resolve is left to the connection to fail."""
    try:
        found = socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return None
    for *_, sockaddr in found:
        why = refused(ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0]), loopback=False)
        if why is not None:
            return f"{host} resolves to {sockaddr[0]}: {why}"
    return None
