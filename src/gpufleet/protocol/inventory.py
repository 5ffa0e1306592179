"""What an agent reports about its node: host facts, GPUs and the neighbours its ports see.

Limits on every field keep a malformed or hostile payload from growing the database:
the head rejects anything outside them with a 422 and stores nothing.

Fields added after the first release are left out of the JSON while they hold their default, so a head
older than the field (its NodeInventory forbids unknown keys) still takes the inventory of a node that
has nothing to say there, and the fingerprint of an unchanged inventory stays what it was.
"""

from __future__ import annotations

import hashlib
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    StringConstraints,
    model_serializer,
    model_validator,
)

from gpufleet.protocol.bounds import replace_nul
from gpufleet.protocol.mig import MAX_INSTANCES_PER_GPU, MigInstance
from gpufleet.protocol.topology import MAX_NEIGHBORS, LinkNeighbor

ShortText = Annotated[str, StringConstraints(max_length=256, strip_whitespace=True)]
Mode = Literal["enabled", "disabled"]

MAX_GPUS_PER_NODE = 64
GpuSource = Literal["nvml", "nvidia-smi", "simulated", "none"]


class GpuInfo(BaseModel):
    """One GPU as the driver describes it. Optional fields are None where the GPU or driver lacks them."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    index: int = Field(ge=0, lt=MAX_GPUS_PER_NODE)
    uuid: Annotated[str, StringConstraints(min_length=1, max_length=96)]
    model: Annotated[str, StringConstraints(min_length=1, max_length=128)]
    serial: ShortText | None = None
    pci_bus_id: Annotated[str, StringConstraints(min_length=1, max_length=32)]
    memory_total_mib: int = Field(ge=0, le=16 * 1024 * 1024)
    driver_version: ShortText | None = None
    cuda_version: ShortText | None = None
    vbios_version: ShortText | None = None
    mig_mode: Mode | None = None
    ecc_mode: Mode | None = None
    compute_capability: ShortText | None = None
    power_limit_w: float | None = Field(default=None, ge=0, le=100_000)
    # The MIG devices while MIG is on (protocol.mig); sent only when there are any.
    mig: list[MigInstance] = Field(default_factory=list, max_length=MAX_INSTANCES_PER_GPU)

    @model_validator(mode="after")
    def _unique_instances(self) -> GpuInfo:
        uuids = [m.uuid for m in self.mig]
        if len(set(uuids)) != len(uuids):
            raise ValueError("MIG device UUIDs must be unique")
        return self

    @model_serializer(mode="wrap")
    def _without_empty_mig(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if not self.mig:
            data.pop("mig", None)  # as before the field existed: older heads refuse unknown keys
        return data


class NodeInventory(BaseModel):
    """The inventory an agent sends on joining and again whenever it changes."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    hostname: Annotated[str, StringConstraints(min_length=1, max_length=253)]
    cpus: int = Field(ge=0, le=65_536)
    cpu_model: ShortText | None = None
    memory_total_mib: int = Field(ge=0, le=1 << 40)
    os_name: ShortText | None = None
    kernel: ShortText | None = None
    arch: ShortText | None = None
    agent_version: ShortText | None = None
    gpu_source: GpuSource = "none"
    gpus: list[GpuInfo] = Field(default_factory=list, max_length=MAX_GPUS_PER_NODE)
    # What the node's own lldpd hears on its ports (agent.topology.lldp); sent only when there is any.
    neighbors: list[LinkNeighbor] = Field(default_factory=list, max_length=MAX_NEIGHBORS)

    @model_validator(mode="before")
    @classmethod
    def _no_nul(cls, data: Any) -> Any:
        return replace_nul(data)  # stored whole: PostgreSQL's text holds no NUL (protocol.bounds)

    @model_validator(mode="after")
    def _unique_gpus(self) -> NodeInventory:
        indexes = [gpu.index for gpu in self.gpus]
        if len(set(indexes)) != len(indexes):
            raise ValueError("GPU indexes must be unique")
        return self

    @model_serializer(mode="wrap")
    def _without_empty_additions(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if not self.neighbors:
            data.pop("neighbors", None)  # as before the field existed: older heads refuse unknown keys
        return data

    def fingerprint(self) -> str:
        """A stable hash of the content, so both sides can tell cheaply whether it changed."""
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()
