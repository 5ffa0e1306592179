"""The InfiniBand fabric from `ibnetdiscover` (its plain topology file), parsed into an `IbFabric`.

The format (infiniband-diags, "TOPOLOGY FILE FORMAT"): a block per node, a header line, then one line per
connected port; `vendid=`, `devid=`, `*guid=` lines and `#` comments around them.

    Switch  36 "S-0002c9020040c7a8"  # "bx900-02-IB-SW-CB3" enhanced port 0 lid 14 lmc 0
    [18]    "H-0002c9030003bf82"[2](2c9030003bf84)  # "bx900-02-18 HCA-1" lid 7 4xQDR
    Ca      2 "H-0003ba000100e388"   # "nsn33-43 HCA-1"
    [2](3ba000100e38a)  "S-0021283a8389a0a0"[23]  # lid 14 lmc 0 "Sun DCS 36 QDR switch localhost" lid 15 4xQDR

A switch's port line names the peer, its port, the peer's port GUID in parentheses for a CA, the peer's
description and LID, and the link's width and speed; a CA's port line has its own port GUID after its port
number and its own LID and LMC first in the comment. Every link appears from both ends; it is kept once,
with the slower width and speed where the two ends disagree.
A node known only from its peers' lines (a partial output) is kept with what they say of it. GUIDs are
printed without leading zeros in parentheses and with them in quotes: all are read as 16 hex digits.
Lines that fit none of this (a "Non-Chassis Nodes" heading, `ibwarn:` noise) are skipped.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import get_args

from gpufleet.protocol.topology import (
    LANE_GBPS,
    MAX_IB_CAS,
    MAX_IB_LINKS,
    MAX_IB_SWITCHES,
    IbCa,
    IbCaPort,
    IbEnd,
    IbFabric,
    IbLink,
    IbSpeed,
    IbSwitch,
)

PROGRAM = "ibnetdiscover"
TIMEOUT_S = 120.0  # a sweep of a large fabric takes tens of seconds
Runner = Callable[[Sequence[str], float], subprocess.CompletedProcess[bytes]]

_GUID = r"(?:0x)?[0-9a-fA-F]{1,16}"
_HEADER = re.compile(rf'^(Switch|Ca|Rt)\s+(\d+)\s+"([SHR])-({_GUID})"\s*(?:#\s*(.*))?$')
_PORT = re.compile(
    rf"^\[(\d+)\](?:\(({_GUID})\))?(?:\[ext\s+\d+\])?\s*"
    rf'"([SHR])-({_GUID})"\[(\d+)\](?:\(({_GUID})\))?(?:\[ext\s+\d+\])?\s*(?:#\s*(.*))?$'
)
# A port line's comment: a CA's own "lid N lmc M" first, then the peer's "description", then the rest.
_COMMENT = re.compile(r'^(?:lid\s+(\d+)\s+lmc\s+\d+\s+)?"(.*)"\s*(.*)$')
_LID = re.compile(r"\blid\s+(\d+)")
_WIDTH_SPEED = re.compile(r"\b(\d+)x([A-Za-z0-9]+)\b")
_SPEEDS: dict[str, IbSpeed] = {speed: speed for speed in get_args(IbSpeed)}
_KINDS = {"Switch": "switch", "Ca": "ca", "Rt": "router", "S": "switch", "H": "ca", "R": "router"}
_DESCRIPTION_MAX = 64


class IbnetParseError(ValueError):
    """The output holds more than a fabric may (protocol.topology's bounds)."""


class TopologyReadError(Exception):
    """ibnetdiscover could not be run, or failed."""


@dataclass
class _Node:
    kind: str
    description: str = ""
    described_by_header: bool = False
    port_count: int = 0
    lid: int | None = None  # a switch's (port 0's)
    ports: dict[int, tuple[str | None, int | None]] = field(default_factory=dict)  # a CA's: number -> (GUID, LID)


@dataclass
class _Link:
    width: int | None
    speed: IbSpeed | None


def guid(text: str) -> str | None:
    """A GUID as 16 lower-case hex digits ("0x2c9020040c7a8", "2c9020040c7a8" -> "0002c9020040c7a8"), or
    None if it is not one."""
    value = text.lower().removeprefix("0x")
    if not value or len(value) > 16 or any(c not in "0123456789abcdef" for c in value):
        return None
    return value.zfill(16)


def parse_ibnetdiscover(text: str) -> IbFabric:
    """The fabric described by ibnetdiscover's topology output.

    Raises IbnetParseError when it names more switches, CAs or links than an IbFabric holds.
    """
    nodes: dict[str, _Node] = {}
    links: dict[tuple[tuple[str, int], tuple[str, int]], _Link] = {}
    current: str | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            current = None
            continue
        header = _HEADER.match(line)
        if header:
            current = _header(nodes, header)
            continue
        port = _PORT.match(line)
        if port and current is not None:
            _port_line(nodes, links, current, port)
    return _fabric(nodes, links)


def _description(text: str) -> str:
    return text.strip()[:_DESCRIPTION_MAX]


def _int(text: str | None, top: int) -> int | None:
    if text is None:
        return None
    value = int(text)
    return value if 0 <= value <= top else None


def _header(nodes: dict[str, _Node], match: re.Match[str]) -> str | None:
    kind_word, ports, _letter, guid_text, comment = match.groups()
    node_guid = guid(guid_text)
    if node_guid is None:
        return None
    node = nodes.setdefault(node_guid, _Node(kind=_KINDS[kind_word]))
    node.kind = _KINDS[kind_word]
    node.port_count = min(int(ports), 255)
    if comment:
        described = re.match(r'^"(.*)"(.*)$', comment)
        if described:
            node.description = _description(described.group(1))
            node.described_by_header = True
            if node.kind == "switch":
                lid = _LID.search(described.group(2))
                node.lid = _int(lid.group(1) if lid else None, 0xFFFF)
    return node_guid


def _width_speed(rest: str) -> tuple[int | None, IbSpeed | None]:
    matches = list(_WIDTH_SPEED.finditer(rest))
    if not matches:
        return None, None
    found = matches[-1]  # the link's, after any LID
    width = int(found.group(1))
    return (width if 1 <= width <= 32 else None), _SPEEDS.get(found.group(2).upper())


def _port_line(
    nodes: dict[str, _Node],
    links: dict[tuple[tuple[str, int], tuple[str, int]], _Link],
    current: str,
    match: re.Match[str],
) -> None:
    local_port_text, local_port_guid, peer_letter, peer_guid_text, peer_port_text, peer_port_guid, comment = (
        match.groups()
    )
    local_port = _int(local_port_text, 255)
    peer_port = _int(peer_port_text, 255)
    peer_guid = guid(peer_guid_text)
    if local_port is None or peer_port is None or peer_guid is None:
        return
    own_lid = peer_lid = None
    peer_description: str | None = None
    width: int | None = None
    speed: IbSpeed | None = None
    parsed = _COMMENT.match(comment or "")
    if parsed:
        own_lid = _int(parsed.group(1), 0xFFFF)
        peer_description = _description(parsed.group(2))
        lid = _LID.search(parsed.group(3))
        peer_lid = _int(lid.group(1) if lid else None, 0xFFFF)
        width, speed = _width_speed(parsed.group(3))
    me = nodes[current]
    if me.kind != "switch":
        _ca_port(me, local_port, local_port_guid, own_lid)
    peer = nodes.setdefault(peer_guid, _Node(kind=_KINDS[peer_letter]))
    if not peer.described_by_header and peer_description:
        peer.description = peer_description
    if peer.kind == "switch":
        if peer.lid is None:
            peer.lid = peer_lid
    else:
        _ca_port(peer, peer_port, peer_port_guid, peer_lid)
    ends = sorted([(current, local_port), (peer_guid, peer_port)])
    key = (ends[0], ends[1])
    link = links.get(key)
    if link is None:
        links[key] = _Link(width, speed)
    elif _rate(width, speed) < _rate(link.width, link.speed):
        # The other end's line. Both ends of a cable report the same width and speed; where they differ,
        # the slower is kept, so a link running below its rate is never hidden by its other end.
        link.width, link.speed = width, speed


def _rate(width: int | None, speed: IbSpeed | None) -> float:
    """A link's rate in Gb/s for comparing two reports of it; unknown counts as fastest (any report wins)."""
    return width * LANE_GBPS[speed] if width is not None and speed is not None else float("inf")


def _ca_port(node: _Node, number: int, guid_text: str | None, lid: int | None) -> None:
    """Note a CA port's GUID and LID, keeping what an earlier line said where this one says nothing."""
    known_guid, known_lid = node.ports.get(number, (None, None))
    port_guid = guid(guid_text) if guid_text else None
    node.ports[number] = (port_guid or known_guid, lid if lid is not None else known_lid)


def _fabric(nodes: dict[str, _Node], links: dict[tuple[tuple[str, int], tuple[str, int]], _Link]) -> IbFabric:
    switches = [
        IbSwitch(guid=g, description=n.description, lid=n.lid, port_count=n.port_count)
        for g, n in sorted(nodes.items())
        if n.kind == "switch"
    ]
    cas = [
        IbCa(
            guid=g,
            description=n.description,
            kind="router" if n.kind == "router" else "ca",
            port_count=n.port_count,
            ports=[IbCaPort(number=p, guid=pg, lid=lid) for p, (pg, lid) in sorted(n.ports.items())],
        )
        for g, n in sorted(nodes.items())
        if n.kind != "switch"
    ]
    if len(switches) > MAX_IB_SWITCHES or len(cas) > MAX_IB_CAS or len(links) > MAX_IB_LINKS:
        raise IbnetParseError(
            f"the fabric has {len(switches)} switches, {len(cas)} CAs and {len(links)} links: more than"
            f" {MAX_IB_SWITCHES}, {MAX_IB_CAS} and {MAX_IB_LINKS} are not reported"
        )
    return IbFabric(
        switches=switches,
        cas=cas,
        links=[
            IbLink(
                a=IbEnd(guid=a[0], port=a[1]),
                b=IbEnd(guid=b[0], port=b[1]),
                width=link.width,
                speed=link.speed,
            )
            for (a, b), link in sorted(links.items())
        ],
    )


def run_program(args: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[bytes]:
    """Run `args` with an argument list (never a shell), capturing its output. Raises FileNotFoundError,
    subprocess.TimeoutExpired (the process is killed) or OSError."""
    return subprocess.run(list(args), capture_output=True, timeout=timeout_s, check=False)


def read_fabric(
    *, ca: str | None = None, port: int | None = None, timeout_s: float = TIMEOUT_S, run: Runner = run_program
) -> IbFabric:
    """Run `ibnetdiscover` (from HCA `ca`, port `port` where given) and parse its output.

    Raises TopologyReadError where ibnetdiscover is missing, times out or fails (its message included),
    and IbnetParseError for a fabric beyond the bounds.
    """
    args = [PROGRAM, *(["-C", ca] if ca else []), *(["-P", str(port)] if port is not None else [])]
    try:
        done = run(args, timeout_s)
    except FileNotFoundError as exc:
        raise TopologyReadError("ibnetdiscover is not installed (infiniband-diags)") from exc
    except subprocess.TimeoutExpired as exc:
        raise TopologyReadError(f"ibnetdiscover did not finish within {timeout_s:g} s") from exc
    except OSError as exc:
        raise TopologyReadError(f"ibnetdiscover could not be started: {exc}") from exc
    if done.returncode != 0:
        said = (done.stderr or done.stdout or b"").decode("utf-8", errors="replace").strip().splitlines()
        raise TopologyReadError(f"ibnetdiscover exited with status {done.returncode}: {said[-1][:200] if said else ''}")
    return parse_ibnetdiscover(done.stdout.decode("utf-8", errors="replace"))
