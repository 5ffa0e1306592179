"""How a job moves once submitted: placement, the agents' reports, cancel, node failures, time limits.

The one rule behind all of it: a rank holds its GPUs until its agent says its processes are gone (or
that it holds no such rank). A job may end at once (cancelled, node_fail, timeout, failed) while its
ranks are still being killed; the scheduler keeps their GPUs out of use until then, so no job ever
starts on a GPU another job's processes still run on.

Functions take a session and a clock and never commit; each returns what the caller must do next
(ranks to tell the agents about), never sends anything itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from gpufleet.core.clock import Clock, to_datetime
from gpufleet.core.errors import Conflict, Forbidden, NotFound
from gpufleet.inventory.models import Node
from gpufleet.jobs.models import FINAL_STATES, Job, JobRank, JobState, RankState
from gpufleet.protocol.jobs import JobUpdate, RankRef

# How long past its time limit a running job may go unreported before the head ends it itself (the
# agent enforces the limit; this is for an agent that cannot say so).
TIMEOUT_GRACE_S = 60.0


def get_job(session: Session, job_id: int) -> Job:
    job = session.get(Job, job_id)
    if job is None:
        raise NotFound(f"no such job: {job_id}")
    return job


def place(session: Session, clock: Clock, job: Job, allocation: Mapping[str, Sequence[int]]) -> list[JobRank]:
    """Start a new run of a pending job on these GPUs ({node name: GPU indexes}, rank order)."""
    now = to_datetime(clock.now())
    nodes = {n.name: n for n in session.scalars(select(Node).where(Node.name.in_(list(allocation))))}
    job.run += 1
    job.state = JobState.RUNNING
    job.reason = ""
    job.started_at = now
    job.allocation = {name: list(gpus) for name, gpus in allocation.items()}
    ranks = []
    for rank, (name, gpus) in enumerate(allocation.items()):
        node = nodes[name]
        uuids = {g.index: g.uuid for g in node.gpus}
        ranks.append(
            JobRank(
                job_id=job.id,
                run=job.run,
                rank=rank,
                node_id=node.id,
                node=name,
                gpu_indexes=list(gpus),
                gpu_uuids=[uuids.get(i, "") for i in gpus],
                state=RankState.ASSIGNED,
                assigned_at=now,
            )
        )
    session.add_all(ranks)
    session.flush()
    return ranks


def cancel(session: Session, clock: Clock, job_id: int, actor: str, *, user: str | None, admin: bool) -> Job:
    """Cancel a pending or running job. Its user or a job admin may; others get Forbidden."""
    job = get_job(session, job_id)
    if not admin and job.user != user:
        raise Forbidden(f"job {job_id} belongs to {job.user}; only its user or a job admin may cancel it")
    if job.state in FINAL_STATES:
        raise Conflict(f"job {job_id} has already ended ({job.state.value})")
    finish(session, clock, job, JobState.CANCELLED, f"cancelled by {actor}")
    return job


def finish(
    session: Session, clock: Clock, job: Job, state: JobState, reason: str, exit_code: int | None = None
) -> None:
    """End the job; every rank of it still holding GPUs is told to stop (and holds them until it has)."""
    now = clock.now()
    _charge_run(job, now)
    job.state = state
    job.reason = reason[:512]
    job.exit_code = exit_code
    job.ended_at = to_datetime(now)
    stop_ranks(job, f"job {state.value}", now)


def stop_ranks(job: Job, why: str, now: float) -> None:
    """Tell every rank still holding GPUs to stop. One whose job_start was never sent never ran: it lets
    go of its GPUs at once."""
    for rank in job.ranks:
        if rank.state is RankState.EXITED or rank.cancel is not None:
            continue
        rank.cancel = why[:256]
        if rank.state is RankState.ASSIGNED and rank.sent_at is None:
            rank.state = RankState.EXITED
            rank.outcome = "cancelled"
            rank.message = "stopped before it was started"
            rank.ended_at = to_datetime(now)


def _charge_run(job: Job, now: float) -> None:
    """Add the current run's GPU-seconds (placement to now) to the job's total."""
    if job.state is JobState.RUNNING and job.started_at is not None:
        job.gpu_seconds += job.gpus * max(now - job.started_at.timestamp(), 0.0)


def fail_run(session: Session, clock: Clock, job: Job, reason: str, max_requeues: int) -> None:
    """A node of the job's current run failed: requeue the job if it asked for it and may, else node_fail."""
    if job.requeue and job.run <= max_requeues:
        _charge_run(job, clock.now())
        stop_ranks(job, "requeued", clock.now())
        job.state = JobState.PENDING
        job.reason = f"requeued: {reason}"[:512]
        job.allocation = None
        job.started_at = None
        return
    finish(session, clock, job, JobState.NODE_FAIL, reason)


def rank_update(session: Session, clock: Clock, node_id: int, update: JobUpdate, max_requeues: int) -> bool:
    """Record an agent's report on one of its ranks. Returns whether it was recorded (a report about a rank
    this node does not hold is ignored: a node may speak only for its own ranks)."""
    rank = _rank(session, node_id, update)
    if rank is None:
        return False
    now = clock.now()
    if update.state == "running":
        if rank.state is RankState.ASSIGNED:
            rank.state = RankState.RUNNING
            rank.started_at = to_datetime(now)
        return True
    if rank.state is not RankState.EXITED:  # else a report resent after a reconnect
        exit_rank(session, clock, rank, update.outcome or "error", update.exit_code, update.message, max_requeues)
    return True


def exit_rank(
    session: Session,
    clock: Clock,
    rank: JobRank,
    outcome: str,
    exit_code: int | None,
    message: str,
    max_requeues: int,
) -> None:
    """The rank's processes are gone: its GPUs are free, and its job may end with it."""
    rank.state = RankState.EXITED
    rank.outcome = outcome
    rank.exit_code = exit_code
    rank.message = message[:512]
    rank.ended_at = to_datetime(clock.now())
    job = rank.job
    if job.state is JobState.RUNNING and job.run == rank.run:
        _rank_ended(session, clock, job, rank, max_requeues)


def _rank_ended(session: Session, clock: Clock, job: Job, rank: JobRank, max_requeues: int) -> None:
    where = f"rank {rank.rank} on {rank.node}"
    detail = f": {rank.message}" if rank.message else ""
    if rank.outcome == "completed":
        current = [r for r in job.ranks if r.run == job.run]
        if all(r.state is RankState.EXITED and r.outcome == "completed" for r in current):
            finish(session, clock, job, JobState.COMPLETED, "", exit_code=0)
    elif rank.outcome == "timeout":
        finish(session, clock, job, JobState.TIMEOUT, f"time limit of {job.time_limit_s:.0f}s reached ({where})")
    elif rank.outcome == "lost":
        fail_run(session, clock, job, f"{where} was lost{detail}", max_requeues)
    elif rank.outcome == "failed":
        finish(
            session, clock, job, JobState.FAILED, f"{where} exited with code {rank.exit_code}{detail}", rank.exit_code
        )
    else:  # error (could not start), or stopped on the node without the head asking
        finish(session, clock, job, JobState.FAILED, f"{where}: {rank.outcome}{detail}", rank.exit_code)


def _rank(session: Session, node_id: int, ref: RankRef) -> JobRank | None:
    return session.scalar(
        select(JobRank).where(
            JobRank.job_id == ref.job_id, JobRank.run == ref.run, JobRank.rank == ref.rank, JobRank.node_id == node_id
        )
    )


def ranks_held(session: Session, clock: Clock, node_id: int, held: Iterable[RankRef], max_requeues: int) -> None:
    """Reconcile with the ranks an agent says it holds (sent after every connect).

    A rank the head thinks runs there but the agent does not hold is gone (the agent or node restarted):
    it exits as `lost`, and its job is requeued or ends node_fail. A rank the agent holds that should not
    run (its job ended, or it belongs to an old run) is told to stop.
    """
    held_keys = {(r.job_id, r.run, r.rank) for r in held}
    mine = session.scalars(select(JobRank).where(JobRank.node_id == node_id, JobRank.state != RankState.EXITED))
    for rank in mine:
        key = (rank.job_id, rank.run, rank.rank)
        if key in held_keys:
            if rank.job.state is not JobState.RUNNING or rank.job.run != rank.run:
                rank.cancel = rank.cancel or "the job is no longer running"
                rank.cancel_sent_at = None
            continue
        if rank.state is RankState.RUNNING or rank.cancel is not None:
            # Started there (or told to stop) and now unknown to the agent: its processes are gone.
            why = "the node's agent no longer holds it (the agent or the node restarted)"
            exit_rank(session, clock, rank, "lost", None, why, max_requeues)
        # An ASSIGNED rank not started yet: its job_start is simply sent again.


def node_failures(session: Session, clock: Clock, max_requeues: int) -> list[Job]:
    """Running jobs with a rank on a node that is down or gone: requeued or ended node_fail."""
    down: list[Job] = []
    rows = session.execute(
        select(Job, JobRank, Node.state)
        .join(JobRank, (JobRank.job_id == Job.id) & (JobRank.run == Job.run))
        .outerjoin(Node, Node.id == JobRank.node_id)
        .where(Job.state == JobState.RUNNING)
    )
    seen: set[int] = set()
    for job, rank, state in rows:
        if job.id in seen or (state is not None and state.value == "up"):
            continue
        seen.add(job.id)
        what = "was removed" if state is None else f"is {state.value}"
        fail_run(session, clock, job, f"node {rank.node} {what} (rank {rank.rank})", max_requeues)
        down.append(job)
    return down


def overdue(session: Session, clock: Clock) -> list[Job]:
    """Running jobs past their time limit by TIMEOUT_GRACE_S without a word from their agents: timeout."""
    now = clock.now()
    ended = []
    for job in session.scalars(select(Job).where(Job.state == JobState.RUNNING)):
        if job.started_at is not None and now > job.started_at.timestamp() + job.time_limit_s + TIMEOUT_GRACE_S:
            finish(session, clock, job, JobState.TIMEOUT, f"time limit of {job.time_limit_s:.0f}s reached")
            ended.append(job)
    return ended


def forget_orphans(session: Session, clock: Clock) -> None:
    """Ranks whose node was removed from the inventory hold nothing any more."""
    now = to_datetime(clock.now())
    for rank in session.scalars(select(JobRank).where(JobRank.node_id.is_(None), JobRank.state != RankState.EXITED)):
        rank.state = RankState.EXITED
        rank.outcome = rank.outcome or "lost"
        rank.message = "the node was removed"
        rank.ended_at = now


def held_ranks(session: Session) -> list[JobRank]:
    """Every rank still holding GPUs: what the scheduler must not give away."""
    # The jobs come in one more query, not one each: a pass reads every held rank's job.
    query = select(JobRank).where(JobRank.state != RankState.EXITED).options(selectinload(JobRank.job))
    return list(session.scalars(query))


def ends_by(job: Job, now: float) -> float:
    """When a running job's time limit ends it at the latest (for reservations)."""
    started: datetime | None = job.started_at
    return (started.timestamp() if started is not None else now) + job.time_limit_s
