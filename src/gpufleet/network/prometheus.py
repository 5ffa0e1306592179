"""The switches in Prometheus' format, named as snmp_exporter's `if_mib` module names them.

A Prometheus that already scrapes switches with snmp_exporter has dashboards and alert rules over
`ifHCInOctets`, `ifOperStatus` and the rest, labelled `ifIndex`, `ifName` and `ifAlias`: the same names here
let them work on gpufleet's polls. Values are the switch's own counters as last polled (Prometheus' `rate()`
handles their wrap and reset); the `switch` label names the switch, and `node` the node gpufleet found behind
the port (empty where none). `ifHCInOctets`/`ifHCOutOctets` are 64-bit counters; a switch that answered
only the 32-bit ones has `ifInOctets`/`ifOutOctets` instead, as snmp_exporter would show.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.metrics_core import Metric
from sqlalchemy import select
from sqlalchemy.orm import Session

from gpufleet.inventory.models import Node
from gpufleet.network.models import Switch, SwitchPort

# IF-MIB's ifOperStatus numbers (RFC 2863), which snmp_exporter exports as the value.
OPER_STATUS = {
    "up": 1,
    "down": 2,
    "testing": 3,
    "unknown": 4,
    "dormant": 5,
    "notPresent": 6,
    "lowerLayerDown": 7,
}
# counters key → (the 64-bit name, the 32-bit name, help)
COUNTER_NAMES = {
    "in_octets": ("ifHCInOctets", "ifInOctets", "octets received on the interface (IF-MIB)"),
    "out_octets": ("ifHCOutOctets", "ifOutOctets", "octets sent from the interface (IF-MIB)"),
    "in_errors": ("ifInErrors", "ifInErrors", "inbound packets with errors (IF-MIB)"),
    "out_errors": ("ifOutErrors", "ifOutErrors", "outbound packets not sent for errors (IF-MIB)"),
    "in_discards": ("ifInDiscards", "ifInDiscards", "inbound packets discarded without an error (IF-MIB)"),
    "out_discards": ("ifOutDiscards", "ifOutDiscards", "outbound packets discarded without an error (IF-MIB)"),
}


def switch_metrics(session: Session) -> Iterable[Metric]:
    """Every polled switch's ports, and each switch's sysUpTime, as metric families."""
    families: dict[str, Metric] = {}

    def add(name: str, doc: str, kind: str, labels: dict[str, str], value: float) -> None:
        family = families.get(name)
        if family is None:
            family = families[name] = Metric(name, doc, kind)
        family.add_sample(name, labels, value)

    switches = {s.id: s for s in session.scalars(select(Switch).where(Switch.polled_at.is_not(None)))}
    for polled in switches.values():
        if polled.uptime_s is not None:
            up_doc = "time since the switch's SNMP agent started, hundredths of a second (SNMPv2-MIB)"
            add("sysUpTime", up_doc, "gauge", {"switch": polled.name}, polled.uptime_s * 100)
    rows = session.execute(
        select(SwitchPort, Node.name).outerjoin(Node, Node.id == SwitchPort.node_id).order_by(SwitchPort.id)
    ).all()
    for port, node in rows:
        switch = switches.get(port.switch_id)
        if switch is None:
            continue
        labels = {
            "switch": switch.name,
            "ifIndex": str(port.if_index),
            "ifName": port.name,
            "ifAlias": port.alias,
            "node": node or "",
        }
        oper = OPER_STATUS.get(port.oper_status, OPER_STATUS["unknown"])
        add("ifOperStatus", "operational state: 1 up, 2 down, 7 lowerLayerDown... (IF-MIB)", "gauge", labels, oper)
        admin = 1 if port.admin_up else 2
        add("ifAdminStatus", "the interface's wanted state: 1 up, 2 down (IF-MIB)", "gauge", labels, admin)
        if port.speed_mbps is not None:
            add("ifHighSpeed", "the interface's speed, Mb/s (IF-MIB)", "gauge", labels, port.speed_mbps)
        counters = port.counters or {}
        wide = counters.get("counter_bits", 64) == 64
        for key, (hc_name, narrow_name, doc) in COUNTER_NAMES.items():
            if key in counters:
                add(hc_name if wide else narrow_name, doc, "counter", labels, counters[key])
    return list(families.values())
