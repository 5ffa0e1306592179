"""Jobs in and out of the API: the submit request, a job as listed and shown, output pages, usage rows."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from gpufleet.jobs.arrays import MAX_SPEC_CHARS
from gpufleet.jobs.models import JobState
from gpufleet.protocol.jobs import MAX_ARGV, MAX_ENV, MAX_SCRIPT_CHARS, Arg, EnvName, EnvValue
from gpufleet.protocol.sharing import MPS_VARIABLES, SHARED_PROFILE

# The job_start message must fit a 64 KiB channel frame with room to spare for the rest of it; counted
# as encoded JSON bytes (escapes and multi-byte characters included), not characters.
MAX_COMMAND_BYTES = 40 * 1024
MAX_NODES_PER_JOB = 1024
MAX_GPUS_PER_NODE = 64


ImageRef = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9/][A-Za-z0-9._/:@-]*$", max_length=512)]
_ENV_NAME = r"[a-z0-9][a-z0-9._-]{0,62}"
_ENV_VERSION = r"[A-Za-z0-9][A-Za-z0-9._+-]{0,31}"
EnvironmentName = Annotated[str, StringConstraints(pattern=f"^{_ENV_NAME}$")]
EnvironmentVersion = Annotated[str, StringConstraints(pattern=f"^{_ENV_VERSION}$")]
EnvironmentRef = Annotated[str, StringConstraints(pattern=f"^{_ENV_NAME}(:{_ENV_VERSION})?$")]  # name[:version]
ArtifactName = Annotated[str, StringConstraints(pattern=f"^{_ENV_NAME}$")]
ArtifactRef = Annotated[str, StringConstraints(pattern=f"^{_ENV_NAME}(:{_ENV_VERSION})?$")]  # name[:version]
FrameworkVersion = Annotated[str, StringConstraints(pattern=r"^[0-9][A-Za-z0-9.+-]{0,31}$")]


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
    container: ImageRef | None = None
    category: Annotated[str, StringConstraints(max_length=64)] | None = None
    requeue: bool = False  # run again elsewhere when a node fails, instead of ending node_fail
    environment: EnvironmentRef | None = None  # run in this catalog environment ("name" or "name:version")
    model: ArtifactRef | None = None  # a registered model, staged to the node before the job starts
    datasets: list[ArtifactRef] = Field(default_factory=list, max_length=4)  # registered datasets, staged too
    # A job array in Slurm's syntax (`0-999`, `1,3,5-7`, `0-15:4`, with `%N` to run at most N at once):
    # one job per task, parsed with a clear error at submit (jobs.arrays).
    array: Annotated[str, StringConstraints(max_length=MAX_SPEC_CHARS)] | None = None
    # A MIG profile: each of gpus_per_node is then an instance of it ("1g.18gb"), not a whole GPU; or
    # "shared": a time-sliced or MPS replica of a GPU (protocol.sharing). One node.
    gpu_profile: Annotated[str, StringConstraints(pattern=r"^([1-8]g\.[0-9]{1,4}gb|shared)$")] | None = None

    @model_validator(mode="after")
    def _one_instance_job(self) -> JobSubmit:
        if self.gpu_profile is not None and (self.nodes != 1 or self.gpus_per_node < 1):
            raise ValueError(
                "a job of MIG instances or shared GPUs (gpu_profile) runs on one node and asks for 1 or more"
            )
        if self.gpu_profile == SHARED_PROFILE and self.gpus_per_node != 1:
            raise ValueError("a job of shared GPUs asks for one replica (two would be the same GPU twice)")
        if any(name.startswith(MPS_VARIABLES) for name in self.env):
            raise ValueError(f"{MPS_VARIABLES}* variables are gpufleet's, set for jobs on MPS replicas")
        return self

    @model_validator(mode="after")
    def _one_command(self) -> JobSubmit:
        if bool(self.argv) == bool(self.script):
            raise ValueError("give either a command (argv) or a script, not both and not neither")
        texts = [self.name, self.project, self.user, self.script, self.workdir, self.container, self.category]
        texts.append(self.array)
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
    environment: str | None = None  # the runtime environment it runs in (name:version)
    min_driver: str | None = None  # the NVIDIA driver that environment needs; it runs only where one is
    gpu_profile: str | None = None  # a MIG profile: its GPUs are instances of it
    # A task of a job array: the array's job id (its first task's id), this task's id, how many of the
    # array's tasks may run at once, and how many tasks the array has.
    array_job_id: int | None = None
    array_task_id: int | None = None
    array_throttle: int | None = None
    array_tasks: int | None = None
    # A listed row that stands for its array's pending tasks (GET /jobs without expand): their task ids,
    # compact as `5-999` or `1,3,5-7`, and how many they are. None on every other row.
    array_pending: str | None = None
    array_pending_count: int | None = None


class JobDetail(JobOut):
    """One job in full. The command and environment are shown to its user and to job admins only."""

    submitted_by: str
    argv: list[str] | None
    script: str | None
    env: dict[str, str] | None
    workdir: str | None
    ranks: list[RankOut]


class ArrayCancelled(BaseModel):
    """What cancelling a whole job array did."""

    array_job_id: int
    cancelled: int  # tasks that had not ended and now have
    tasks: int  # tasks the array has


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


class EnvironmentIn(BaseModel):
    """A runtime environment to add: a container image or a Python environment on the nodes (one of them),
    the framework versions it carries, and the NVIDIA driver it needs (default: its CUDA's, `protocol.cuda`)."""

    model_config = ConfigDict(extra="forbid")

    name: EnvironmentName
    version: EnvironmentVersion
    image: ImageRef | None = None
    python_prefix: Annotated[str, StringConstraints(pattern=r"^/[A-Za-z0-9._/+-]*$", max_length=1024)] | None = None
    # None: a CPU-only environment (a service's tokenizer, data preparation), which needs no NVIDIA driver.
    cuda: Annotated[str, StringConstraints(pattern=r"^\d{1,2}\.\d{1,2}(\.\d{1,4})?$")] | None = None
    pytorch: FrameworkVersion | None = None
    cudnn: FrameworkVersion | None = None
    nccl: FrameworkVersion | None = None
    min_driver: Annotated[str, StringConstraints(pattern=r"^\d{1,4}(\.\d{1,4}){0,2}$")] | None = None
    description: Annotated[str, StringConstraints(max_length=512)] = ""

    @model_validator(mode="after")
    def _one_runtime(self) -> EnvironmentIn:
        if (self.image is None) == (self.python_prefix is None):
            raise ValueError("give either a container image or a Python environment prefix, not both and not neither")
        if "\x00" in self.description:
            raise ValueError("NUL characters are not allowed")
        return self


class EnvironmentOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    name: str
    version: str
    ref: str
    image: str | None
    python_prefix: str | None
    cuda: str | None
    pytorch: str | None
    cudnn: str | None
    nccl: str | None
    min_driver: str | None
    driver_given: bool
    description: str
    created_by: str
    created_at: datetime
    compatible_nodes: int | None = None  # how many nodes can run it now: driver new enough, taking jobs


class NodeFitOut(BaseModel):
    node: str
    driver: str | None
    ok: bool = Field(description="its driver runs the environment")
    takes_jobs: bool = Field(description="it takes jobs now: up, not drained, not failed")
    reason: str


class EnvironmentCheck(BaseModel):
    environment: EnvironmentOut
    nodes: list[NodeFitOut]


ProjectName = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_-]{0,62}$")]
_Label = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,31}$")]


class ArtifactIn(BaseModel):
    """A model or dataset to register. `sha256` and `size_bytes` are what the CLI computed from `location`
    (`protocol.artifacts.digest`); every node checks its copy against them."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["model", "dataset"]
    name: ArtifactName
    version: EnvironmentVersion
    location: Annotated[str, StringConstraints(min_length=1, max_length=1024)]
    sha256: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
    size_bytes: int = Field(ge=0, le=2**62)
    framework: _Label | None = None
    format: _Label | None = None
    licence: Annotated[str, StringConstraints(max_length=64)] = ""
    source: Annotated[str, StringConstraints(max_length=512)] = ""
    project: ProjectName | None = None
    shared_with: list[ProjectName] = Field(default_factory=list, max_length=64)
    description: Annotated[str, StringConstraints(max_length=512)] = ""

    @model_validator(mode="after")
    def _plain_text(self) -> ArtifactIn:
        if any("\x00" in t for t in (self.location, self.licence, self.source, self.description)):
            raise ValueError("NUL characters are not allowed")
        return self


class ArtifactOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    kind: str
    name: str
    version: str
    ref: str
    framework: str | None
    format: str | None
    size_bytes: int
    sha256: str
    licence: str
    source: str
    location: str
    project: str | None
    shared_with: list[str]
    description: str
    created_by: str
    created_at: datetime
    nodes: list[str] = Field(default_factory=list)  # the nodes whose cache holds it
    location_hidden: bool = False  # the reader's projects may not use it, so its location is not shown


class NodeArtifactOut(BaseModel):
    """One entry of a node's cache, with the registered artifacts it is (none: unregistered since)."""

    sha256: str
    size_bytes: int
    copied_at: datetime
    last_used_at: datetime
    uses: int
    artifacts: list[str]  # "model name:version", "dataset name:version"


ServiceName = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9-]{0,62}$")]
MAX_REPLICAS = 64


class ServiceCreate(BaseModel):
    """An inference service: `replicas` copies of the `replica` job, each listening on the port the agent
    gives it in $GPUFLEET_SERVICE_PORT and answering `health_path` with 200 once it can serve."""

    model_config = ConfigDict(extra="forbid")

    name: ServiceName
    replicas: int = Field(1, ge=1, le=MAX_REPLICAS)  # scale to 0 later to pause it
    health_path: Annotated[str, StringConstraints(pattern=r"^/[A-Za-z0-9._~/-]{0,255}$")] = "/health"
    # How long a new replica may take to pass its first health check (loading a model) before it is replaced.
    startup_s: float = Field(600.0, gt=0, le=86_400)
    replica: JobSubmit

    @model_validator(mode="after")
    def _one_node(self) -> ServiceCreate:
        if self.replica.nodes != 1:
            raise ValueError("a replica runs on one node; scale out with replicas")
        if self.replica.array is not None:
            raise ValueError("a replica is one job, not a job array; scale out with replicas")
        return self


class ServiceChange(BaseModel):
    """A rolling update: what changes in the replicas (the rest stays). Replicas move to the new revision
    one at a time, each old one stopped only once a new one passes its health check."""

    model_config = ConfigDict(extra="forbid")

    model: ArtifactRef | None = None
    environment: EnvironmentRef | None = None
    argv: list[Arg] | None = Field(None, max_length=MAX_ARGV)
    script: Annotated[str, StringConstraints(max_length=MAX_SCRIPT_CHARS)] | None = None
    env: dict[EnvName, EnvValue] | None = Field(None, max_length=MAX_ENV)


class ServiceScale(BaseModel):
    model_config = ConfigDict(extra="forbid")

    replicas: int = Field(ge=0, le=MAX_REPLICAS)


class ReplicaOut(BaseModel):
    job_id: int
    revision: int
    state: str  # the job's: pending, running
    node: str | None
    address: str | None
    healthy: bool
    failures: int
    checked_at: datetime | None


class ServiceOut(BaseModel):
    name: str
    project: str | None
    user: str
    replicas: int
    ready: int  # replicas passing their health check
    revision: int
    restarts: int
    message: str
    model: str | None
    environment: str | None
    gpus_per_replica: int
    health_path: str
    endpoint: str  # where to call it: the head's /services/NAME/
    created_by: str
    created_at: datetime
    replica_list: list[ReplicaOut] = Field(default_factory=list)
    # Calls through this head in the last minute: requests_per_s, p50_ms, p99_ms, errors (share of 5xx).
    stats: dict[str, float | None] = Field(default_factory=dict)
