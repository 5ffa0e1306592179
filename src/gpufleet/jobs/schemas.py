"""Jobs in and out of the API: the submit request, a job as listed and shown, output pages, usage rows."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from gpufleet.jobs.models import JobState
from gpufleet.protocol.jobs import MAX_ARGV, MAX_ENV, MAX_SCRIPT_CHARS, Arg, EnvName, EnvValue

# The job_start message must fit a 64 KiB channel frame with room to spare for the rest of it; counted
# as encoded JSON bytes (escapes and multi-byte characters included), not characters.
MAX_COMMAND_BYTES = 40 * 1024
MAX_NODES_PER_JOB = 1024
MAX_GPUS_PER_NODE = 64


class JobSubmit(BaseModel):
    """What `gpufleet job submit` sends. Either `argv` (run directly) or `script` (run by /bin/sh)."""

    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, StringConstraints(max_length=128)] = ""
    project: Annotated[str, StringConstraints(max_length=63)] | None = None
    user: Annotated[str, StringConstraints(max_length=32)] | None = None  # run as someone else: jobs:admin only
    nodes: int = Field(1, ge=1, le=MAX_NODES_PER_JOB)
    gpus_per_node: int = Field(1, ge=0, le=MAX_GPUS_PER_NODE)
    cpus_per_node: int = Field(0, ge=0, le=4096)
    mem_per_node_mib: int = Field(0, ge=0, le=64 * 1024 * 1024)
    time_limit_s: float | None = Field(None, gt=0)  # None: the head's job_default_time_limit_s
    priority: int = Field(0, ge=-1000, le=1000)  # above 0: jobs:admin only
    argv: list[Arg] = Field(default_factory=list, max_length=MAX_ARGV)
    script: Annotated[str, StringConstraints(max_length=MAX_SCRIPT_CHARS)] | None = None
    env: dict[EnvName, EnvValue] = Field(default_factory=dict, max_length=MAX_ENV)
    workdir: Annotated[str, StringConstraints(pattern=r"^/", max_length=1024)] | None = None
    container: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9/][A-Za-z0-9._/:@-]*$", max_length=512)] | None = (
        None
    )
    category: Annotated[str, StringConstraints(max_length=64)] | None = None
    requeue: bool = False  # run again elsewhere when a node fails, instead of ending node_fail

    @model_validator(mode="after")
    def _one_command(self) -> JobSubmit:
        if bool(self.argv) == bool(self.script):
            raise ValueError("give either a command (argv) or a script, not both and not neither")
        texts = [self.name, self.project, self.user, self.script, self.workdir, self.container, self.category]
        texts += [*self.argv, *self.env, *self.env.values()]
        if any("\x00" in t for t in texts if t):
            raise ValueError("NUL characters are not allowed")  # no process argument or database text holds one
        size = len(json.dumps({"argv": self.argv, "script": self.script, "env": self.env}).encode())
        if size > MAX_COMMAND_BYTES:
            raise ValueError(f"command, script and environment together exceed {MAX_COMMAND_BYTES} bytes")
        return self


class RankOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    run: int
    rank: int
    node: str
    gpu_indexes: list[int]
    gpu_uuids: list[str]
    state: str
    outcome: str | None
    exit_code: int | None
    message: str
    assigned_at: datetime
    started_at: datetime | None
    ended_at: datetime | None


class JobOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    name: str
    user: str
    project: str | None
    state: JobState
    reason: str
    nodes: int
    gpus_per_node: int
    cpus_per_node: int
    mem_per_node_mib: int
    time_limit_s: float
    priority: int
    category: str | None
    container: str | None
    requeue: bool
    run: int
    allocation: dict[str, list[int]] | None
    submitted_at: datetime
    started_at: datetime | None
    ended_at: datetime | None
    exit_code: int | None
    gpu_seconds: float
    mean_gpu_util: float | None  # percent, over the samples of its GPUs while it held them; None: none yet
    backend: str = "builtin"  # who runs it: builtin or slurm
    external_id: str | None = None  # Slurm's job id, once submitted there
    partition: str | None = None  # the Slurm partition it runs in


class JobDetail(JobOut):
    """One job in full. The command and environment are shown to its user and to job admins only."""

    submitted_by: str
    argv: list[str] | None
    script: str | None
    env: dict[str, str] | None
    workdir: str | None
    ranks: list[RankOut]


class OutputChunk(BaseModel):
    id: int
    run: int
    rank: int
    stream: str
    data: str


class OutputPage(BaseModel):
    """Output after a cursor. Follow with `after=next_after` until `done` (the job ended and all is read)."""

    chunks: list[OutputChunk]
    next_after: int
    done: bool
    state: JobState


class UsageRow(BaseModel):
    key: str  # the project, user or job id
    jobs: int
    gpu_hours: float
    mean_gpu_util: float | None


class UsageReport(BaseModel):
    since: datetime
    until: datetime
    by: str
    rows: list[UsageRow]


class IdleGpu(BaseModel):
    job_id: int
    user: str
    project: str | None
    node: str
    gpu: int
    gpu_util: float
    held_since: datetime
