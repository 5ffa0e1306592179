"""The InfiniBand fabric: what the agents' ibnetdiscover reports (`protocol.topology.IbFabric`), kept per
reporting node, and read back as the newest report, its switches' ports, and where each node's HCAs are
plugged.

Every node on a fabric sees the same fabric, so a few nodes report it (`fabric_interval_s` on one or two
per fabric); each report replaces its node's previous one, and the newest of them is the fabric shown.
Takes a session and a clock; never commits.

A fabric runs to megabytes (a 10,000-GPU one is some 5 MB of JSON and seconds to validate), so the
parsed newest fabric is kept in memory by its digest: a node page asking where the node is plugged costs
a query for the digest, not a parse.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gpufleet.core.clock import Clock, to_datetime
from gpufleet.inventory.models import Node
from gpufleet.network.models import IbFabricReport
from gpufleet.network.schemas import FabricOut, FabricReporterOut, IbPeerOut, IbPortOut, IbSwitchOut, NodeLinkOut
from gpufleet.protocol.topology import IbAttachment, IbFabric

SEEN_BY = "ibnetdiscover"


def record_fabric(session: Session, clock: Clock, node_id: int, fabric: IbFabric) -> bool:
    """Keep `fabric` as node `node_id`'s latest report. Returns whether it differs from what that node
    reported before (an unchanged one only renews `reported_at`)."""
    now = to_datetime(clock.now())
    digest = fabric.digest()
    report = session.scalar(select(IbFabricReport).where(IbFabricReport.node_id == node_id))
    if report is not None and report.digest == digest:
        report.reported_at = now
        return False
    if report is None:
        report = IbFabricReport(node_id=node_id)
        session.add(report)
    report.digest = digest
    report.reported_at = now
    report.changed_at = now
    report.switches = len(fabric.switches)
    report.cas = len(fabric.cas)
    report.links = len(fabric.links)
    report.fabric = fabric.model_dump(mode="json")
    return True


@dataclass(frozen=True)
class _Newest:
    digest: str
    fabric: IbFabric
    by_host: dict[str, list[IbAttachment]]  # lower-cased host name -> its HCA ports' attachments


_lock = threading.Lock()
_cache: dict[str, _Newest] = {}  # "newest": the last fabric parsed


def _newest(session: Session) -> tuple[IbFabricReport, _Newest] | None:
    """The newest report (its row, its JSON loaded only where the cache lacks it) and its fabric."""
    report = session.scalar(
        select(IbFabricReport).order_by(IbFabricReport.reported_at.desc(), IbFabricReport.id.desc()).limit(1)
    )
    if report is None:
        return None
    with _lock:
        cached = _cache.get("newest")
    if cached is None or cached.digest != report.digest:
        fabric = IbFabric.model_validate(report.fabric)
        by_host: dict[str, list[IbAttachment]] = {}
        for attachment in fabric.attachments():
            if attachment.host:
                by_host.setdefault(attachment.host.lower(), []).append(attachment)
        cached = _Newest(report.digest, fabric, by_host)
        with _lock:
            _cache["newest"] = cached
    return report, cached


def _short(name: str | None) -> str:
    return (name or "").split(".", 1)[0].lower()


def node_links(session: Session, node: Node) -> list[NodeLinkOut]:
    """Where `node`'s HCAs are plugged, by the newest fabric: every HCA port whose NodeDescription names
    the node (by its name or host name, the domain ignored) and whose cable ends on a switch."""
    newest = _newest(session)
    if newest is None:
        return []
    by_host = newest[1].by_host
    names = dict.fromkeys(n for n in (_short(node.name), _short(node.hostname), (node.hostname or "").lower()) if n)
    found = next((by_host[name] for name in names if name in by_host), [])
    return [
        NodeLinkOut(
            interface=f"{a.device or a.ca_guid}/{a.ca_port}",
            switch=a.switch_description or a.switch_guid,
            switch_port=str(a.switch_port),
            system_name=a.switch_description or None,
            port_id=str(a.switch_port),
            seen_by=[SEEN_BY],
            switch_guid=a.switch_guid,
            rate=_rate(a.width, a.speed),
        )
        for a in found
    ]


def _rate(width: int | None, speed: str | None) -> str | None:
    if width is None and speed is None:
        return None
    return f"{width or '?'}x{speed or '?'}"


def fabric_view(session: Session) -> FabricOut:
    """The newest fabric: its switches with every cabled port and what is behind it (the registered node,
    where an HCA's host name is one), its CAs and links as reported, and every node that reports it."""
    reporters = [
        FabricReporterOut(
            node=name,
            digest=r.digest,
            reported_at=r.reported_at,
            changed_at=r.changed_at,
            switches=r.switches,
            cas=r.cas,
            links=r.links,
        )
        for r, name in session.execute(
            select(IbFabricReport, Node.name)
            .join(Node, Node.id == IbFabricReport.node_id)
            .order_by(IbFabricReport.reported_at.desc(), IbFabricReport.id.desc())
        )
    ]
    newest = _newest(session)
    if newest is None:
        return FabricOut(
            reported_by=None, reported_at=None, digest=None, switches=[], cas=[], links=[], reporters=reporters
        )
    report, parsed = newest
    fabric = parsed.fabric
    nodes = _nodes_by_host(session, {c.host() for c in fabric.cas} - {None})
    return FabricOut(
        reported_by=reporters[0].node,  # the same order: the newest report first
        reported_at=report.reported_at,
        digest=report.digest,
        switches=_switches(fabric, nodes),
        cas=fabric.cas,
        links=fabric.links,
        reporters=reporters,
    )


def _nodes_by_host(session: Session, hosts: set[str | None]) -> dict[str, str]:
    """Registered node names by the lower-cased host names an HCA description may carry."""
    wanted = {h.lower() for h in hosts if h}
    if not wanted:
        return {}
    found: dict[str, str] = {}
    rows = session.execute(
        select(Node.name, Node.hostname).where(
            func.lower(Node.name).in_(wanted) | func.lower(Node.hostname).in_(wanted)
        )
    )
    for name, hostname in rows:
        for key in (name.lower(), (hostname or "").lower()):
            if key in wanted:
                found.setdefault(key, name)
    return found


def _switches(fabric: IbFabric, nodes: dict[str, str]) -> list[IbSwitchOut]:
    switch_by_guid = {s.guid: s for s in fabric.switches}
    ca_by_guid = {c.guid: c for c in fabric.cas}
    ports: dict[str, list[IbPortOut]] = {s.guid: [] for s in fabric.switches}
    for link in fabric.links:
        for mine, theirs in ((link.a, link.b), (link.b, link.a)):
            if mine.guid not in switch_by_guid:
                continue
            peer_switch, peer_ca = switch_by_guid.get(theirs.guid), ca_by_guid.get(theirs.guid)
            if peer_switch is not None:
                peer = IbPeerOut(guid=theirs.guid, port=theirs.port, kind="switch", description=peer_switch.description)
            elif peer_ca is not None:
                host = peer_ca.host()
                peer = IbPeerOut(
                    guid=theirs.guid,
                    port=theirs.port,
                    kind=peer_ca.kind,
                    description=peer_ca.description,
                    host=host,
                    device=peer_ca.device(),
                    node=nodes.get(host.lower()) if host else None,
                )
            else:  # a node the output named but did not describe
                peer = IbPeerOut(guid=theirs.guid, port=theirs.port, kind="ca", description="")
            ports[mine.guid].append(
                IbPortOut(number=mine.port, peer=peer, width=link.width, speed=link.speed, rate_gbps=link.rate_gbps())
            )
    return [
        IbSwitchOut(
            guid=s.guid,
            description=s.description,
            lid=s.lid,
            port_count=s.port_count,
            ports=sorted(ports[s.guid], key=lambda p: p.number),
        )
        for s in sorted(fabric.switches, key=lambda s: (s.description, s.guid))
    ]
