"""API shapes for metrics, health, drains, faults, alerts, silences and receivers."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from gpufleet.protocol.metrics import FaultKind


class MetricPoint(BaseModel):
    ts: float
    value: float


class MetricSeries(BaseModel):
    node: str
    entity: str
    metric: str
    step_s: float
    points: list[MetricPoint]


class NodeHealth(BaseModel):
    node: str
    state: str  # up/down/new: liveness
    health: str
    reasons: list[str]
    since: datetime | None
    drained: bool
    drained_at: datetime | None
    drain_reason: str | None
    drained_by: str | None


class DrainRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: Annotated[str, StringConstraints(min_length=1, max_length=500)]


class FaultRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    action: Literal["inject", "heal"] = "inject"
    kind: FaultKind | None = None
    gpu: int | None = Field(default=None, ge=0, le=255)


class FaultOutcome(BaseModel):
    node: str
    ok: bool
    message: str


class AlertOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    rule: str
    severity: str
    status: str
    node_name: str
    gpu: int | None
    summary: str
    labels: dict[str, Any]
    starts_at: datetime
    ends_at: datetime | None
    acked_by: str | None
    acked_at: datetime | None
    silenced: bool


class SilenceCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rule: str | None = None
    node: str | None = None
    duration_s: int = Field(ge=60, le=90 * 86_400)
    comment: Annotated[str, StringConstraints(min_length=1, max_length=500)]


class SilenceOut(BaseModel):
    id: int
    rule: str | None
    node: str | None
    author: str
    comment: str
    created_at: datetime
    expires_at: datetime


class ReceiverOut(BaseModel):
    name: str
    type: str
    target: str  # where it sends, secrets masked


class AlertRuleIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, StringConstraints(min_length=1, max_length=64)]
    metric: Annotated[str, StringConstraints(min_length=1, max_length=64)]
    entity_kind: Literal["host", "gpu", "disk", "nic", "ib"]
    op: Literal[">", ">=", "<", "<=", "==", "!="]
    threshold: float
    for_s: float = Field(0, ge=0, le=86_400)
    severity: Literal["critical", "warning", "info"] = "warning"


class AlertRuleOut(AlertRuleIn):
    builtin: bool
    created_by: str | None


class HealthPolicyOut(BaseModel):
    category: str
    policy: dict[str, Any]
    updated_by: str
    updated_at: datetime


class ChartSeries(BaseModel):
    label: str
    values: list[float | None]  # one per time in Chart.t; None where nothing was measured


class Chart(BaseModel):
    """Series on one time axis, as a chart draws them (uPlot takes [t, values...] as is)."""

    title: str
    unit: str
    t: list[float]  # Unix seconds, ascending
    series: list[ChartSeries]
