"""Tables for nodes, their GPUs, their state history and their categories."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Boolean, Enum, Float, ForeignKey, Integer, String, UniqueConstraint, false
from sqlalchemy.orm import Mapped, mapped_column, relationship

from gpufleet.core.db import Base, UTCDateTime, enum_values
from gpufleet.inventory.states import NodeState


class Node(Base):
    __tablename__ = "nodes"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    state: Mapped[NodeState] = mapped_column(
        Enum(NodeState, native_enum=False, length=16, values_callable=enum_values), index=True
    )
    state_since: Mapped[datetime] = mapped_column(UTCDateTime())
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    # Settings that `node clone` copies.
    category: Mapped[str | None] = mapped_column(String(64), default=None)
    labels: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    # The node's own values of the category settings (inventory.categories): only the keys set here.
    settings: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    # Liveness: the last durable heartbeat receipt, and the agent's period.
    last_seen: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None)
    heartbeat_interval_s: Mapped[float | None] = mapped_column(Float, default=None)
    # Inventory as last reported by the agent.
    hostname: Mapped[str | None] = mapped_column(String(253), default=None)
    cpus: Mapped[int | None] = mapped_column(Integer, default=None)
    cpu_model: Mapped[str | None] = mapped_column(String(256), default=None)
    memory_total_mib: Mapped[int | None] = mapped_column(Integer, default=None)
    os_name: Mapped[str | None] = mapped_column(String(256), default=None)
    kernel: Mapped[str | None] = mapped_column(String(256), default=None)
    arch: Mapped[str | None] = mapped_column(String(64), default=None)
    agent_version: Mapped[str | None] = mapped_column(String(64), default=None)
    gpu_source: Mapped[str | None] = mapped_column(String(16), default=None)
    inventory_fingerprint: Mapped[str | None] = mapped_column(String(64), default=None)
    inventory_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None)
    # The most GPUs the node ever reported: a GPU that falls off the bus drops out of the inventory,
    # and must not drop out of what the node is expected to have.
    expected_gpus: Mapped[int] = mapped_column(Integer, default=0)
    # Health verdict (monitoring.health) and the reasons for it.
    health: Mapped[str] = mapped_column(String(16), default="unknown")
    health_reasons: Mapped[list[str]] = mapped_column(JSON, default=list)
    health_since: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None)
    # Drained: no new work lands here. A reason starting "gpufleet:" marks a drain gpufleet made
    # itself and may undo; any other drain is a person's and only a person resumes it.
    drained_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None)
    drain_reason: Mapped[str | None] = mapped_column(String(512), default=None)
    drained_by: Mapped[str | None] = mapped_column(String(128), default=None)
    # Held out of service by a workflow (lifecycle): "burn-in" (awaiting or running acceptance),
    # "burn-in-failed", "maintenance". A held node is drained too, and the health loop never resumes it:
    # only the workflow that holds it (or a person's resume) does.
    hold: Mapped[str | None] = mapped_column(String(32), default=None, index=True)
    # The workload manager's own word for the node when it is not gpufleet (Slurm: "idle", "mixed",
    # "drained", "down*"...), read every slurm_poll_interval_s; None under the built-in one.
    wlm_state: Mapped[str | None] = mapped_column(String(32), default=None)
    # MIG layouts (sharing.reconcile): when the head last asked the agent for one or the agent answered
    # (None: nothing asked since the last declaration), whether it answered, and what it could not apply,
    # by GPU index.
    mig_sent_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None)
    mig_answered: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    mig_errors: Mapped[dict[str, str]] = mapped_column(JSON, default=dict, server_default="{}")

    gpus: Mapped[list[Gpu]] = relationship(
        back_populates="node", cascade="all, delete-orphan", order_by="Gpu.index", lazy="selectin"
    )


class Category(Base):
    """A named group of nodes and the settings they inherit (inventory.categories). Nodes name their
    category in `nodes.category`, by name, so a node added to a category not created yet still works
    (the category is made for it)."""

    __tablename__ = "categories"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    description: Mapped[str] = mapped_column(String(512), default="")
    settings: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # only the keys set here
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())


class Gpu(Base):
    __tablename__ = "gpus"
    __table_args__ = (UniqueConstraint("node_id", "index"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"), index=True)
    index: Mapped[int] = mapped_column(Integer)
    uuid: Mapped[str] = mapped_column(String(96), index=True)
    model: Mapped[str] = mapped_column(String(128))
    serial: Mapped[str | None] = mapped_column(String(256), default=None)
    pci_bus_id: Mapped[str] = mapped_column(String(32))
    memory_total_mib: Mapped[int] = mapped_column(Integer)
    driver_version: Mapped[str | None] = mapped_column(String(256), default=None)
    cuda_version: Mapped[str | None] = mapped_column(String(256), default=None)
    vbios_version: Mapped[str | None] = mapped_column(String(256), default=None)
    mig_mode: Mapped[str | None] = mapped_column(String(16), default=None)
    ecc_mode: Mapped[str | None] = mapped_column(String(16), default=None)
    compute_capability: Mapped[str | None] = mapped_column(String(256), default=None)
    power_limit_w: Mapped[float | None] = mapped_column(Float, default=None)
    # The MIG devices while MIG is on, as the agent reported them (protocol.mig.MigInstance as dicts).
    mig: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list, server_default="[]")

    node: Mapped[Node] = relationship(back_populates="gpus")


class NodeTransition(Base):
    __tablename__ = "node_transitions"

    id: Mapped[int] = mapped_column(primary_key=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"), index=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)
    from_state: Mapped[NodeState] = mapped_column(
        Enum(NodeState, native_enum=False, length=16, values_callable=enum_values)
    )
    to_state: Mapped[NodeState] = mapped_column(
        Enum(NodeState, native_enum=False, length=16, values_callable=enum_values)
    )
    reason: Mapped[str] = mapped_column(String(512))
