"""What the head must tell the agents: start the ranks placed on them, stop the ranks that must stop.

Every replica asks for the nodes whose channels it holds. A message is resent every `RESEND_S` until
the agent answers it (a `running` or `exited` update), which covers a message lost with a dropped
channel; the agent ignores a start or cancel it has already acted on.
"""

from __future__ import annotations

from collections.abc import Collection

from pydantic import ValidationError
from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from gpufleet.core.clock import Clock, to_datetime
from gpufleet.core.errors import describe
from gpufleet.inventory.models import Gpu, Node
from gpufleet.jobs import lifecycle
from gpufleet.jobs.models import Job, JobRank, RankState
from gpufleet.protocol.artifacts import StageRef
from gpufleet.protocol.jobs import JobCancel, JobStart
from gpufleet.protocol.sharing import device_uuid, mps_environment

RESEND_S = 5.0
# torchrun's rendezvous port on the rank-0 node: one per job id, in a range clear of the usual services.
MASTER_PORT_BASE = 29500
MASTER_PORT_SPAN = 10_000

Outgoing = list[tuple[int, JobStart | JobCancel]]  # (node id, message)


def master_port(job_id: int) -> int:
    return MASTER_PORT_BASE + job_id % MASTER_PORT_SPAN


def outgoing(session: Session, clock: Clock, node_ids: Collection[int]) -> Outgoing:
    """Messages due for these nodes; marks them sent. Due ranks' jobs are locked first (see
    lifecycle.lock_jobs), so a cancel cannot pass between reading a rank unsent and marking it sent."""
    if not node_ids:
        return []
    now = clock.now()
    due = to_datetime(now - RESEND_S)
    wanted = (
        JobRank.node_id.in_(list(node_ids)),
        JobRank.state != RankState.EXITED,
        or_(
            (JobRank.cancel.is_(None))
            & (JobRank.state == RankState.ASSIGNED)
            & (JobRank.sent_at.is_(None) | (JobRank.sent_at < due)),
            JobRank.cancel.is_not(None) & (JobRank.cancel_sent_at.is_(None) | (JobRank.cancel_sent_at < due)),
        ),
    )
    job_ids = list(session.scalars(select(JobRank.job_id).where(*wanted)))
    if not job_ids:
        return []
    lifecycle.lock_jobs(session, job_ids)
    ranks = session.scalars(select(JobRank).where(*wanted).execution_options(populate_existing=True))
    out: Outgoing = []
    masters: dict[int, str] = {}
    for rank in ranks:
        if rank.node_id is None:  # selected by node id; for the type checker
            continue
        if rank.cancel is not None:
            out.append((rank.node_id, JobCancel(job_id=rank.job_id, run=rank.run, rank=rank.rank, reason=rank.cancel)))
            rank.cancel_sent_at = to_datetime(now)
            continue
        try:
            start = _start(session, rank.job, rank, masters, now)
        except ValidationError as exc:
            # A job the message cannot carry (it passed submit's checks, so this is a bug): it fails
            # alone, instead of every start to this replica's nodes failing with it.
            lifecycle.exit_rank(session, clock, rank, "error", None, f"cannot send the job: {describe(exc)}", 0)
            continue
        out.append((rank.node_id, start))
        rank.sent_at = to_datetime(now)
    session.flush()
    return out


def _start(session: Session, job: Job, rank: JobRank, masters: dict[int, str], now: float) -> JobStart:
    if job.id not in masters:
        first = next(r for r in job.ranks if r.run == rank.run and r.rank == 0)
        host = session.scalar(select(Node.hostname).where(Node.id == first.node_id)) if first.node_id else None
        masters[job.id] = host or first.node
    return JobStart(
        job_id=job.id,
        run=rank.run,
        rank=rank.rank,
        name=job.name,
        world_size=job.nodes,
        user=job.user,
        project=job.project or "",
        argv=job.argv,
        script=job.script,
        env=job.env | _sharing_env(session, rank),
        workdir=job.workdir,
        container=job.container,
        gpu_indexes=rank.gpu_indexes,
        gpu_uuids=[device_uuid(u) for u in rank.gpu_uuids],  # a replica runs on its GPU
        cpus=job.cpus_per_node,
        mem_mib=job.mem_per_node_mib,
        # The agent counts the limit from when it starts the rank; the head's clock started at placement.
        time_limit_s=max(job.time_limit_s - _since_placed(job, now), 1.0),
        master_addr=masters[job.id],
        master_port=master_port(job.id),
        artifacts=[StageRef.model_validate(a) for a in job.artifacts],
        mps=any(u.find("@mps:") > 0 for u in rank.gpu_uuids),
    )


def _sharing_env(session: Session, rank: JobRank) -> dict[str, str]:
    """The MPS limits of a rank on MPS replicas (protocol.sharing); none for any other rank."""
    if not any("@mps:" in u for u in rank.gpu_uuids):
        return {}
    uuids = [device_uuid(u) for u in rank.gpu_uuids]
    query = select(Gpu.uuid, Gpu.memory_total_mib).where(Gpu.node_id == rank.node_id, Gpu.uuid.in_(uuids))
    memory: dict[str, int] = {row.uuid: row.memory_total_mib for row in session.execute(query)}
    return mps_environment(rank.gpu_uuids, memory)


def _since_placed(job: Job, now: float) -> float:
    return max(now - job.started_at.timestamp(), 0.0) if job.started_at is not None else 0.0
