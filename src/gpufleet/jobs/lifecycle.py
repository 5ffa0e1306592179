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
from dataclasses import dataclass, field

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from gpufleet.core.clock import Clock, to_datetime
from gpufleet.core.errors import Conflict, Forbidden, NotFound
from gpufleet.inventory.models import Node
from gpufleet.inventory.states import NodeState
from gpufleet.jobs.models import FINAL_STATES, Job, JobRank, JobState, RankState
from gpufleet.protocol.jobs import JobUpdate, RankRef

# How long past its time limit a running job may go unreported before the head ends it itself (the
# agent enforces the limit; this is for an agent that cannot say so).
TIMEOUT_GRACE_S = 60.0
_LOCK_BATCH = 900  # ids per IN (...): under every SQLite build's bound-parameter limit


def get_job(session: Session, job_id: int) -> Job:
    job = session.get(Job, job_id)
    if job is None:
        raise NotFound(f"no such job: {job_id}")
    return job


# Every change to a job or its ranks first locks the job's row, in id order when there are several.
# On PostgreSQL (READ COMMITTED) two writers otherwise read the same state and both act on it: two
# ranks ending together each see the other still running, a cancel slips between a placement's check
# and its write. The row is re-read under the lock (populate_existing), ranks included. SQLite needs
# none of this (a write transaction there is exclusive) and ignores FOR UPDATE.


def lock_jobs(session: Session, job_ids: Iterable[int]) -> dict[int, Job]:
    """The jobs with these ids that exist, locked until the transaction ends and freshly read."""
    ids = sorted(set(job_ids))
    if not ids:
        return {}
    query = (
        select(Job).where(Job.id.in_(ids)).order_by(Job.id).with_for_update().execution_options(populate_existing=True)
    )
    return {job.id: job for job in session.scalars(query)}


def lock_job(session: Session, job_id: int) -> Job:
    """Raises NotFound for an unknown job."""
    job = lock_jobs(session, [job_id]).get(job_id)
    if job is None:
        raise NotFound(f"no such job: {job_id}")
    return job


@dataclass(frozen=True, slots=True)
class NodeGpus:
    """What placing a rank on a node needs: the node's id, its GPUs' UUIDs by index, and the GPU index of
    each of its MIG devices by UUID."""

    node_id: int
    uuids: Mapping[int, str]
    mig_parent: Mapping[str, int] = field(default_factory=dict)


def place(
    session: Session,
    clock: Clock,
    job: Job,
    allocation: Mapping[str, Sequence[int]],
    nodes: Mapping[str, NodeGpus],
    instances: Mapping[str, Sequence[str]] | None = None,
) -> list[JobRank]:
    """Start a new run of a pending job on these GPUs ({node name: GPU indexes}, rank order), or, for a
    job of a MIG profile, on these MIG devices ({node name: MIG UUIDs}: each rank's GPU indexes are then
    the devices' GPUs, and CUDA_VISIBLE_DEVICES names the devices). `nodes`: the nodes' ids and UUIDs, as
    the scheduler pass read them once for all its placements."""
    if instances:
        allocation = {name: [nodes[name].mig_parent[u] for u in uuids] for name, uuids in instances.items()}
    now = to_datetime(clock.now())
    job.run += 1
    job.state = JobState.RUNNING
    job.reason = ""
    job.started_at = now
    job.allocation = {name: list(gpus) for name, gpus in allocation.items()}
    ranks = []
    for rank, (name, gpus) in enumerate(allocation.items()):
        node = nodes[name]
        ranks.append(
            JobRank(
                job_id=job.id,
                run=job.run,
                rank=rank,
                node_id=node.node_id,
                node=name,
                gpu_indexes=list(gpus),
                gpu_uuids=list(instances[name]) if instances else [node.uuids.get(i, "") for i in gpus],
                state=RankState.ASSIGNED,
                assigned_at=now,
            )
        )
    session.add_all(ranks)
    return ranks


def cancel(session: Session, clock: Clock, job_id: int, actor: str, *, user: str | None, admin: bool) -> Job:
    """Cancel a pending or running job. Its user or a job admin may; others get Forbidden."""
    job = lock_job(session, job_id)
    if not admin and job.user != user:
        raise Forbidden(f"job {job_id} belongs to {job.user}; only its user or a job admin may cancel it")
    if job.state in FINAL_STATES:
        raise Conflict(f"job {job_id} has already ended ({job.state.value})")
    finish(session, clock, job, JobState.CANCELLED, f"cancelled by {actor}")
    return job


def cancel_array(
    session: Session, clock: Clock, array_job_id: int, actor: str, *, user: str | None, admin: bool
) -> list[int]:
    """Cancel every task of a job array that has not ended, by `cancel`'s rules; returns their job ids.

    Pending tasks end by one UPDATE (they hold no GPUs: a requeued task's old ranks were told to stop
    when it was requeued), running ones one by one as `cancel` ends them, their ranks told to stop.
    """
    tasks = session.execute(select(Job.id, Job.user, Job.state).where(Job.array_job_id == array_job_id)).all()
    if not tasks:
        raise NotFound(f"no such job array: {array_job_id}")
    owner = tasks[0].user  # every task runs as the user the array was submitted for
    if not admin and owner != user:
        raise Forbidden(f"job array {array_job_id} belongs to {owner}; only its user or a job admin may cancel it")
    live = sorted(job_id for job_id, _, state in tasks if state not in FINAL_STATES)
    if not live:
        raise Conflict(f"every task of job array {array_job_id} has already ended")
    # Locked in id order, as `lock_jobs` does, so that a scheduler pass placing a task and this cancel
    # never wait on each other in a cycle (PostgreSQL); ids and states only, read again under the lock.
    pending, running = [], []
    for start in range(0, len(live), _LOCK_BATCH):
        query = select(Job.id, Job.state).where(Job.id.in_(live[start : start + _LOCK_BATCH]))
        for job_id, state in session.execute(query.order_by(Job.id).with_for_update()):
            if state is JobState.PENDING:
                pending.append(job_id)
            elif state is JobState.RUNNING:
                running.append(job_id)
    session.execute(
        update(Job)
        .where(Job.array_job_id == array_job_id, Job.state == JobState.PENDING)
        .values(
            state=JobState.CANCELLED,
            reason=f"cancelled by {actor}"[:512],
            exit_code=None,
            ended_at=to_datetime(clock.now()),
        ),
        execution_options={"synchronize_session": False},
    )
    for start in range(0, len(running), _LOCK_BATCH):
        for job in lock_jobs(session, running[start : start + _LOCK_BATCH]).values():
            finish(session, clock, job, JobState.CANCELLED, f"cancelled by {actor}")
    return sorted(pending + running)


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
    """Record an agent's report on one of its ranks. Returns whether it was recorded: a report about a rank
    the head has no record of (its job removed, its node removed since) is ignored. Raises Forbidden, changing
    nothing, for a rank another node holds: a node speaks only for its own ranks."""
    if not lock_jobs(session, [update.job_id]):
        return False
    rank = _rank(session, node_id, update)
    if rank is None:
        refuse_foreign(session, node_id, [update])
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
        select(JobRank)
        .where(
            JobRank.job_id == ref.job_id, JobRank.run == ref.run, JobRank.rank == ref.rank, JobRank.node_id == node_id
        )
        .execution_options(populate_existing=True)
    )


def foreign_ranks(session: Session, node_id: int, refs: Iterable[RankRef]) -> dict[tuple[int, int, int], str]:
    """Which of `refs` (job, run, rank) another node holds, with that node's name. A rank whose node was
    removed (node_id NULL) is no one's: the head has no live record of it, and says so to whoever holds it."""
    wanted = {(r.job_id, r.run, r.rank) for r in refs}
    found: dict[tuple[int, int, int], str] = {}
    job_ids = sorted({key[0] for key in wanted})
    for start in range(0, len(job_ids), _LOCK_BATCH):
        rows = session.execute(
            select(JobRank.job_id, JobRank.run, JobRank.rank, JobRank.node).where(
                JobRank.job_id.in_(job_ids[start : start + _LOCK_BATCH]),
                JobRank.node_id.is_not(None),
                JobRank.node_id != node_id,
            )
        )
        found.update({(j, run, rank): node for j, run, rank, node in rows if (j, run, rank) in wanted})
    return found


def refuse_foreign(session: Session, node_id: int, refs: Iterable[RankRef]) -> None:
    """Raise Forbidden naming the first of `refs` that another node holds; nothing if none is."""
    foreign = foreign_ranks(session, node_id, refs)
    if foreign:
        (job_id, run, rank), node = min(foreign.items())
        more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
        raise Forbidden(f"job {job_id} run {run} rank {rank} of node {node}{more}")


def ranks_held(
    session: Session, clock: Clock, node_id: int, held: Iterable[RankRef], max_requeues: int
) -> list[RankRef]:
    """Reconcile with the ranks an agent says it holds (sent after every connect). Raises Forbidden, changing
    nothing, if it claims a rank another node holds.

    A rank the head thinks runs there but the agent does not hold is gone (the agent or node restarted):
    it exits as `lost`, and its job is requeued or ends node_fail. A rank the agent holds that should not
    run (its job ended, or it belongs to an old run) is told to stop. Returns the ranks the agent holds
    that the head has no live record of here (ended, or unknown): the caller tells the agent to stop them.
    """
    held = list(held)
    refuse_foreign(session, node_id, held)
    held_keys = {(r.job_id, r.run, r.rank) for r in held}
    live = (JobRank.node_id == node_id) & (JobRank.state != RankState.EXITED)
    lock_jobs(session, session.scalars(select(JobRank.job_id).where(live)))
    mine = list(session.scalars(select(JobRank).where(live).execution_options(populate_existing=True)))
    known = {(r.job_id, r.run, r.rank) for r in mine}
    strays = [r for r in held if (r.job_id, r.run, r.rank) not in known]
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
    return strays


# Ending what must end is split in two: `find_*` reads (in the scheduler pass's read-only
# transaction, with no lock), `end_*` writes, re-checking each job, since an agent's report may have
# ended it in between. Runs are named (job id, run) so a requeued job's new run is never ended for
# what its old run's node did.


def find_node_failures(session: Session) -> dict[tuple[int, int], str]:
    """Running runs with a rank on a node that is down or gone: (job id, run) -> why."""
    rows = session.execute(
        select(Job.id, Job.run, JobRank.node, JobRank.rank, Node.state)
        .join(JobRank, (JobRank.job_id == Job.id) & (JobRank.run == Job.run))
        .outerjoin(Node, Node.id == JobRank.node_id)
        .where(Job.state == JobState.RUNNING)
    )
    failed: dict[tuple[int, int], str] = {}
    for job_id, run, node, rank, state in rows:
        if (job_id, run) not in failed and (state is None or state is not NodeState.UP):
            what = "was removed" if state is None else f"is {state.value}"
            failed[(job_id, run)] = f"node {node} {what} (rank {rank})"
    return failed


def find_overdue(session: Session, now: float) -> list[tuple[int, int]]:
    """Running runs past their time limit by TIMEOUT_GRACE_S without a word from their agents."""
    rows = session.execute(
        select(Job.id, Job.run, Job.started_at, Job.time_limit_s).where(Job.state == JobState.RUNNING)
    )
    return [
        (job_id, run)
        for job_id, run, started, limit in rows
        if started and now > started.timestamp() + limit + TIMEOUT_GRACE_S
    ]


def find_orphans(session: Session) -> list[int]:
    """Ranks still holding GPUs on a node that was removed from the inventory."""
    query = select(JobRank.id).where(JobRank.node_id.is_(None), JobRank.state != RankState.EXITED)
    return list(session.scalars(query))


def _still_running(session: Session, job_id: int, run: int) -> Job | None:
    job = lock_jobs(session, [job_id]).get(job_id)
    return job if job is not None and job.state is JobState.RUNNING and job.run == run else None


def end_node_failures(
    session: Session, clock: Clock, failed: dict[tuple[int, int], str], max_requeues: int
) -> list[int]:
    """Requeue or end node_fail each run found failing; returns the job ids."""
    ended = []
    for (job_id, run), reason in failed.items():
        job = _still_running(session, job_id, run)
        if job is not None:
            fail_run(session, clock, job, reason, max_requeues)
            ended.append(job_id)
    return ended


def end_overdue(session: Session, clock: Clock, late: list[tuple[int, int]]) -> list[int]:
    ended = []
    for job_id, run in late:
        job = _still_running(session, job_id, run)
        if job is not None:
            finish(session, clock, job, JobState.TIMEOUT, f"time limit of {job.time_limit_s:.0f}s reached")
            ended.append(job_id)
    return ended


def end_orphans(session: Session, clock: Clock, rank_ids: list[int]) -> None:
    now = to_datetime(clock.now())
    for rank_id in rank_ids:
        rank = session.get(JobRank, rank_id)
        if rank is not None and rank.node_id is None and rank.state is not RankState.EXITED:
            rank.state = RankState.EXITED
            rank.outcome = rank.outcome or "lost"
            rank.message = "the node was removed"
            rank.ended_at = now


@dataclass(frozen=True, slots=True)
class HeldRank:
    """A rank still holding GPUs, with what the scheduler needs of its job (plain values, no objects)."""

    job_id: int
    run: int
    node_id: int | None
    node: str
    gpu_indexes: list[int]
    project: str | None
    current: bool  # its job runs and this is its current run (else its processes are being stopped)
    ends_by: float | None  # the job's time limit ends it then; None while not current
    cpus_per_node: int
    mem_per_node_mib: int
    gpu_uuids: list[str] = field(default_factory=list)
    profile: str | None = None  # its job's MIG profile: it holds the MIG devices in gpu_uuids


def held_ranks(session: Session) -> list[HeldRank]:
    """Every rank still holding GPUs: what the scheduler must not give away. One query, plain rows."""
    rows = session.execute(
        select(
            JobRank.job_id,
            JobRank.run,
            JobRank.node_id,
            JobRank.node,
            JobRank.gpu_indexes,
            Job.project,
            Job.state,
            Job.run,
            Job.started_at,
            Job.time_limit_s,
            Job.cpus_per_node,
            Job.mem_per_node_mib,
            JobRank.gpu_uuids,
            Job.gpu_profile,
        )
        .join(Job, Job.id == JobRank.job_id)
        .where(JobRank.state != RankState.EXITED)
    )
    held = []
    for job_id, run, node_id, node, gpus, project, state, job_run, started, limit, cpus, mem, uuids, profile in rows:
        current = state is JobState.RUNNING and job_run == run
        ends = (started.timestamp() + limit) if current and started is not None else None
        held.append(HeldRank(job_id, run, node_id, node, gpus, project, current, ends, cpus, mem, uuids or [], profile))
    return held
