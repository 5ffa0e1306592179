"""API shapes for nodes. Field names are stable: scripts read them from `-o json`."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from gpufleet.inventory.states import NodeState
from gpufleet.protocol.inventory import GpuInfo

LabelKey = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$")]
LabelValue = Annotated[str, StringConstraints(max_length=256)]
Category = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")]


class NodeSettings(BaseModel):
    """What an admin sets on a node and what `node clone` copies."""

    model_config = ConfigDict(extra="forbid")

    category: Category | None = None
    labels: dict[LabelKey, LabelValue] = Field(default_factory=dict, max_length=64)


class NodesCreate(NodeSettings):
    names: list[Annotated[str, StringConstraints(min_length=1, max_length=4096)]] = Field(
        min_length=1, max_length=1000, description="node names or hostlist expressions such as gpu[001-016]"
    )
    network: str | None = Field(None, max_length=64, description="give each node the next free address here")


class NodeClone(BaseModel):
    model_config = ConfigDict(extra="forbid")

    names: list[Annotated[str, StringConstraints(min_length=1, max_length=4096)]] = Field(min_length=1, max_length=1000)


class NodeOut(BaseModel):
    name: str
    state: NodeState
    state_since: datetime
    gpu_count: int
    gpu_model: str | None
    hostname: str | None
    category: str | None
    labels: dict[str, Any]
    last_seen: datetime | None
    health: str = "unknown"  # healthy | degraded | failed | unknown (no metrics yet)
    health_reasons: list[str] = Field(default_factory=list)
    drain_reason: str | None = None  # set while the node is drained
    drained_by: str | None = None  # who drained it: an actor, "gpufleet", or "slurm:<user>" for a drain set in Slurm
    wlm_state: str | None = None  # the workload manager's word for it (Slurm: idle, mixed, drained, down*...)
    power_state: str | None = None  # what its BMC said last (gpufleet.power fills it in); None without a BMC


class GpuOut(GpuInfo):
    """A GPU in the fleet-wide list: its node, and its inventory as the node last reported it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    node: str
    node_state: NodeState


class TransitionOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    at: datetime
    from_state: NodeState
    to_state: NodeState
    reason: str


class SettingOut(BaseModel):
    """A node's value of one setting and where it came from: "default", "category" or "node"."""

    value: Any
    origin: str


class NodeDetail(NodeOut):
    created_at: datetime
    heartbeat_interval_s: float | None
    cpus: int | None
    cpu_model: str | None
    memory_total_mib: int | None
    os_name: str | None
    kernel: str | None
    arch: str | None
    agent_version: str | None
    gpu_source: str | None
    inventory_at: datetime | None
    gpus: list[GpuInfo]
    transitions: list[TransitionOut]
    # Every setting (inventory.categories) with its origin; the health policy in force is added by
    # the API as "health_policy" (its origin "category" or "default").
    settings: dict[str, SettingOut] = Field(default_factory=dict)
    # Held out of service by a workflow: "burn-in", "burn-in-failed", "maintenance" (lifecycle); and the
    # node's newest burn-in run with its steps, as GET /burn-ins/{id} gives it (the API adds it).
    hold: str | None = None
    burn_in: dict[str, Any] | None = None
