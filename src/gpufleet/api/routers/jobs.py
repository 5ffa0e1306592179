"""Jobs: submit, list, show, cancel, output; usage reports. Under Slurm the same routes, with the Slurm sync
(jobs.slurm.sync) submitting and cancelling in Slurm, and the output read from Slurm's file."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from gpufleet.api import conditional
from gpufleet.api.deps import Ctx, RowId, allow, tx
from gpufleet.auth.policy import Permission, allowed
from gpufleet.auth.schemas import Principal
from gpufleet.core.errors import Forbidden, InvalidInput
from gpufleet.jobs import accounting, lifecycle, output, queries, submission
from gpufleet.jobs.models import Job, JobState
from gpufleet.jobs.schemas import ArrayCancelled, IdleGpu, JobDetail, JobOut, JobSubmit, OutputPage, UsageReport
from gpufleet.jobs.slurm import output as slurm_output
from gpufleet.monitoring import attribution

router = APIRouter(prefix="/jobs", tags=["jobs"])
reports = APIRouter(prefix="/reports", tags=["jobs"])
Read = Annotated[Principal, allow(Permission.JOBS_READ)]
Submit = Annotated[Principal, allow(Permission.JOBS_SUBMIT)]


def _admin(who: Principal) -> bool:
    return allowed(who.role, Permission.JOBS_ADMIN, who.scope)


def _reveal(who: Principal, job: Job) -> bool:
    """The job's user and job admins see its command, environment and output."""
    return _admin(who) or (who.user is not None and who.user == job.user)


@router.post("", status_code=201)
def submit_job(body: JobSubmit, request: Request, who: Submit, ctx: Ctx) -> JobDetail:
    """Queue a job. Everything that can refuse it does so here, with the reason, before it is queued."""
    limits = submission.Limits(ctx.settings.job_default_time_limit_s, ctx.settings.job_max_time_limit_s)
    submitter = submission.Submitter(actor=who.actor, user=who.user, admin=_admin(who))
    with tx(ctx) as db:
        job = submission.submit(db, ctx.clock, submitter, body, limits, backend=ctx.settings.workload_manager)
        out = queries.job_detail(db, job, reveal=True)
        # Set before the block ends: the record is written in the submission's own transaction.
        shape = f"{out.nodes}x{out.gpus_per_node} GPUs, project {out.project}"
        if out.array_job_id is not None:  # one audit record for the whole array
            request.state.audit_target = f"job array {out.array_job_id} ({out.array_tasks} tasks of {shape})"
        else:
            request.state.audit_target = f"job {out.id} ({shape})"
    ctx.jobs.wake()
    return out


@router.get("", response_model=list[JobOut])
def list_jobs(
    _: Read,
    ctx: Ctx,
    request: Request,
    state: Annotated[list[JobState] | None, Query(description="only jobs in these states")] = None,
    user: Annotated[str | None, Query(pattern=r"^[a-z_][a-z0-9_-]{0,31}$")] = None,
    project: Annotated[str | None, Query(pattern=r"^[a-z0-9][a-z0-9._-]{0,62}$")] = None,
    expand: Annotated[bool, Query(description="list each pending task of a job array, not one row per array")] = False,
    array_job_id: Annotated[int | None, Query(ge=1, le=2**63 - 1, description="only this job array's tasks")] = None,
    array_task_id: Annotated[int | None, Query(ge=0, le=2**31 - 1, description="with array_job_id: one task")] = None,
    limit: Annotated[int, Query(ge=1, le=queries.MAX_LIST)] = 500,
    offset: Annotated[int, Query(ge=0, le=10_000_000, description="skip this many matching jobs")] = 0,
) -> Response:
    """Running jobs first, then pending, then ended ones, newest first within each. The pending tasks of a
    job array are one row (its lowest pending task's, with `array_pending`) unless `expand`. With an
    `ETag`: `If-None-Match` answers 304 while the page is unchanged."""
    if array_task_id is not None and array_job_id is None:
        raise InvalidInput("array_task_id needs array_job_id: a task id is a place in one array")
    with tx(ctx, readonly=True) as db:
        rows = queries.list_job_rows(
            db,
            states=state or (),
            user=user,
            project=project,
            expand=expand,
            array_job_id=array_job_id,
            array_task_id=array_task_id,
            limit=limit,
            offset=offset,
        )
    return conditional.answer(request, rows)


@router.get("/{job_id}")
def show_job(job_id: RowId, who: Read, ctx: Ctx) -> JobDetail:
    with tx(ctx, readonly=True) as db:
        job = lifecycle.get_job(db, job_id)
        return queries.job_detail(db, job, reveal=_reveal(who, job))


@router.post("/{job_id}/cancel", status_code=200)
def cancel_job(job_id: RowId, request: Request, who: Submit, ctx: Ctx) -> JobDetail:
    """End a pending or running job; its processes are killed (the whole tree) on every node."""
    request.state.audit_target = f"job {job_id}"
    with tx(ctx) as db:
        job = lifecycle.cancel(db, ctx.clock, job_id, who.actor, user=who.user, admin=_admin(who))
        out = queries.job_detail(db, job, reveal=True)
    ctx.jobs.wake()
    return out


@router.post("/arrays/{array_job_id}/cancel", status_code=200)
def cancel_array(array_job_id: RowId, request: Request, who: Submit, ctx: Ctx) -> ArrayCancelled:
    """End every task of a job array not yet ended, in one transaction: its user or a job admin, as for one
    job. One task alone: POST /jobs/{its job id}/cancel."""
    request.state.audit_target = f"job array {array_job_id}"
    with tx(ctx) as db:
        ended = lifecycle.cancel_array(db, ctx.clock, array_job_id, who.actor, user=who.user, admin=_admin(who))
        tasks = queries.array_sizes(db, [array_job_id]).get(array_job_id, 0)
    ctx.jobs.wake()
    return ArrayCancelled(array_job_id=array_job_id, cancelled=len(ended), tasks=tasks)


@router.get("/{job_id}/output")
def job_output(
    job_id: RowId,
    who: Read,
    ctx: Ctx,
    after: Annotated[int, Query(ge=0, le=2**63 - 1, description="the last chunk id already read")] = 0,
    limit: Annotated[int, Query(ge=1, le=output.MAX_PAGE)] = output.MAX_PAGE,
    rank: Annotated[int | None, Query(ge=0, le=4095)] = None,
) -> OutputPage:
    """stdout and stderr in arrival order. Poll with `after=next_after` until `done` to follow a job."""
    with tx(ctx, readonly=True) as db:
        job = lifecycle.get_job(db, job_id)
        if not _reveal(who, job):
            raise Forbidden(f"the output of job {job_id} is for its user ({job.user}) and job admins")
        if job.backend == "slurm":
            return slurm_output.read(job, ctx.settings.slurm_output_dir, after=after)
        return output.read(db, job, after=after, limit=limit, rank=rank)


@reports.get("/usage")
def usage(
    _: Read,
    ctx: Ctx,
    since: Annotated[datetime, Query(description="start of the window (ISO 8601)")],
    until: Annotated[datetime | None, Query(description="end of the window; default: now")] = None,
    by: Annotated[str, Query(pattern="^(project|user|job)$")] = "project",
) -> UsageReport:
    """GPU-hours held within the window per project, user or job, with those jobs' mean GPU utilization."""
    try:
        start = since.timestamp()
        end = until.timestamp() if until is not None else ctx.clock.now()
    except (OverflowError, ValueError):  # e.g. 0001-01-01 with a positive offset lands in year 0
        start = end = -1.0
    if min(start, end) < 0:  # no job ran before 1970; and earlier times do not all convert back
        raise InvalidInput("since and until must be times from year 1970 on")
    if start >= end:
        raise InvalidInput("since must be before until")
    with tx(ctx, readonly=True) as db:
        return accounting.usage_report(db, start, end, by)


@reports.get("/idle-gpus")
def idle_gpus(
    _: Read,
    ctx: Ctx,
    below: Annotated[float, Query(ge=0, le=100, description="utilization under which a held GPU is idle, %")] = (
        attribution.IDLE_UTIL_PCT
    ),
) -> list[IdleGpu]:
    """GPUs that running jobs hold but hardly use, by their newest sample: the waste to chase first."""
    with tx(ctx, readonly=True) as db:
        return attribution.idle_gpus(db, ctx.clock.now(), ctx.settings.metrics_interval_s, below)
