"""The network's tables: `switches` (how to reach each over SNMP, its secrets sealed, what it said last),
`switch_ports` (each port's state, speed, counters, rates and who is plugged in), `node_neighbors`
(what each node's lldpd sees on its own ports), and `ib_fabrics` (the InfiniBand fabric as each reporting
node's ibnetdiscover saw it last)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Boolean, Float, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from gpufleet.core.db import Base, UTCDateTime


class Switch(Base):
    """A switch polled over SNMP. Its community (v2c) or its v3 keys are stored only sealed
    (`core.credentials`), never returned; the v3 user name and protocols are not secret and are shown."""

    __tablename__ = "switches"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    address: Mapped[str] = mapped_column(String(255))  # host name or IP address of the SNMP agent
    port: Mapped[int] = mapped_column(Integer, default=161)
    snmp_version: Mapped[str] = mapped_column(String(4))  # 2c | 3
    v3_user: Mapped[str | None] = mapped_column(String(64), default=None)
    v3_auth_protocol: Mapped[str | None] = mapped_column(String(16), default=None)
    v3_priv_protocol: Mapped[str | None] = mapped_column(String(16), default=None)
    # JSON of the secrets ({"community": ..} or {"auth_key": .., "priv_key": ..}), as one Fernet token.
    secrets_sealed: Mapped[str] = mapped_column(Text)
    # A port whose link runs below this (Mb/s) while something is plugged in is reported; None: not checked.
    expected_speed_mbps: Mapped[int | None] = mapped_column(Integer, default=None)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    # What the switch said last, and when; the last error reaching it (None after a good poll).
    sys_name: Mapped[str | None] = mapped_column(String(255), default=None)
    sys_descr: Mapped[str | None] = mapped_column(String(512), default=None)
    uptime_s: Mapped[float | None] = mapped_column(Float, default=None)
    sensors: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    polled_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None)
    last_error: Mapped[str | None] = mapped_column(String(512), default=None)


class SwitchPort(Base):
    """One interface of a switch (IF-MIB's ifIndex), as the last poll left it.

    Counters are kept as the switch gave them (for the Prometheus exposition, which carries them as
    snmp_exporter does); rates are per second over the last interval, None where there was none (the
    first poll, a wrap the width cannot explain, a restart of the switch)."""

    __tablename__ = "switch_ports"
    __table_args__ = (UniqueConstraint("switch_id", "if_index"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    switch_id: Mapped[int] = mapped_column(ForeignKey("switches.id", ondelete="CASCADE"), index=True)
    if_index: Mapped[int] = mapped_column(Integer)
    name: Mapped[str] = mapped_column(String(128))
    alias: Mapped[str] = mapped_column(String(256), default="")
    admin_up: Mapped[bool] = mapped_column(Boolean, default=False)
    oper_up: Mapped[bool] = mapped_column(Boolean, default=False)
    oper_status: Mapped[str] = mapped_column(String(32), default="unknown")
    speed_mbps: Mapped[int | None] = mapped_column(Integer, default=None)
    # When the port last went up or down, as seen by the head's polls.
    changed_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None)
    counters: Mapped[dict[str, float]] = mapped_column(JSON, default=dict)  # in_octets, out_errors, ...
    rates: Mapped[dict[str, float]] = mapped_column(JSON, default=dict)  # in_bps, in_errors_per_s, ...
    # Who is plugged in: the switch's LLDP neighbour, and the node it was matched to (either side's LLDP).
    neighbor_system: Mapped[str | None] = mapped_column(String(255), default=None)
    neighbor_port: Mapped[str | None] = mapped_column(String(255), default=None)
    neighbor_chassis: Mapped[str | None] = mapped_column(String(255), default=None)
    node_id: Mapped[int | None] = mapped_column(ForeignKey("nodes.id", ondelete="SET NULL"), default=None)
    node_interface: Mapped[str | None] = mapped_column(String(64), default=None)


class NodeNeighbor(Base):
    """A neighbour one of a node's ports sees over LLDP (the agent's `lldpctl`), as its last inventory said."""

    __tablename__ = "node_neighbors"

    id: Mapped[int] = mapped_column(primary_key=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"), index=True)
    interface: Mapped[str] = mapped_column(String(64))
    chassis_id: Mapped[str | None] = mapped_column(String(255), default=None)
    system_name: Mapped[str | None] = mapped_column(String(255), default=None)
    port_id: Mapped[str | None] = mapped_column(String(255), default=None)
    port_description: Mapped[str | None] = mapped_column(String(255), default=None)
    seen_at: Mapped[datetime] = mapped_column(UTCDateTime())


class IbFabricReport(Base):
    """The InfiniBand fabric one node's agent reported last (`protocol.topology.IbFabric`, as JSON). Every
    node on a fabric sees the same one, so only a few report it; the newest report is the fabric shown."""

    __tablename__ = "ib_fabrics"

    id: Mapped[int] = mapped_column(primary_key=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"), unique=True)
    digest: Mapped[str] = mapped_column(String(64))  # IbFabric.digest(): the same fabric, the same digest
    reported_at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)  # last sent, changed or not
    changed_at: Mapped[datetime] = mapped_column(UTCDateTime())  # when this node's fabric last differed
    switches: Mapped[int] = mapped_column(Integer, default=0)
    cas: Mapped[int] = mapped_column(Integer, default=0)
    links: Mapped[int] = mapped_column(Integer, default=0)
    # Megabytes on a large fabric: loaded only when read (network.fabric keeps the newest parsed).
    fabric: Mapped[dict[str, Any]] = mapped_column(JSON, deferred=True)
