"""GPU samples attributed to the jobs that held the GPUs: per-job utilization, and idle GPUs held by jobs.

Every `pass` (the leader's, every ATTRIBUTION_INTERVAL_S) reads each node's newest sample once
(`fleet.latest_gpu_values`) and, for every running rank (and every running Slurm job, by the nodes and
GPU indexes Slurm gave it), adds to its job the GPU-seconds since the last
pass that a fresh sample covers (`sampled_gpu_seconds`) and those weighted by the GPUs' utilization
(`busy_gpu_seconds`). Their ratio is the job's mean GPU utilization; summed per user or project it is
the usage report's. A MIG device or a shared replica counts as its share of the GPU (its slices / 7, or
1/N): its GPU's utilization, which NVML gives for the whole GPU only, weighs that much. A GPU whose node
sent no sample lately is not counted either way, so a silent node neither inflates nor deflates a job's
figure.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpufleet.inventory.mig_layouts import instance_fraction
from gpufleet.inventory.models import Node
from gpufleet.jobs.models import Job, JobRank, JobState, RankState
from gpufleet.jobs.schemas import IdleGpu
from gpufleet.monitoring.fleet import latest_gpu_values
from gpufleet.protocol.sharing import SHARED_PROFILE, share_of

ATTRIBUTION_INTERVAL_S = 10.0
# A sample older than this many metric intervals no longer says what a GPU is doing now.
FRESH_INTERVALS = 3
IDLE_UTIL_PCT = 5.0  # below this, a GPU a job holds counts as idle (the dashboard's threshold too)


@dataclass(frozen=True)
class HeldGpu:
    job: Job
    node: str
    index: int
    util: float
    since: datetime  # when the job's hold on the GPU began
    power_w: float | None = None
    share: float = 1.0  # of the GPU: less for a MIG device or a shared replica


def held_gpus(session: Session, now: float, metrics_interval_s: float) -> Iterator[HeldGpu]:
    """Every GPU a running job holds whose node sent a fresh sample, with its utilization: the built-in
    jobs' running ranks, and Slurm's running jobs by the nodes and GPU indexes Slurm gave them."""
    latest = latest_gpu_values(session, now - FRESH_INTERVALS * metrics_interval_s)
    rows = session.execute(
        select(JobRank, Job)
        .join(Job, Job.id == JobRank.job_id)
        .where(JobRank.state == RankState.RUNNING, Job.state == JobState.RUNNING, JobRank.run == Job.run)
    )
    for rank, job in rows:
        values = latest.get(rank.node_id or -1, {})
        since = rank.started_at or rank.assigned_at
        yield from _sampled(job, rank.node, values, rank.gpu_indexes, since, _shares(job, rank))
    slurm_jobs = list(
        session.scalars(
            select(Job).where(Job.backend == "slurm", Job.state == JobState.RUNNING, Job.allocation.is_not(None))
        )
    )
    if not slurm_jobs:
        return
    node_ids: dict[str, int] = dict(session.execute(select(Node.name, Node.id)).all())
    for job in slurm_jobs:
        for node, indexes in (job.allocation or {}).items():
            since = job.started_at or job.submitted_at
            yield from _sampled(job, node, latest.get(node_ids.get(node, -1), {}), indexes, since)


def _shares(job: Job, rank: JobRank) -> list[float]:
    """Each held GPU entry's share of its GPU (whole GPUs 1)."""
    if job.gpu_profile is None:
        return [1.0] * len(rank.gpu_indexes)
    if job.gpu_profile == SHARED_PROFILE:
        return [share_of(u) for u in rank.gpu_uuids]
    return [instance_fraction(job.gpu_profile)] * len(rank.gpu_indexes)


def _sampled(
    job: Job,
    node: str,
    values: dict[str, dict[str, float]],
    indexes: list[int],
    since: datetime,
    shares: list[float] | None = None,
) -> Iterator[HeldGpu]:
    for place, index in enumerate(indexes):
        gpu = values.get(f"gpu:{index}", {})
        util = gpu.get("gpu_util")
        if util is not None:
            share = shares[place] if shares is not None and place < len(shares) else 1.0
            yield HeldGpu(job, node, index, min(max(util, 0.0), 100.0), since, gpu.get("power_w"), share)


def attribute(
    session: Session, now: float, elapsed_s: float, metrics_interval_s: float, held: list[HeldGpu] | None = None
) -> int:
    """Charge `elapsed_s` of sampled and busy GPU time to every running job (`held`, when the caller read
    them already). Returns the GPUs counted."""
    if elapsed_s <= 0:
        return 0
    counted = 0
    for gpu in held if held is not None else list(held_gpus(session, now, metrics_interval_s)):
        gpu.job.sampled_gpu_seconds += elapsed_s * gpu.share
        gpu.job.busy_gpu_seconds += elapsed_s * gpu.share * gpu.util / 100.0
        counted += 1
    session.flush()
    return counted


def idle_gpus(
    session: Session, now: float, metrics_interval_s: float, below_pct: float = IDLE_UTIL_PCT
) -> list[IdleGpu]:
    """GPUs that running jobs hold and do not use: their newest fresh sample is under `below_pct` utilization."""
    out = [
        IdleGpu(
            job_id=held.job.id,
            user=held.job.user,
            project=held.job.project,
            node=held.node,
            gpu=held.index,
            gpu_util=held.util,
            held_since=held.since,
        )
        for held in held_gpus(session, now, metrics_interval_s)
        if held.util < below_pct
    ]
    out.sort(key=lambda g: (g.held_since, g.job_id, g.node, g.gpu))
    return out
