"""Switches: register them, record what each poll said, fire the network's alerts, and join the topology.

Takes a session and a clock; never commits. The polling itself (SNMP, outside any transaction) is the
leader's loop in `workers.network_loops`; `record_poll` writes one switch's poll in one short transaction.

Topology: a switch port's node is found from either side. The switch's LLDP-MIB names the system behind
the port (a node's lldpd announces its host name), or a node's own lldpd names the switch (its sysName or
chassis) and the switch's port. Either is enough; both agreeing is the common case. A port where neither
says anything keeps the node last found there (LLDP ends with the link, and a port gone down must still say
whose link it was) until someone else is heard on it or that node's interface is found behind another port.
A node found behind a switch gets the topology label `switch` (which the scheduler uses to keep a job's nodes
under one leaf) unless an admin set that label to something that is not a registered switch.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from sqlalchemy import delete, func, or_, select
from sqlalchemy.orm import Session

from gpufleet.core.clock import Clock, to_datetime
from gpufleet.core.credentials import CredentialBox
from gpufleet.core.errors import Conflict, NotFound
from gpufleet.inventory.models import Node
from gpufleet.monitoring import alerts
from gpufleet.monitoring.models import Alert
from gpufleet.network import fabric
from gpufleet.network.models import NodeNeighbor, Switch, SwitchPort
from gpufleet.network.schemas import NodeLinkOut, PortOut, SwitchDetail, SwitchIn, SwitchOut
from gpufleet.network.snmp import LldpRemote, PortReading, SnmpCredential, SnmpTarget, SwitchReading
from gpufleet.protocol.topology import LinkNeighbor

TOPOLOGY_LABEL = "switch"  # jobs.tick reads it (TOPOLOGY_LABELS)
COUNTERS = ("in_octets", "out_octets", "in_errors", "out_errors", "in_discards", "out_discards")
MAX_NEIGHBORS_PER_NODE = 64


# -- registry -----------------------------------------------------------------------------------------
def add_switch(session: Session, clock: Clock, box: CredentialBox, spec: SwitchIn) -> Switch:
    """Register a switch, its secrets sealed. Raises Conflict for a name in use."""
    if session.scalar(select(Switch.id).where(Switch.name == spec.name)) is not None:
        raise Conflict(f"switch {spec.name} exists: remove it first to change it")
    secrets = {
        "community": spec.community.get_secret_value() if spec.community else None,
        "auth_key": spec.v3_auth_key.get_secret_value() if spec.v3_auth_key else None,
        "priv_key": spec.v3_priv_key.get_secret_value() if spec.v3_priv_key else None,
    }
    switch = Switch(
        name=spec.name,
        address=spec.address,
        port=spec.port,
        snmp_version=spec.version,
        v3_user=spec.v3_user,
        v3_auth_protocol=spec.v3_auth_protocol,
        v3_priv_protocol=spec.v3_priv_protocol,
        secrets_sealed=box.seal(json.dumps({k: v for k, v in secrets.items() if v is not None})),
        expected_speed_mbps=spec.expected_speed_mbps,
        created_at=to_datetime(clock.now()),
        sensors=[],
    )
    session.add(switch)
    session.flush()
    return switch


def get_switch(session: Session, name: str) -> Switch:
    switch = session.scalar(select(Switch).where(Switch.name == name))
    if switch is None:
        raise NotFound(f"no such switch: {name}")
    return switch


def remove_switch(session: Session, clock: Clock, name: str) -> list[Alert]:
    """Forget a switch and its ports; its firing alerts are resolved (nobody will see them end otherwise)."""
    switch = get_switch(session, name)
    firing = session.scalars(select(Alert).where(Alert.status == "firing", Alert.node_name == name)).all()
    ended = [alerts.end(clock, a) for a in firing if a.rule in SWITCH_RULES]
    session.delete(switch)
    return ended


def target(switch: Switch, box: CredentialBox, timeout_s: float, retries: int) -> SnmpTarget:
    """How to poll `switch`: its address and its credential, opened. Raises Conflict for secrets no key opens."""
    secrets = json.loads(box.open(switch.secrets_sealed))
    credential = SnmpCredential(
        version="3" if switch.snmp_version == "3" else "2c",
        community=secrets.get("community"),
        user=switch.v3_user,
        auth_protocol=switch.v3_auth_protocol,  # type: ignore[arg-type]  # checked by SwitchIn when stored
        auth_key=secrets.get("auth_key"),
        priv_protocol=switch.v3_priv_protocol,  # type: ignore[arg-type]
        priv_key=secrets.get("priv_key"),
    )
    return SnmpTarget(switch.address, switch.port, credential, timeout_s=timeout_s, retries=retries)


# -- what a poll says ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Poll:
    """One poll of one switch: what it said (or why it did not), and each port's rates over the interval
    since the previous poll (`network.counters`), by ifIndex; a port without rates has none this time."""

    reading: SwitchReading | None
    error: str | None = None
    rates: dict[int, dict[str, float]] = field(default_factory=dict)


@dataclass(frozen=True)
class Thresholds:
    error_quiet_s: float = 300.0  # errors must stop rising this long before their alert resolves


def record_poll(
    session: Session, clock: Clock, switch_id: int, poll: Poll, thresholds: Thresholds = Thresholds()
) -> list[Alert]:
    """Write one poll: the switch's facts, each port's state, counters and rates, who is behind each port;
    fire and resolve the switch's alerts. Returns the alerts that fired or resolved."""
    switch = session.get(Switch, switch_id)
    if switch is None:  # removed while it was being polled
        return []
    now = clock.now()
    if poll.reading is None:
        switch.last_error = (poll.error or "no answer")[:512]
        return _some([_fire_or_keep(session, clock, "SwitchUnreachable", switch, None, None, switch.last_error)])
    reading = poll.reading
    switch.sys_name = reading.sys_name[:255] or None
    switch.sys_descr = reading.sys_descr[:512] or None
    switch.uptime_s = reading.uptime_s
    switch.sensors = [
        {"name": s.name, "kind": s.kind, "value": s.value, "unit": s.unit, "ok": s.ok} for s in reading.sensors
    ]
    switch.polled_at = to_datetime(now)
    switch.last_error = None
    out: list[Alert | None] = [alerts.resolve(session, clock, "SwitchUnreachable", switch.name)]
    ports = {p.if_index: p for p in session.scalars(select(SwitchPort).where(SwitchPort.switch_id == switch.id))}
    remotes = _remotes_by_port(reading)
    behind = _nodes_behind(session, switch, reading)
    for port_reading in reading.ports:
        port = ports.pop(port_reading.index, None)
        if port is None:
            port = SwitchPort(switch_id=switch.id, if_index=port_reading.index, rates={}, counters={})
            session.add(port)
        was_up = port.oper_up if port.id is not None else None
        _update_port(port, port_reading, poll.rates.get(port_reading.index), now, was_up)
        remote = remotes.get(port_reading.name) or remotes.get(str(port_reading.index))
        port.neighbor_system = _cut(remote.system_name if remote else None)
        port.neighbor_port = _cut((remote.port_id or remote.port_description) if remote else None)
        port.neighbor_chassis = _cut(remote.chassis_id if remote else None)
        node, interface = behind.get(port_reading.name, (None, None))
        if node is None and remote is not None:
            node = _node_named(session, remote.system_name)
            interface = remote.port_description or remote.port_id
        if node is None and remote is None and port.node_id is not None and not _moved(session, port):
            # Nothing heard behind the port this time: it keeps the node last found there. LLDP stops with
            # the link (the node's lldpd and the switch's forget each other within seconds, often before a
            # poll sees the port down), but the cable and the node are where they were, and the port's alert
            # must say whose link it is. Someone else heard on the port, or the node's interface found
            # behind another port (moved), ends it.
            node = session.get(Node, port.node_id)
            interface = port.node_interface
        port.node_id = node.id if node is not None else None
        port.node_interface = _cut(interface, 64) if node is not None else None
        if node is not None:
            _label(session, node, switch.name)
        out += _port_alerts(session, clock, switch, port, was_up, node, thresholds, now)
    for gone in ports.values():  # ports the switch no longer lists (a line card removed)
        out += [alerts.resolve(session, clock, rule, switch.name, entity=_entity(gone)) for rule in PORT_RULES]
        session.delete(gone)
    out += _sensor_alerts(session, clock, switch, reading)
    return _some(out)


def _update_port(
    port: SwitchPort, reading: PortReading, rates: dict[str, float] | None, now: float, was_up: bool | None
) -> None:
    port.name = reading.name[:128]
    port.alias = (reading.alias or "")[:256]
    port.admin_up = reading.admin_up
    port.oper_status = reading.oper_status[:32]
    if was_up is None or was_up != reading.oper_up:
        port.changed_at = to_datetime(now)
    port.oper_up = reading.oper_up
    port.speed_mbps = reading.speed_mbps
    port.counters = {c: float(v) for c in COUNTERS if (v := getattr(reading, c)) is not None}
    port.counters["counter_bits"] = float(reading.counter_bits)  # the exposition's ifHCInOctets or ifInOctets
    errors_at = (port.rates or {}).get("errors_at")
    fresh = dict(rates or {})
    if rates and (rates.get("in_errors_per_s", 0.0) > 0 or rates.get("out_errors_per_s", 0.0) > 0):
        errors_at = now
    if errors_at is not None:
        fresh["errors_at"] = errors_at
    port.rates = fresh


# -- alerts ---------------------------------------------------------------------------------------------
PORT_RULES = ("SwitchPortDown", "SwitchPortErrors", "SwitchPortSlow")
SWITCH_RULES = ("SwitchUnreachable", "SwitchSensor", *PORT_RULES)


def _entity(port: SwitchPort) -> str:
    return f"port:{port.name}"


def _where(switch: Switch, port: SwitchPort, node: Node | None) -> str:
    behind = f" (node {node.name}" + (f" {port.node_interface}" if port.node_interface else "") + ")" if node else ""
    return f"switch {switch.name} port {port.name}{behind}"


def _labels(switch: Switch, port: SwitchPort | None, node: Node | None) -> dict[str, str]:
    labels = {"switch": switch.name}
    if port is not None:
        labels["port"] = port.name
    if node is not None:
        labels["behind"] = node.name
    return labels


def _fire_or_keep(
    session: Session,
    clock: Clock,
    rule: str,
    switch: Switch,
    port: SwitchPort | None,
    node: Node | None,
    summary: str,
    entity: str | None = None,
) -> Alert | None:
    return alerts.fire(
        session,
        clock,
        rule,
        node.id if node is not None else None,
        switch.name,
        summary,
        entity=entity if entity is not None else (_entity(port) if port is not None else None),
        labels=_labels(switch, port, node),
    )


def _port_alerts(
    session: Session,
    clock: Clock,
    switch: Switch,
    port: SwitchPort,
    was_up: bool | None,
    node: Node | None,
    thresholds: Thresholds,
    now: float,
) -> list[Alert | None]:
    entity = _entity(port)
    where = _where(switch, port, node)
    out: list[Alert | None] = []
    # Down: a port that was up went down, while an admin has not shut it. A port found down at its first
    # poll may simply be unused: not an alert.
    if not port.oper_up and port.admin_up and was_up:
        out.append(_fire_or_keep(session, clock, "SwitchPortDown", switch, port, node, f"{where} went down"))
    elif port.oper_up or not port.admin_up:
        out.append(alerts.resolve(session, clock, "SwitchPortDown", switch.name, entity=entity))
    errors_at = port.rates.get("errors_at")
    if errors_at is not None and now - errors_at < thresholds.error_quiet_s:
        if errors_at == now:
            per_s = port.rates.get("in_errors_per_s", 0.0) + port.rates.get("out_errors_per_s", 0.0)
            out.append(
                _fire_or_keep(
                    session, clock, "SwitchPortErrors", switch, port, node, f"{where}: errors rising, {per_s:.3g}/s"
                )
            )
    else:
        out.append(alerts.resolve(session, clock, "SwitchPortErrors", switch.name, entity=entity))
    expected = switch.expected_speed_mbps
    slow = port.oper_up and expected and port.speed_mbps and port.speed_mbps < expected and node is not None
    if slow:
        summary = f"{where} runs at {port.speed_mbps} Mb/s, below the expected {expected} Mb/s"
        out.append(_fire_or_keep(session, clock, "SwitchPortSlow", switch, port, node, summary))
    else:
        out.append(alerts.resolve(session, clock, "SwitchPortSlow", switch.name, entity=entity))
    return out


def _sensor_alerts(session: Session, clock: Clock, switch: Switch, reading: SwitchReading) -> list[Alert | None]:
    out: list[Alert | None] = []
    for sensor in reading.sensors:
        entity = f"sensor:{sensor.name}"[:128]
        if sensor.ok is False:
            value = f" ({sensor.value:g} {sensor.unit})" if sensor.value is not None else ""
            summary = f"switch {switch.name}: {sensor.kind} sensor {sensor.name} is not ok{value}"
            out.append(_fire_or_keep(session, clock, "SwitchSensor", switch, None, None, summary, entity=entity))
        else:
            out.append(alerts.resolve(session, clock, "SwitchSensor", switch.name, entity=entity))
    return out


def _some(found: Iterable[Alert | None]) -> list[Alert]:
    return [a for a in found if a is not None]


# -- topology -------------------------------------------------------------------------------------------
def _cut(value: str | None, size: int = 255) -> str | None:
    return value[:size] if value else None


def _short(name: str | None) -> str:
    return (name or "").split(".", 1)[0].lower()


def _remotes_by_port(reading: SwitchReading) -> dict[str, LldpRemote]:
    """The switch's LLDP neighbours by its local port's name (and by its port number, where the name is
    not an interface name)."""
    found: dict[str, LldpRemote] = {}
    for remote in reading.lldp:
        if remote.local_port:
            found.setdefault(remote.local_port, remote)
        found.setdefault(str(remote.local_port_num), remote)
    return found


def _node_named(session: Session, system_name: str | None) -> Node | None:
    """The node an LLDP system name is: by its name or its host name, the domain ignored."""
    short = _short(system_name)
    if not short:
        return None
    return session.scalar(
        select(Node).where((func.lower(Node.name) == short) | (func.lower(Node.hostname) == short)).limit(1)
    ) or session.scalar(select(Node).where(func.lower(Node.hostname) == (system_name or "").lower()).limit(1))


def _nodes_behind(session: Session, switch: Switch, reading: SwitchReading) -> dict[str, tuple[Node, str]]:
    """What nodes' own lldpd say about this switch (by its sysName or gpufleet's name for it, with or
    without a domain): its port name → (node, the node's interface)."""
    names = sorted({_short(reading.sys_name), _short(switch.name)} - {""})
    system = func.lower(NodeNeighbor.system_name)
    rows = session.execute(
        select(NodeNeighbor, Node)
        .join(Node, Node.id == NodeNeighbor.node_id)
        .where(system.in_(names) | or_(*(system.like(f"{name}.%") for name in names)))
    ).all()
    ports = {p.name for p in reading.ports}
    found: dict[str, tuple[Node, str]] = {}
    for neighbor, node in rows:
        for said in (neighbor.port_id, neighbor.port_description):
            if said in ports:
                found.setdefault(said, (node, neighbor.interface))
                break
    return found


def _moved(session: Session, port: SwitchPort) -> bool:
    """Whether the node's interface last found behind `port` is now found behind another port."""
    elsewhere = select(SwitchPort.id).where(
        SwitchPort.id != port.id,
        SwitchPort.node_id == port.node_id,
        SwitchPort.node_interface == port.node_interface,
    )
    return session.scalar(elsewhere.limit(1)) is not None


def _label(session: Session, node: Node, switch_name: str) -> None:
    """Give `node` the topology label of the switch it is behind, unless an admin gave it one naming
    something other than a registered switch (a rack, a leaf named another way)."""
    current = (node.labels or {}).get(TOPOLOGY_LABEL)
    if current == switch_name:
        return
    if current is not None and session.scalar(select(Switch.id).where(Switch.name == str(current))) is None:
        return
    node.labels = {**(node.labels or {}), TOPOLOGY_LABEL: switch_name}


def record_neighbors(session: Session, clock: Clock, node_id: int, neighbors: Sequence[LinkNeighbor]) -> None:
    """Replace what a node's lldpd said with its latest inventory (a node speaks only for its own ports)."""
    session.execute(delete(NodeNeighbor).where(NodeNeighbor.node_id == node_id))
    now = to_datetime(clock.now())
    for n in list(neighbors)[:MAX_NEIGHBORS_PER_NODE]:
        session.add(
            NodeNeighbor(
                node_id=node_id,
                interface=n.local_interface[:64],
                chassis_id=_cut(n.chassis_id),
                system_name=_cut(n.system_name),
                port_id=_cut(n.port_id),
                port_description=_cut(n.port_description),
                seen_at=now,
            )
        )


# -- views ----------------------------------------------------------------------------------------------
def _switch_out(switch: Switch, ports: Sequence[SwitchPort]) -> dict[str, object]:
    return {
        "name": switch.name,
        "address": switch.address,
        "port": switch.port,
        "version": switch.snmp_version,
        "v3_user": switch.v3_user,
        "v3_auth_protocol": switch.v3_auth_protocol,
        "v3_priv_protocol": switch.v3_priv_protocol,
        "expected_speed_mbps": switch.expected_speed_mbps,
        "sys_name": switch.sys_name,
        "sys_descr": switch.sys_descr,
        "uptime_s": switch.uptime_s,
        "polled_at": switch.polled_at,
        "last_error": switch.last_error,
        "ports_total": len(ports),
        "ports_up": sum(p.oper_up for p in ports),
        "nodes": len({p.node_id for p in ports if p.node_id is not None}),
        "sensors": switch.sensors or [],
    }


def list_switches(session: Session) -> list[SwitchOut]:
    switches = list(session.scalars(select(Switch).order_by(Switch.name)))
    ports: dict[int, list[SwitchPort]] = {s.id: [] for s in switches}
    for port in session.scalars(select(SwitchPort)):
        ports.setdefault(port.switch_id, []).append(port)
    return [SwitchOut.model_validate(_switch_out(s, ports[s.id])) for s in switches]


def switch_detail(session: Session, name: str) -> SwitchDetail:
    switch = get_switch(session, name)
    rows = session.execute(
        select(SwitchPort, Node)
        .outerjoin(Node, Node.id == SwitchPort.node_id)
        .where(SwitchPort.switch_id == switch.id)
        .order_by(SwitchPort.if_index)
    ).all()
    ports = [
        PortOut(
            if_index=p.if_index,
            name=p.name,
            alias=p.alias,
            admin_up=p.admin_up,
            oper_up=p.oper_up,
            oper_status=p.oper_status,
            speed_mbps=p.speed_mbps,
            changed_at=p.changed_at,
            rates={k: v for k, v in (p.rates or {}).items() if k != "errors_at"},
            neighbor_system=p.neighbor_system,
            neighbor_port=p.neighbor_port,
            node=node.name if node else None,
            node_interface=p.node_interface,
            node_state=node.state.value if node else None,
            node_health=node.health if node else None,
        )
        for p, node in rows
    ]
    return SwitchDetail.model_validate(_switch_out(switch, [p for p, _ in rows]) | {"ports": ports})


def node_links(session: Session, node_id: int) -> list[NodeLinkOut]:
    """Where a node is plugged: every switch port found with it behind, every neighbour its lldpd sees,
    one line per (interface, switch port), and every HCA port the newest InfiniBand fabric has it on."""
    links: dict[tuple[str | None, str | None], NodeLinkOut] = {}
    for port, switch in session.execute(
        select(SwitchPort, Switch).join(Switch, Switch.id == SwitchPort.switch_id).where(SwitchPort.node_id == node_id)
    ):
        links[(port.node_interface, port.name)] = NodeLinkOut(
            interface=port.node_interface,
            switch=switch.name,
            switch_port=port.name,
            system_name=switch.sys_name,
            port_id=port.name,
            seen_by=["switch"],
        )
    switch_names = {(_short(s.sys_name) or _short(s.name)): s.name for s in session.scalars(select(Switch))}
    for n in session.scalars(select(NodeNeighbor).where(NodeNeighbor.node_id == node_id)):
        port_name = n.port_id or n.port_description
        known = links.get((n.interface, port_name)) or links.get((n.interface, n.port_description))
        if known is not None:
            known.seen_by.append("node")
            continue
        links[(n.interface, port_name)] = NodeLinkOut(
            interface=n.interface,
            switch=switch_names.get(_short(n.system_name)),
            switch_port=port_name,
            system_name=n.system_name,
            port_id=n.port_id,
            seen_by=["node"],
        )
    node = session.get(Node, node_id)
    infiniband = fabric.node_links(session, node) if node is not None else []
    ethernet = sorted(links.values(), key=lambda link: (link.interface or "", link.switch_port or ""))
    return ethernet + infiniband
