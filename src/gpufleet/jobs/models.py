"""Tables of the built-in workload manager: jobs, their ranks (one per node of a run), and their output."""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Boolean, Enum, Float, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column, relationship

from gpufleet.core.db import Base, UTCDateTime, enum_values


class JobState(enum.StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMEOUT = "timeout"
    NODE_FAIL = "node_fail"


FINAL_STATES = frozenset(
    {JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT, JobState.NODE_FAIL}
)


class RankState(enum.StrEnum):
    ASSIGNED = "assigned"  # placed; job_start not yet confirmed by the agent
    RUNNING = "running"  # the agent said its processes run
    EXITED = "exited"  # the agent said they are all gone (or it lost them): the GPUs are free again


class Job(Base):
    __tablename__ = "jobs"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(128), default="")
    user: Mapped[str] = mapped_column(String(32), index=True)  # runs as this cluster user
    project: Mapped[str | None] = mapped_column(String(63), index=True, default=None)
    submitted_by: Mapped[str] = mapped_column(String(160))  # the actor, for the audit trail
    state: Mapped[JobState] = mapped_column(
        Enum(JobState, native_enum=False, length=16, values_callable=enum_values), index=True
    )
    # Why it waits (quota, budget, resources, priority, unschedulable) or how it ended.
    reason: Mapped[str] = mapped_column(String(512), default="")
    # The request.
    nodes: Mapped[int] = mapped_column(Integer, default=1)
    gpus_per_node: Mapped[int] = mapped_column(Integer, default=1)
    cpus_per_node: Mapped[int] = mapped_column(Integer, default=0)
    mem_per_node_mib: Mapped[int] = mapped_column(Integer, default=0)
    time_limit_s: Mapped[float] = mapped_column(Float)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    category: Mapped[str | None] = mapped_column(String(64), default=None)  # run only on this category's nodes
    argv: Mapped[list[str]] = mapped_column(JSON, default=list)
    script: Mapped[str | None] = mapped_column(Text, default=None)
    env: Mapped[dict[str, str]] = mapped_column(JSON, default=dict)
    workdir: Mapped[str | None] = mapped_column(String(1024), default=None)
    container: Mapped[str | None] = mapped_column(String(512), default=None)
    requeue: Mapped[bool] = mapped_column(Boolean, default=False)
    # The current run: 0 before the first start; a requeue starts run + 1 on other nodes.
    run: Mapped[int] = mapped_column(Integer, default=0)
    allocation: Mapped[dict[str, list[int]] | None] = mapped_column(JSON, default=None)
    submitted_at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None, index=True)
    exit_code: Mapped[int | None] = mapped_column(Integer, default=None)
    # Accounting: GPU-seconds held over all runs, and what the GPUs' samples said of their use
    # (monitoring.attribution): sampled GPU-seconds, and those weighted by utilization.
    gpu_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    sampled_gpu_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    busy_gpu_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    output_chars: Mapped[int] = mapped_column(Integer, default=0)
    # Who runs it: "builtin" (gpufleet's scheduler and agents) or "slurm". A Slurm job carries Slurm's job id
    # once submitted (None while gpufleet has yet to submit it); jobs submitted to Slurm directly are
    # listed too, with submitted_by "slurm".
    backend: Mapped[str] = mapped_column(String(16), default="builtin", server_default="builtin")
    external_id: Mapped[str | None] = mapped_column(String(64), default=None, index=True)
    partition: Mapped[str | None] = mapped_column(String(64), default=None)
    # The runtime environment it runs in ("name:version") and the driver that environment needs, copied at
    # submission so the scheduler reads one column and a later change to the catalog moves no queued job.
    environment: Mapped[str | None] = mapped_column(String(160), default=None)
    min_driver: Mapped[str | None] = mapped_column(String(32), default=None)
    # A MIG profile ("1g.18gb"): each of its gpus_per_node is an instance of it, not a whole GPU.
    gpu_profile: Mapped[str | None] = mapped_column(String(32), default=None)
    # The models and datasets it reads (protocol.artifacts.StageRef as dicts), copied at submission like the
    # environment: the agent stages them before the rank starts; the scheduler prefers nodes that hold them.
    artifacts: Mapped[list[dict[str, object]]] = mapped_column(JSON, default=list, server_default="[]")
    # A task of a job array (jobs.arrays): the array's job id (its first task's id, as Slurm's ArrayJobId),
    # this task's id within it, and how many of its tasks may run at once (None: no limit). All None for
    # a job of its own. Not a foreign key: an array is its tasks, with no row of its own.
    array_job_id: Mapped[int | None] = mapped_column(Integer, default=None, index=True)
    array_task_id: Mapped[int | None] = mapped_column(Integer, default=None)
    array_throttle: Mapped[int | None] = mapped_column(Integer, default=None)

    ranks: Mapped[list[JobRank]] = relationship(
        back_populates="job", cascade="all, delete-orphan", order_by="(JobRank.run, JobRank.rank)", lazy="selectin"
    )

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def mean_gpu_util(self) -> float | None:
        """Percent, over the samples of its GPUs while it held them; None before any sample."""
        if self.sampled_gpu_seconds <= 0:
            return None
        return round(100.0 * self.busy_gpu_seconds / self.sampled_gpu_seconds, 1)


class JobRank(Base):
    """One node's share of one run. It holds its GPUs until its agent says its processes are gone."""

    __tablename__ = "job_ranks"
    __table_args__ = (UniqueConstraint("job_id", "run", "rank"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    run: Mapped[int] = mapped_column(Integer)
    rank: Mapped[int] = mapped_column(Integer)
    node_id: Mapped[int | None] = mapped_column(ForeignKey("nodes.id", ondelete="SET NULL"), index=True)
    node: Mapped[str] = mapped_column(String(64))
    gpu_indexes: Mapped[list[int]] = mapped_column(JSON, default=list)
    gpu_uuids: Mapped[list[str]] = mapped_column(JSON, default=list)
    state: Mapped[RankState] = mapped_column(
        Enum(RankState, native_enum=False, length=16, values_callable=enum_values), index=True
    )
    outcome: Mapped[str | None] = mapped_column(String(16), default=None)
    exit_code: Mapped[int | None] = mapped_column(Integer, default=None)
    message: Mapped[str] = mapped_column(String(512), default="")
    assigned_at: Mapped[datetime] = mapped_column(UTCDateTime())  # it holds its GPUs from here until ended_at
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None)
    # Indexed: fair share and the usage report read the ranks that ended in a window.
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None, index=True)
    # Delivery: when job_start and job_cancel were last sent (resent until the agent answers).
    sent_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None)
    cancel: Mapped[str | None] = mapped_column(String(256), default=None)  # why it must stop, if it must
    cancel_sent_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None)

    job: Mapped[Job] = relationship(back_populates="ranks")


class JobOutputChunk(Base):
    __tablename__ = "job_output"
    __table_args__ = (UniqueConstraint("job_id", "run", "rank", "stream", "offset"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    run: Mapped[int] = mapped_column(Integer)
    rank: Mapped[int] = mapped_column(Integer)
    stream: Mapped[str] = mapped_column(String(8))
    offset: Mapped[int] = mapped_column(Integer)
    data: Mapped[str] = mapped_column(Text)
    at: Mapped[datetime] = mapped_column(UTCDateTime())


class Environment(Base):
    """A runtime environment jobs run in: a container image, or a Python environment present on the nodes,
    with the framework versions it carries and the NVIDIA driver it needs."""

    __tablename__ = "environments"
    __table_args__ = (UniqueConstraint("name", "version"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(63))
    version: Mapped[str] = mapped_column(String(32))
    image: Mapped[str | None] = mapped_column(String(512), default=None)  # a container image reference
    python_prefix: Mapped[str | None] = mapped_column(String(1024), default=None)  # a venv or conda prefix
    cuda: Mapped[str | None] = mapped_column(String(16), default=None)  # None: CPU only
    pytorch: Mapped[str | None] = mapped_column(String(32), default=None)
    cudnn: Mapped[str | None] = mapped_column(String(32), default=None)
    nccl: Mapped[str | None] = mapped_column(String(32), default=None)
    min_driver: Mapped[str | None] = mapped_column(String(32), default=None)  # None: needs no NVIDIA driver
    driver_given: Mapped[bool] = mapped_column(Boolean, default=False)  # False: from the CUDA driver table
    description: Mapped[str] = mapped_column(String(512), default="")
    created_by: Mapped[str] = mapped_column(String(160))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())

    @property
    def ref(self) -> str:
        return f"{self.name}:{self.version}"


class Artifact(Base):
    """A registered model (a checkpoint) or dataset: where it lies, what it hashes to, who may use it.

    `project` owns it; a job of another project may use it only when `shared_with` names that project. An
    artifact with no project is open to every job."""

    __tablename__ = "artifacts"
    __table_args__ = (UniqueConstraint("kind", "name", "version"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))  # model | dataset
    name: Mapped[str] = mapped_column(String(63))
    version: Mapped[str] = mapped_column(String(32))
    framework: Mapped[str | None] = mapped_column(String(32), default=None)  # models: pytorch, jax, ...
    format: Mapped[str | None] = mapped_column(String(32), default=None)  # safetensors, parquet, ...
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64), index=True)
    licence: Mapped[str] = mapped_column(String(64), default="")
    source: Mapped[str] = mapped_column(String(512), default="")  # where it came from (a hub id, a paper)
    location: Mapped[str] = mapped_column(String(1024))  # where the agents stage it from
    project: Mapped[str | None] = mapped_column(String(63), index=True, default=None)
    shared_with: Mapped[list[str]] = mapped_column(JSON, default=list)
    description: Mapped[str] = mapped_column(String(512), default="")
    created_by: Mapped[str] = mapped_column(String(160))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())

    @property
    def ref(self) -> str:
        return f"{self.name}:{self.version}"


class NodeArtifact(Base):
    """An artifact in a node's cache, as its agent last reported it (protocol.artifacts.NodeCache)."""

    __tablename__ = "node_artifacts"

    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"), primary_key=True)
    sha256: Mapped[str] = mapped_column(String(64), primary_key=True, index=True)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    copied_at: Mapped[datetime] = mapped_column(UTCDateTime())
    last_used_at: Mapped[datetime] = mapped_column(UTCDateTime())
    uses: Mapped[int] = mapped_column(Integer, default=0)


class InferenceService(Base):
    """A long-running model server: `replicas` jobs kept alive, replaced when they die or stop answering
    their health check, rolled one at a time to a new revision, and reached through the head's proxy."""

    __tablename__ = "inference_services"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(63), unique=True)
    project: Mapped[str | None] = mapped_column(String(63), index=True, default=None)
    user: Mapped[str] = mapped_column(String(32))  # its replicas run as this cluster user
    created_by: Mapped[str] = mapped_column(String(160))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    state: Mapped[str] = mapped_column(String(16), default="running")  # running | deleting
    replicas: Mapped[int] = mapped_column(Integer, default=1)
    # The replica job, as a JobSubmit's fields (argv or script, GPUs, environment, model, ...).
    spec: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    health_path: Mapped[str] = mapped_column(String(256), default="/health")
    revision: Mapped[int] = mapped_column(Integer, default=1)  # raised by each update; replicas roll to it
    restarts: Mapped[int] = mapped_column(Integer, default=0)  # replicas replaced after dying or failing health
    # Replicas in a row that ended before they ever passed a health check (a crash loop), and when the
    # next may start: new replicas back off 2, 4, 8 ... up to 300 seconds until one is healthy.
    crashes: Mapped[int] = mapped_column(Integer, default=0)
    retry_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None)
    message: Mapped[str] = mapped_column(String(512), default="")  # why it cannot start a replica, if it cannot


class ServiceReplica(Base):
    """One replica: the job that runs it, the revision it runs, and what its health check last said."""

    __tablename__ = "service_replicas"

    id: Mapped[int] = mapped_column(primary_key=True)
    service_id: Mapped[int] = mapped_column(ForeignKey("inference_services.id", ondelete="CASCADE"), index=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), unique=True)
    revision: Mapped[int] = mapped_column(Integer)
    port: Mapped[int] = mapped_column(Integer)
    address: Mapped[str | None] = mapped_column(String(300), default=None)  # host:port once placed
    healthy: Mapped[bool] = mapped_column(Boolean, default=False)
    ever_healthy: Mapped[bool] = mapped_column(Boolean, default=False)
    failures: Mapped[int] = mapped_column(Integer, default=0)  # health checks failed in a row
    checked_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
