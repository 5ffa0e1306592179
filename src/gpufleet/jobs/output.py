"""Jobs' stdout and stderr on the head: chunks as the agents send them, read back by cursor.

Chunks are keyed by (job, run, rank, stream, offset), so a chunk an agent resends after a reconnect is
stored once. Each job keeps at most `max_chars` on the head; past that a single note says so, and the
full output stays in the node's spool (`job_spool_dir`).
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpufleet.core.clock import Clock, to_datetime
from gpufleet.jobs.models import FINAL_STATES, Job, JobOutputChunk, JobRank, RankState
from gpufleet.jobs.schemas import OutputChunk, OutputPage
from gpufleet.protocol.jobs import JobOutput

TRUNCATED = "\n[gpufleet: output truncated on the head at {limit} characters; the node keeps it all in its job spool]\n"
MAX_PAGE = 1000


def foreign(session: Session, chunks: Sequence[tuple[int, JobOutput]]) -> list[tuple[int, JobOutput, str]]:
    """The (node id, chunk) pairs about a rank another node holds, each with that node's name: `store` drops
    them, and the caller records who tried."""
    job_ids = {c.job_id for _, c in chunks}
    if not job_ids:
        return []
    owners = {
        (job_id, run, rank): (node_id, node)
        for job_id, run, rank, node_id, node in session.execute(
            select(JobRank.job_id, JobRank.run, JobRank.rank, JobRank.node_id, JobRank.node).where(
                JobRank.job_id.in_(job_ids), JobRank.node_id.is_not(None)
            )
        )
    }
    found = []
    for node_id, chunk in chunks:
        owner = owners.get((chunk.job_id, chunk.run, chunk.rank))
        if owner is not None and owner[0] != node_id:
            found.append((node_id, chunk, owner[1]))
    return found


def store(session: Session, clock: Clock, chunks: Sequence[tuple[int, JobOutput]], max_chars: int) -> int:
    """Store (node id, chunk) pairs from the agents. Chunks about ranks the node does not hold are
    dropped (`foreign` says which of them another node holds). Returns how many were stored."""
    if not chunks:
        return 0
    at = to_datetime(clock.now())
    job_ids = {c.job_id for _, c in chunks}
    jobs = {j.id: j for j in session.scalars(select(Job).where(Job.id.in_(job_ids)))}
    owners = {
        (r.job_id, r.run, r.rank): r.node_id
        for r in session.scalars(select(JobRank).where(JobRank.job_id.in_(job_ids)))
    }
    # Only the keys this batch could collide with (its offsets), not every chunk the jobs ever stored.
    offsets = {c.offset for _, c in chunks}
    existing: set[tuple[int, int, int, str, int]] = {
        (job_id, run, rank, stream, offset)
        for job_id, run, rank, stream, offset in session.execute(
            select(
                JobOutputChunk.job_id,
                JobOutputChunk.run,
                JobOutputChunk.rank,
                JobOutputChunk.stream,
                JobOutputChunk.offset,
            ).where(JobOutputChunk.job_id.in_(job_ids), JobOutputChunk.offset.in_(offsets))
        )
    }
    stored = 0
    for node_id, chunk in chunks:
        job = jobs.get(chunk.job_id)
        key = (chunk.job_id, chunk.run, chunk.rank, chunk.stream, chunk.offset)
        if job is None or owners.get(key[:3]) != node_id or key in existing or job.output_chars > max_chars:
            continue
        data = chunk.data.replace("\x00", "\ufffd")  # PostgreSQL text holds no NUL; a job may print one
        room = max_chars - job.output_chars
        if len(data) > room:
            data = data[:room] + TRUNCATED.format(limit=max_chars)
            job.output_chars = max_chars + 1  # nothing more is kept
        else:
            job.output_chars += len(data)
        existing.add(key)
        session.add(
            JobOutputChunk(
                job_id=chunk.job_id,
                run=chunk.run,
                rank=chunk.rank,
                stream=chunk.stream,
                offset=chunk.offset,
                data=data,
                at=at,
            )
        )
        stored += 1
    session.flush()
    return stored


def read(session: Session, job: Job, after: int = 0, limit: int = MAX_PAGE, rank: int | None = None) -> OutputPage:
    """Chunks with id > `after`, in the order they arrived. `done` once the job ended and no rank of it
    can send more (all exited) and this page reached the end."""
    query = select(JobOutputChunk).where(JobOutputChunk.job_id == job.id, JobOutputChunk.id > after)
    if rank is not None:
        query = query.where(JobOutputChunk.rank == rank)
    rows = list(session.scalars(query.order_by(JobOutputChunk.id).limit(min(max(limit, 1), MAX_PAGE))))
    quiet = job.state in FINAL_STATES and all(r.state is RankState.EXITED for r in job.ranks)
    return OutputPage(
        chunks=[OutputChunk(id=c.id, run=c.run, rank=c.rank, stream=c.stream, data=c.data) for c in rows],
        next_after=rows[-1].id if rows else after,
        done=quiet and len(rows) < min(max(limit, 1), MAX_PAGE),
        state=job.state,
    )
