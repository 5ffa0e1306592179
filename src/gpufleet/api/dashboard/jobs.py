"""The Jobs pages: the queue and history (`/jobs`), one job (`/jobs/{id}`) and GPU usage (`/jobs/usage`).

Everything comes from the functions the REST API and `gpufleet job` use (`jobs.queries`,
`jobs.accounting`, `monitoring.attribution`). The job page's charts draw
`GET /api/v1/jobs/{id}/gpu-charts` (api.routers.job_metrics): only the GPUs the job's ranks held, over
the time they held them. **Cancel** calls `POST /api/v1/jobs/{id}/cancel`; it is shown to the job's
user (with jobs:submit) and to job admins, the only ones the API lets cancel it.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gpufleet.api.dashboard.pages import View, render
from gpufleet.api.deps import Ctx
from gpufleet.api.routers.monitoring import GPU_CHARTS
from gpufleet.auth.policy import Permission
from gpufleet.auth.projects import Project
from gpufleet.core import hostlist
from gpufleet.core.errors import InvalidInput, NotFound
from gpufleet.jobs import accounting, arrays, lifecycle, queries
from gpufleet.jobs.models import FINAL_STATES, Job, JobOutputChunk, JobState
from gpufleet.jobs.scheduler import PendingReason
from gpufleet.monitoring import attribution

router = APIRouter(include_in_schema=False)

PAGE_SIZE = 100  # jobs per page of the queue and history
MAX_PAGE = 100_000
# The `state` filter: a group of states or one state. "ended" is every final state, newest first.
ENDED = tuple(s for s in JobState if s in FINAL_STATES)
STATE_FILTERS: dict[str, tuple[JobState, ...]] = {
    "running": (JobState.RUNNING,),
    "pending": (JobState.PENDING,),
    "ended": ENDED,
} | {s.value: (s,) for s in ENDED}
# The tabs above the table: the `state` each sets ("" = all) and its title.
TABS = (("", "All"), ("running", "Running"), ("pending", "Pending"), ("ended", "Recent"))
# The words a reason starts with ("resources: not enough free GPUs ..."), shown as a label.
REASON_KINDS = frozenset({r.value for r in PendingReason} | {"submitted", "requeued"})
OUTPUT_LINES = 200  # the job page shows the last this many lines of output
OUTPUT_CHUNKS = 400  # read at most this many of the newest chunks to find them
OUTPUT_CHARS = 256 * 1024  # and at most this much text
CHART_RANKS = 8  # the job page charts the GPUs of the first this many ranks of the run
# The job page's charts: utilization, memory and power of the job's GPUs.
JOB_CHARTS = {metric: GPU_CHARTS[metric] for metric in ("gpu_util", "fb_used_pct", "power_w")}
# The usage page's windows: query value, what the tabs say, its length in seconds.
USAGE_RANGES = {"7d": ("7 days", 7 * 86_400.0), "30d": ("30 days", 30 * 86_400.0)}
USAGE_BY = {"project": "Project", "user": "User"}


def hms(seconds: float) -> str:
    """[D-]HH:MM:SS, as `gpufleet job list` and Slurm write times."""
    whole = max(int(seconds), 0)
    days, rest = divmod(whole, 86_400)
    text = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{text}" if days else text


def split_reason(reason: str) -> tuple[str, str]:
    """("resources", "not enough free GPUs ...") for a reason that starts with a known word, else ("", reason)."""
    kind, sep, detail = reason.partition(": ")
    if sep and kind in REASON_KINDS:
        return kind, detail
    return "", reason


def may_cancel(view: View, job: Job) -> bool:
    """As `lifecycle.cancel` and the API decide: a job admin, or the job's user with jobs:submit; only
    while the job is pending or running."""
    if job.state in FINAL_STATES:
        return False
    if view.may(Permission.JOBS_ADMIN):
        return True
    return view.may(Permission.JOBS_SUBMIT) and view.who.user is not None and view.who.user == job.user


def may_see_output(view: View, job: Job) -> bool:
    """The job's user and job admins see its command, environment and output (as the API's `_reveal`)."""
    return view.may(Permission.JOBS_ADMIN) or (view.who.user is not None and view.who.user == job.user)


def gpu_hours(job: Job, now: float) -> float:
    """GPU-hours of every run so far: the ended runs' (charged when they ended) and the current one's."""
    seconds = job.gpu_seconds
    if job.state is JobState.RUNNING and job.started_at is not None:
        seconds += job.gpus * max(now - job.started_at.timestamp(), 0.0)
    return seconds / 3600.0


def job_counts(
    session: Session, *, user: str | None = None, project: str | None = None, collapse_arrays: bool = False
) -> dict[JobState, int]:
    """How many jobs are in each state (every state present, 0 for none), for `user` and `project` if given;
    with `collapse_arrays`, each job array's pending tasks count once, as the queue lists them."""
    query = select(Job.state, func.count()).group_by(Job.state)
    if collapse_arrays:
        query = queries.collapsed(query)
    if user is not None:
        query = query.where(Job.user == user)
    if project is not None:
        query = query.where(Job.project == project)
    found = {JobState(state): count for state, count in session.execute(query)}
    return {state: found.get(state, 0) for state in JobState}


@dataclass(frozen=True)
class JobRow:
    """One row of the queue: the job and what the table shows of it."""

    job: Job
    elapsed: str  # "HH:MM:SS / limit", or how long it has waited
    where: str  # its nodes as a hostlist ("" while pending)
    reason_kind: str  # quota, budget, resources, priority, unschedulable, submitted, requeued or ""
    reason: str
    cancel: bool  # the viewer may cancel it
    label: str = ""  # what the Job column says: the id, or Slurm's look for arrays (1234_7, 1234_[5-999%50])
    array_row: bool = False  # it stands for its array's pending tasks: cancelling it cancels the whole array


def job_row(view: View, job: Job, now: float, pending: dict[int, list[int]] | None = None) -> JobRow:
    pending = pending or {}
    limit = hms(job.time_limit_s)
    if job.state is JobState.PENDING:
        elapsed = f"waiting {hms(now - job.submitted_at.timestamp())}"
    elif job.started_at is None:
        elapsed = f"– / {limit}"
    else:
        end = job.ended_at.timestamp() if job.ended_at is not None else now
        elapsed = f"{hms(end - job.started_at.timestamp())} / {limit}"
    where = hostlist.collect(list(job.allocation)) if job.allocation and job.state is not JobState.PENDING else ""
    kind, reason = split_reason(job.reason)
    label, array_row = _label(job, pending)
    return JobRow(job, elapsed, where, kind, reason, may_cancel(view, job), label, array_row)


def _label(job: Job, pending: dict[int, list[int]]) -> tuple[str, bool]:
    """The Job column's text, and whether the row stands for its array's pending tasks."""
    if job.array_job_id is None:
        return str(job.id), False
    tasks = pending.get(job.array_job_id) if job.state is JobState.PENDING else None
    if not tasks:
        return f"{job.array_job_id}_{job.array_task_id}", False
    throttle = f"%{job.array_throttle}" if job.array_throttle else ""
    return f"{job.array_job_id}_[{arrays.compact(tasks)}{throttle}]", True


def _page(query: dict[str, str], matched: int) -> int:
    text = query.get("page", "1")
    last = max(1, -(-matched // PAGE_SIZE))
    if not text.isdigit() or not 1 <= int(text) <= min(last, MAX_PAGE):
        raise InvalidInput(f"page is a number from 1 to {last}")
    return int(text)


def _filters(query: dict[str, str]) -> tuple[str, tuple[JobState, ...], str | None, str | None]:
    state = query.get("state", "")
    if state and state not in STATE_FILTERS:
        raise InvalidInput(f"state is one of {', '.join(STATE_FILTERS)}")
    user, project = query.get("user"), query.get("project")
    for name, value, longest in (("user", user, 32), ("project", project, 63)):
        if value is not None and len(value) > longest:
            raise InvalidInput(f"{name} is at most {longest} characters")
    return state, STATE_FILTERS.get(state, ()), user.strip() if user else None, project


def _tab_url(query: dict[str, str], state: str) -> str:
    """A tab's link: the user and project filters kept, the state set (or dropped, for All), page 1."""
    kept = {k: v for k, v in query.items() if k in ("user", "project")} | ({"state": state} if state else {})
    return "/jobs" + (f"?{urlencode(kept)}" if kept else "")


def jobs_view(view: View) -> dict[str, Any]:
    state, states, user, project = _filters(view.query)
    counts = job_counts(view.session, user=user, project=project, collapse_arrays=True)
    matched = sum(counts[s] for s in states) if states else sum(counts.values())
    page = _page(view.query, matched)
    found = queries.list_jobs(
        view.session,
        states=states,
        user=user,
        project=project,
        collapse_arrays=True,
        limit=PAGE_SIZE,
        offset=(page - 1) * PAGE_SIZE,
    )
    shown = {j.array_job_id for j in found if j.array_job_id is not None and j.state is JobState.PENDING}
    pending = queries.pending_tasks(view.session, shown)
    now = view.ctx.clock.now()
    tab = "ended" if state in STATE_FILTERS and state not in ("running", "pending", "") else state
    return {
        "jobs": [job_row(view, j, now, pending) for j in found],
        "matched": matched,
        "total": sum(counts.values()),
        "first": (page - 1) * PAGE_SIZE + 1,
        "page_no": page,  # not "page": that names the page in the navigation
        "last_page": max(1, -(-matched // PAGE_SIZE)),
        "query": view.query,
        "state": state,
        "tab": tab,
        "tabs": [(key, title, _tab_url(view.query, key), _tab_count(counts, key)) for key, title in TABS],
        "state_filters": list(STATE_FILTERS),
        "projects": sorted(view.session.scalars(select(Project.name))),
    }


def _tab_count(counts: dict[JobState, int], state: str) -> int:
    return sum(counts[s] for s in STATE_FILTERS[state]) if state else sum(counts.values())


# --- One job -----------------------------------------------------------------------------------


def find_job(session: Session, text: str) -> Job:
    """The job whose id is `text`; NotFound for anything else (not a number, or no such job)."""
    if not text.isdigit() or not 1 <= int(text) <= 2**63 - 1:
        raise NotFound(f"no such job: {text}")
    return lifecycle.get_job(session, int(text))


@dataclass(frozen=True)
class OutputTail:
    text: str
    earlier: bool  # there is output before what is shown
    empty: bool  # the job has no output on the head at all


def output_tail(session: Session, job: Job, lines: int = OUTPUT_LINES) -> OutputTail:
    """The last `lines` lines of the job's output on the head: stdout and stderr of every rank, in the
    order they arrived. Reads the newest chunks only (at most OUTPUT_CHUNKS, OUTPUT_CHARS)."""
    rows = session.execute(
        select(JobOutputChunk.run, JobOutputChunk.rank, JobOutputChunk.stream, JobOutputChunk.data)
        .where(JobOutputChunk.job_id == job.id)
        .order_by(JobOutputChunk.id.desc())
        .limit(OUTPUT_CHUNKS)
    ).all()
    picked: list[tuple[tuple[int, int, str], str]] = []
    newlines = chars = 0
    for run, rank, stream, data in rows:
        picked.append(((run, rank, stream), data))
        newlines += data.count("\n")
        chars += len(data)
        if newlines > lines or chars >= OUTPUT_CHARS:
            break
    parts: list[str] = []
    source: tuple[int, int, str] | None = None
    for key, data in reversed(picked):
        # Another rank's or stream's chunk starts a line of its own, so lines are never spliced.
        if source is not None and key != source and parts and not parts[-1].endswith("\n"):
            parts.append("\n")
        parts.append(data)
        source = key
    found = "".join(parts).splitlines()
    earlier = len(found) > lines or len(picked) < len(rows) or len(rows) == OUTPUT_CHUNKS
    return OutputTail("\n".join(found[-lines:]), earlier, not rows)


def _command(job: Job) -> str:
    return shlex.join(job.argv) if job.argv else ""


def job_view(view: View, job_id: str) -> dict[str, Any]:
    job = find_job(view.session, job_id)
    now = view.ctx.clock.now()
    reveal = may_see_output(view, job)
    current = [r for r in job.ranks if r.run == job.run]
    return {
        "job": job,
        "row": job_row(view, job, now),
        "gpu_hours": gpu_hours(job, now),
        "time_limit": hms(job.time_limit_s),
        "ranks": job.ranks,
        "reveal": reveal,
        "command": _command(job) if reveal else "",
        "output": output_tail(view.session, job) if reveal else None,
        "output_lines": OUTPUT_LINES,
        "allocation": [(r.node, r.gpu_indexes) for r in current],
        # The charts (outside the live part) of the current run's first CHART_RANKS ranks.
        "chart_ranks": current[:CHART_RANKS],
        "more_ranks": max(0, len(current) - CHART_RANKS),
        "charts": JOB_CHARTS,
    }


# --- Usage -------------------------------------------------------------------------------------

IDLE_SHOWN = 500


def usage_view(view: View) -> dict[str, Any]:
    window = view.query.get("range", "7d")
    if window not in USAGE_RANGES:
        raise InvalidInput(f"range is one of {', '.join(USAGE_RANGES)}")
    by = view.query.get("by", "project")
    if by not in USAGE_BY:
        raise InvalidInput(f"by is one of {', '.join(USAGE_BY)}")
    now = view.ctx.clock.now()
    report = accounting.usage_report(view.session, now - USAGE_RANGES[window][1], now, by)
    idle = attribution.idle_gpus(view.session, now, view.ctx.settings.metrics_interval_s)
    return {
        "report": report,
        "total_gpu_hours": sum(r.gpu_hours for r in report.rows),
        "window": window,
        "ranges": USAGE_RANGES,
        "by": by,
        "by_options": USAGE_BY,
        "idle": [(g, hms(now - g.held_since.timestamp())) for g in idle[:IDLE_SHOWN]],
        "idle_count": len(idle),
        "idle_below": attribution.IDLE_UTIL_PCT,
    }


# --- Routes ------------------------------------------------------------------------------------


@router.get("/jobs", response_class=HTMLResponse)
def jobs_page(request: Request, ctx: Ctx) -> Response:
    return render(request, ctx, "jobs", Permission.JOBS_READ, jobs_view)


@router.get("/jobs/usage", response_class=HTMLResponse)
def usage_page(request: Request, ctx: Ctx) -> Response:
    return render(request, ctx, "job_usage", Permission.JOBS_READ, usage_view, nav="jobs", title="GPU usage")


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
def job_page(job_id: str, request: Request, ctx: Ctx) -> Response:
    return render(
        request,
        ctx,
        "job_detail",
        Permission.JOBS_READ,
        lambda view: job_view(view, job_id),
        nav="jobs",
        title=f"Job {job_id}",
    )
