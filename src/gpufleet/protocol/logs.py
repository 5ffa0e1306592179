"""Agent to head: the lines an agent read from its logs, each with its classification when it is an
event (gpufleet.logs.classify). Ordinary lines are kept too, so an admin can search them."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from gpufleet.protocol.metrics import XidAction

MAX_LINE_CHARS = 2048
MAX_RECORDS_PER_MESSAGE = 512


class LogLine(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    ts: float  # the line's own time when it says one, else when the agent read it
    source: Annotated[str, StringConstraints(max_length=128)]
    line: Annotated[str, StringConstraints(max_length=MAX_LINE_CHARS)]
    kind: Annotated[str, StringConstraints(max_length=32)] | None = None  # None: an ordinary line
    code: int | None = Field(default=None, ge=0, le=2**31 - 1)
    severity: Literal["info", "warning", "critical"] | None = None
    action: XidAction | None = None
    pci_bus: Annotated[str, StringConstraints(max_length=16)] | None = None
    device: Annotated[str, StringConstraints(max_length=64)] | None = None
    gpu: int | None = Field(default=None, ge=0, le=255)


class LogLines(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    type: Literal["logs"] = "logs"
    lines: list[LogLine] = Field(min_length=1, max_length=MAX_RECORDS_PER_MESSAGE)
