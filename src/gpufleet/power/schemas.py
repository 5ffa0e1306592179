"""API shapes for BMCs and power. The BMC password is write-only: `BmcIn` takes it, nothing returns it."""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, StringConstraints

Hostlist = Annotated[str, StringConstraints(min_length=1, max_length=4096)]


class PowerAction(enum.StrEnum):
    STATUS = "status"
    ON = "on"
    OFF = "off"
    CYCLE = "cycle"
    RESET = "reset"


class BmcIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    protocol: Literal["redfish", "ipmi"]
    address: str = Field(
        min_length=1, max_length=512, description="Redfish: the BMC's URL (https://10.140.0.12); IPMI: host or address"
    )
    port: int | None = Field(None, ge=1, le=65535, description="IPMI's UDP port (default 623)")
    system_id: str | None = Field(
        None, min_length=1, max_length=256, description="Redfish system id; default: the BMC's only system"
    )
    username: str = Field(min_length=1, max_length=64)
    password: SecretStr = Field(min_length=1, max_length=256, description="stored encrypted, never returned")
    verify_tls: bool = Field(True, description="check the Redfish BMC's certificate")


class BmcOut(BaseModel):
    """A node's BMC as the API shows it: everything but the password."""

    node: str
    protocol: str
    address: str
    port: int | None
    system_id: str | None
    verify_tls: bool
    username: str
    password_set: bool = True
    updated_at: datetime
    power_state: str | None
    power_read_at: datetime | None
    last_error: str | None


class NodePowerOut(BaseModel):
    """One node's power as last read from its BMC (`bmc` is None for a node without one)."""

    node: str
    node_state: str
    bmc: Literal["redfish", "ipmi"] | None
    address: str | None
    power_state: str | None
    power_read_at: datetime | None
    last_error: str | None


class PowerRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    nodes: Hostlist = Field(description="node names or a hostlist expression such as gpu[001-032]")
    force: bool = Field(False, description="power off, cycle or reset nodes that run jobs")
    limit: int | None = Field(None, ge=1, le=1024, description="BMCs acted on at once (default: power_fanout)")
    stagger_s: float | None = Field(
        None, ge=0, le=60, description="seconds between power-ons, against inrush (default: power_stagger_s)"
    )


class PlanIn(PowerRequest):
    action: PowerAction


class PowerPlanOut(BaseModel):
    """What a power request does (the answer to a dry run)."""

    action: PowerAction
    nodes: list[str]
    hostlist: str
    limit: int
    stagger_s: float
    forced: dict[str, list[int]] = Field(
        default_factory=dict, description="nodes acted on although they run jobs (--force): node -> job ids"
    )
    steps: list[str] = Field(description="what would be sent to each BMC")
