"""Reading jobs: the queue and history, one job in full, as the API shows them."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable, Iterator
from typing import Any, TypeVar

from sqlalchemy import ColumnElement, Select, case, func, or_, select
from sqlalchemy.orm import Session, lazyload

from gpufleet.jobs import arrays
from gpufleet.jobs.models import Job, JobState
from gpufleet.jobs.schemas import JobDetail, JobOut, RankOut

# A select over jobs, whatever its columns (`collapsed` adds a filter and keeps the type).
Q = TypeVar("Q", bound="Select[*tuple[Any, ...]]")
MAX_LIST = 5000
# Listed in this order: what runs, then what waits, then what ended (newest first within each).
_ORDER = case({JobState.RUNNING.value: 0, JobState.PENDING.value: 1}, value=Job.state, else_=2)
IN_BATCH = 900  # values per IN (...): under every SQLite build's bound-parameter limit
# What a listed job shows (JobOut), read as plain rows: no command, script or environment.
_LISTED = (
    Job.id,
    Job.name,
    Job.user,
    Job.project,
    Job.state,
    Job.reason,
    Job.nodes,
    Job.gpus_per_node,
    Job.cpus_per_node,
    Job.mem_per_node_mib,
    Job.time_limit_s,
    Job.priority,
    Job.category,
    Job.container,
    Job.requeue,
    Job.run,
    Job.allocation,
    Job.submitted_at,
    Job.started_at,
    Job.ended_at,
    Job.exit_code,
    Job.gpu_seconds,
    Job.sampled_gpu_seconds,
    Job.busy_gpu_seconds,
    Job.backend,
    Job.external_id,
    Job.partition,
    Job.environment,
    Job.min_driver,
    Job.array_job_id,
    Job.array_task_id,
    Job.array_throttle,
)


def collapsed(query: Q) -> Q:
    """`query` over jobs with each array's pending tasks standing as one row, its lowest pending task's
    (as squeue shows them): one pass over the pending array tasks (the state index), however many the
    queue holds."""
    firsts = (
        select(func.min(Job.id))
        .where(Job.state == JobState.PENDING, Job.array_job_id.is_not(None))
        .group_by(Job.array_job_id)
    )
    return query.where(or_(Job.array_job_id.is_(None), Job.state != JobState.PENDING, Job.id.in_(firsts)))


def list_jobs(
    session: Session,
    *,
    states: Collection[JobState] = (),
    user: str | None = None,
    project: str | None = None,
    collapse_arrays: bool = False,
    limit: int = 500,
    offset: int = 0,
) -> list[Job]:
    """Jobs as objects (the dashboard's list): every array task one by one, or with `collapse_arrays` each
    array's pending tasks as one row (`collapsed`)."""
    query = select(Job).options(lazyload(Job.ranks)).where(*_filters(states, user, project))  # no ranks loaded
    if collapse_arrays:
        query = collapsed(query)
    query = query.order_by(_ORDER, Job.id.desc()).offset(max(offset, 0)).limit(min(max(limit, 1), MAX_LIST))
    return list(session.scalars(query))


def list_job_rows(
    session: Session,
    *,
    states: Collection[JobState] = (),
    user: str | None = None,
    project: str | None = None,
    expand: bool = False,
    array_job_id: int | None = None,
    array_task_id: int | None = None,
    limit: int = 500,
    offset: int = 0,
) -> list[JobOut]:
    """The API's list, from plain rows. The pending tasks of a job array are one row (as squeue shows
    them), its lowest pending task's, with their task ids in `array_pending`; running and ended tasks are
    listed one by one. `expand`, or naming an array, lists every task. `limit` and `offset` page the list
    as shown (collapsed or not)."""
    query = select(*_LISTED).where(*_filters(states, user, project))
    if array_job_id is not None:
        query = query.where(Job.array_job_id == array_job_id)
        if array_task_id is not None:
            query = query.where(Job.array_task_id == array_task_id)
    elif not expand:
        query = collapsed(query)
    query = query.order_by(_ORDER, Job.id.desc()).offset(max(offset, 0)).limit(min(max(limit, 1), MAX_LIST))
    rows = [dict(row) for row in session.execute(query).mappings()]
    listed = {row["array_job_id"] for row in rows if row["array_job_id"] is not None}
    sizes = array_sizes(session, listed)
    pending: dict[int, list[int]] = {}
    if array_job_id is None and not expand:  # the rows standing for their arrays' pending tasks
        pending = pending_tasks(session, {r["array_job_id"] for r in rows if r["state"] is JobState.PENDING} - {None})
    out = []
    for row in rows:
        sampled, busy = row.pop("sampled_gpu_seconds"), row.pop("busy_gpu_seconds")
        row["mean_gpu_util"] = round(100.0 * busy / sampled, 1) if sampled > 0 else None
        array = row["array_job_id"]
        if array is not None:
            row["array_tasks"] = sizes.get(array)
            if row["state"] is JobState.PENDING and array in pending:
                row["array_pending"] = arrays.compact(pending[array])
                row["array_pending_count"] = len(pending[array])
        out.append(JobOut.model_validate(row))
    return out


def _filters(states: Collection[JobState], user: str | None, project: str | None) -> list[ColumnElement[bool]]:
    found: list[ColumnElement[bool]] = []
    if states:
        found.append(Job.state.in_([s.value for s in states]))
    if user is not None:
        found.append(Job.user == user)
    if project is not None:
        found.append(Job.project == project)
    return found


def _batches(ids: Iterable[int]) -> Iterator[list[int]]:
    ordered = sorted(ids)
    for start in range(0, len(ordered), IN_BATCH):
        yield ordered[start : start + IN_BATCH]


def array_sizes(session: Session, array_job_ids: Iterable[int]) -> dict[int, int]:
    """How many tasks each of these job arrays has."""
    sizes: dict[int, int] = {}
    for batch in _batches(array_job_ids):
        query = select(Job.array_job_id, func.count()).where(Job.array_job_id.in_(batch)).group_by(Job.array_job_id)
        sizes.update({array: count for array, count in session.execute(query) if array is not None})
    return sizes


def pending_tasks(session: Session, array_job_ids: Iterable[int]) -> dict[int, list[int]]:
    """The task ids of each array's pending tasks."""
    found: dict[int, list[int]] = defaultdict(list)
    for batch in _batches(array_job_ids):
        query = select(Job.array_job_id, Job.array_task_id).where(
            Job.array_job_id.in_(batch), Job.state == JobState.PENDING
        )
        for array, task in session.execute(query):
            if array is not None and task is not None:
                found[array].append(task)
    return dict(found)


def job_out(job: Job) -> JobOut:
    return JobOut.model_validate(job, from_attributes=True)


def job_detail(session: Session, job: Job, *, reveal: bool) -> JobDetail:
    """`reveal`: the caller is the job's user or a job admin, and may see its command and environment."""
    tasks = array_sizes(session, [job.array_job_id]).get(job.array_job_id) if job.array_job_id is not None else None
    return JobDetail(
        **(job_out(job).model_dump() | {"array_tasks": tasks}),
        submitted_by=job.submitted_by,
        argv=job.argv if reveal else None,
        script=job.script if reveal else None,
        env=job.env if reveal else None,
        workdir=job.workdir,
        ranks=[RankOut.model_validate(r, from_attributes=True) for r in job.ranks],
    )
