"""Reading jobs: the queue and history, one job in full, as the API shows them."""

from __future__ import annotations

from collections.abc import Collection

from sqlalchemy import case, select
from sqlalchemy.orm import Session, lazyload

from gpufleet.jobs.models import Job, JobState
from gpufleet.jobs.schemas import JobDetail, JobOut, RankOut

MAX_LIST = 5000
# Listed in this order: what runs, then what waits, then what ended (newest first within each).
_ORDER = case({JobState.RUNNING.value: 0, JobState.PENDING.value: 1}, value=Job.state, else_=2)


def list_jobs(
    session: Session,
    *,
    states: Collection[JobState] = (),
    user: str | None = None,
    project: str | None = None,
    limit: int = 500,
    offset: int = 0,
) -> list[Job]:
    query = select(Job).options(lazyload(Job.ranks))  # a list shows no ranks: don't load thousands
    if states:
        query = query.where(Job.state.in_([s.value for s in states]))
    if user is not None:
        query = query.where(Job.user == user)
    if project is not None:
        query = query.where(Job.project == project)
    query = query.order_by(_ORDER, Job.id.desc()).offset(max(offset, 0)).limit(min(max(limit, 1), MAX_LIST))
    return list(session.scalars(query))


def job_out(job: Job) -> JobOut:
    return JobOut.model_validate(job, from_attributes=True)


def job_detail(job: Job, *, reveal: bool) -> JobDetail:
    """`reveal`: the caller is the job's user or a job admin, and may see its command and environment."""
    return JobDetail(
        **job_out(job).model_dump(),
        submitted_by=job.submitted_by,
        argv=job.argv if reveal else None,
        script=job.script if reveal else None,
        env=job.env if reveal else None,
        workdir=job.workdir,
        ranks=[RankOut.model_validate(r, from_attributes=True) for r in job.ranks],
    )
