"""Job messages on the agent channel: the head starts and cancels job ranks, the agent reports them.

One job *run* (a job is run again when it is requeued) has one *rank* per node of its allocation.
Everything is keyed by (job_id, run, rank), so every message is idempotent: a `job_start` resent after
a reconnect starts nothing twice, and an update resent after a reconnect is recorded once.

- head -> agent: `job_start` (start a rank, unless it is already held), `job_cancel` (kill its process
  tree), `job_ack` (a rank's final update is durable: forget it).
- agent -> head: `job_update` (running, or exited with an outcome), `job_output` (stdout/stderr, by
  byte offset, so a chunk resent is stored once), `job_held` (after every welcome: the ranks this agent
  holds, so ranks lost with a restarted agent end at once instead of running forever on paper).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    StringConstraints,
    model_serializer,
)

from gpufleet.protocol.artifacts import MAX_STAGED, StageRef
from gpufleet.protocol.bounds import MAX_INT64

MAX_ARGV = 256
MAX_ARG_CHARS = 4096
MAX_SCRIPT_CHARS = 32 * 1024
MAX_ENV = 128
MAX_OUTPUT_CHUNK = 16 * 1024  # characters of output in one job_output message (well under the 64 KiB frame)
ENV_NAME_RE = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
# A job's PATH unless it sets its own, under any executor (the agent's, or Slurm's through gpufleet).
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

Outcome = Literal["completed", "failed", "cancelled", "timeout", "error"]
Stream = Literal["stdout", "stderr"]
Arg = Annotated[str, StringConstraints(max_length=MAX_ARG_CHARS)]
EnvName = Annotated[str, StringConstraints(pattern=ENV_NAME_RE)]
EnvValue = Annotated[str, StringConstraints(max_length=MAX_ARG_CHARS)]


class RankRef(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    # Bounded like the database's columns: an agent's report must never overflow one.
    job_id: int = Field(ge=1, le=MAX_INT64)
    run: int = Field(ge=1, le=2**31 - 1)
    rank: int = Field(ge=0, le=4095)


class JobStart(RankRef):
    """Start one rank of a job run. The agent runs `argv` (or `script` with /bin/sh when argv is empty)
    as `user`, with `CUDA_VISIBLE_DEVICES` set to `gpu_uuids`, and ends it after `time_limit_s`."""

    type: Literal["job_start"] = "job_start"
    name: Annotated[str, StringConstraints(max_length=128)] = ""
    world_size: int = Field(ge=1, le=4096)
    user: Annotated[str, StringConstraints(pattern=r"^[a-z_][a-z0-9_-]{0,31}$")]
    project: Annotated[str, StringConstraints(max_length=64)] = ""
    argv: list[Arg] = Field(default_factory=list, max_length=MAX_ARGV)
    script: Annotated[str, StringConstraints(max_length=MAX_SCRIPT_CHARS)] | None = None
    env: dict[EnvName, EnvValue] = Field(default_factory=dict, max_length=MAX_ENV)
    workdir: Annotated[str, StringConstraints(max_length=1024)] | None = None
    container: Annotated[str, StringConstraints(max_length=512)] | None = None
    gpu_indexes: list[int] = Field(default_factory=list, max_length=64)
    gpu_uuids: list[Annotated[str, StringConstraints(max_length=96)]] = Field(default_factory=list, max_length=64)
    cpus: int = Field(default=0, ge=0, le=4096)  # 0: no CPU limit
    mem_mib: int = Field(default=0, ge=0, le=MAX_INT64)  # 0: no memory limit
    time_limit_s: float = Field(gt=0)
    master_addr: Annotated[str, StringConstraints(max_length=255)] = ""
    master_port: int = Field(default=29500, ge=1, le=65535)
    # Models and datasets the agent stages into its node cache, checksum checked, before the rank starts.
    artifacts: list[StageRef] = Field(default_factory=list, max_length=MAX_STAGED)
    # An MPS replica (protocol.sharing): the agent starts its GPU's MPS control daemon first. Said by the
    # head, never read from the job's own variables, which any user sets.
    mps: bool = False

    @model_serializer(mode="wrap")
    def _without_default_mps(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        if not self.mps:
            data.pop("mps", None)  # as before the field existed: older agents refuse unknown keys
        return data


class JobCancel(RankRef):
    type: Literal["job_cancel"] = "job_cancel"
    reason: Annotated[str, StringConstraints(max_length=256)] = "cancelled"


class JobAck(RankRef):
    type: Literal["job_ack"] = "job_ack"


class JobUpdate(RankRef):
    """`running` once the processes started; `exited` with the outcome once they are all gone."""

    type: Literal["job_update"] = "job_update"
    state: Literal["running", "exited"]
    outcome: Outcome | None = None
    exit_code: int | None = Field(default=None, ge=-(2**31), le=2**31 - 1)
    message: Annotated[str, StringConstraints(max_length=512)] = ""


class JobOutput(RankRef):
    type: Literal["job_output"] = "job_output"
    stream: Stream
    offset: int = Field(ge=0, le=2**31 - 1)  # characters of this stream sent before this chunk
    data: Annotated[str, StringConstraints(max_length=MAX_OUTPUT_CHUNK)]


class JobHeld(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    type: Literal["job_held"] = "job_held"
    ranks: list[RankRef] = Field(default_factory=list, max_length=1024)
