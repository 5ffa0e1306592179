"""Messages on the agent channel (a WebSocket at /api/v1/agent/channel) and the join call.

The agent opens the channel with its node credential as a bearer token and then sends a
`hello` followed by a `heartbeat` every interval. The head answers `ack` for a heartbeat
only once its receipt is durable in the database, so an acknowledged heartbeat survives a
head restart. Malformed messages close the channel with a 4xxx code that carries the reason.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, TypeAdapter

from gpufleet.protocol.artifacts import NodeCache
from gpufleet.protocol.bounds import MAX_INT64
from gpufleet.protocol.inventory import NodeInventory
from gpufleet.protocol.jobs import JobAck, JobCancel, JobHeld, JobOutput, JobStart, JobUpdate
from gpufleet.protocol.logs import LogLines
from gpufleet.protocol.metrics import FaultCommand, NodeEvent, Sample
from gpufleet.protocol.mig import MigApply, MigResult

NODE_NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
NodeName = Annotated[str, StringConstraints(pattern=NODE_NAME_RE)]

# WebSocket close codes in the private range, mirroring HTTP status codes.
CLOSE_BAD_MESSAGE = 4400
CLOSE_UNAUTHORIZED = 4401
CLOSE_NODE_GONE = 4404
CLOSE_FORBIDDEN = 4403  # a message about another node's command, rank or GPU: refused and audited
CLOSE_REPLACED = 4409  # another connection of the same node took over
CLOSE_TOO_LARGE = 4413
CLOSE_UNSUPPORTED_DATA = 1003  # RFC 6455: a binary frame; the channel carries JSON in text frames
CLOSE_TRY_AGAIN = 1013  # RFC 6455 "try again later": the head could not take a message (its database was busy)
MAX_CHANNEL_MESSAGE_BYTES = 64 * 1024
# pydantic's error types for a number out of its bounds (NaN, ±infinity, beyond a column: see
# protocol.bounds). A message of a known type whose only faults are these is dropped and the channel stays
# open; any other fault (not JSON, an unknown type, a missing or extra field, a wrong type) closes it.
VALUE_ERRORS = frozenset({"finite_number", "greater_than", "greater_than_equal", "less_than", "less_than_equal"})
MAX_INVENTORY_BYTES = 256 * 1024


NODE_NAME_PATTERN = re.compile(NODE_NAME_RE)


def check_node_name(name: str) -> str:
    """Raise ValueError with the rule if `name` cannot be a node name."""
    if not NODE_NAME_PATTERN.fullmatch(name):
        raise ValueError(f"invalid node name {name!r}: use letters, digits, '.', '_' and '-' (at most 63)")
    return name


class JoinRequest(BaseModel):
    """Sent once, with the join token as bearer, to trade it for a per-node credential."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: NodeName
    inventory: NodeInventory | None = None


class JoinResponse(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False)

    node_id: int
    name: str
    credential: str
    heartbeat_interval_s: float


class Hello(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    type: Literal["hello"] = "hello"
    heartbeat_interval_s: float = Field(ge=0.05, le=3600)
    inventory_fingerprint: str | None = Field(default=None, max_length=64)


class Heartbeat(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    type: Literal["heartbeat"] = "heartbeat"
    seq: int = Field(ge=0, le=MAX_INT64)


class Metrics(BaseModel):
    """Samples, usually one; more when the agent catches up after a reconnect (oldest first)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    type: Literal["metrics"] = "metrics"
    samples: list[Sample] = Field(min_length=1, max_length=64)


class Events(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    type: Literal["events"] = "events"
    events: list[NodeEvent] = Field(min_length=1, max_length=256)


class FaultResult(BaseModel):
    """The agent's answer to a FaultCommand: applied, or refused with the reason."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    type: Literal["fault_result"] = "fault_result"
    id: int = Field(ge=0, le=MAX_INT64)
    ok: bool
    message: Annotated[str, StringConstraints(max_length=512)] = ""


AnyAgentMessage = (
    Hello
    | Heartbeat
    | Metrics
    | Events
    | LogLines
    | FaultResult
    | MigResult
    | JobUpdate
    | JobOutput
    | JobHeld
    | NodeCache
)
AgentMessage = Annotated[AnyAgentMessage, Field(discriminator="type")]
agent_message_adapter: TypeAdapter[AnyAgentMessage] = TypeAdapter(AgentMessage)


class Welcome(BaseModel):
    """The head's answer to `hello`: whether it wants the inventory re-sent."""

    model_config = ConfigDict(allow_inf_nan=False)

    type: Literal["welcome"] = "welcome"
    node: str
    inventory_wanted: bool


class Ack(BaseModel):
    """Every heartbeat up to and including `seq` is durable on the head."""

    model_config = ConfigDict(allow_inf_nan=False)

    type: Literal["ack"] = "ack"
    seq: int


AnyHeadMessage = Welcome | Ack | FaultCommand | MigApply | JobStart | JobCancel | JobAck
HeadMessage = Annotated[AnyHeadMessage, Field(discriminator="type")]
head_message_adapter: TypeAdapter[AnyHeadMessage] = TypeAdapter(HeadMessage)
