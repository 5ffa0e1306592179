"""GPU time: what each project has used (fair share, budgets) and the usage report.

Everything is computed from the ranks: a rank holds `len(gpu_indexes)` GPUs from `assigned_at` until
`ended_at` (or now, while it still holds them); a rank of a MIG profile holds its devices, each counted as
its share of a GPU (a 1g instance is 1/7: inventory.mig_layouts.instance_fraction), and a rank on time-sliced
or MPS replicas 1/N of a GPU for each (protocol.sharing). Ranks, not jobs,
because a requeued job runs several times on different nodes, and a cancelled job's GPUs stay held
until its processes are gone.

Fair share needs each project's *decayed* use: a GPU-second used `a` seconds ago counts 2^(-a/H) for the
half-life H. Over a rank's interval [s, e] that integral has a closed form,
    gpus * H/ln 2 * (2^(-(now-e)/H) - 2^(-(now-s)/H)),
so no usage table has to be kept up to date: the ranks are the record.
"""

from __future__ import annotations

import calendar
import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from gpufleet.auth.projects import BudgetPeriod, Project
from gpufleet.core.clock import to_datetime
from gpufleet.inventory.mig_layouts import instance_fraction
from gpufleet.jobs.models import Job, JobRank
from gpufleet.jobs.scheduler import ProjectLimits
from gpufleet.jobs.schemas import UsageReport, UsageRow
from gpufleet.protocol.sharing import SHARED_PROFILE, share_of

# Ranks that ended longer ago than this many half-lives weigh under 0.1 % in fair share: not read.
FORGET_AFTER_HALF_LIVES = 10


@dataclass(frozen=True, slots=True)
class Held:
    """One rank's GPU holding, as plain numbers."""

    job_id: int
    user: str
    project: str | None
    gpus: float
    start: float
    end: float | None  # None: still held

    def seconds_within(self, since: float, until: float) -> float:
        end = until if self.end is None else min(self.end, until)
        return self.gpus * max(end - max(self.start, since), 0.0)


def holdings(session: Session, ended_after: float) -> list[Held]:
    """Ranks held now or ended after `ended_after`."""
    rows = session.execute(
        select(
            JobRank.job_id,
            Job.user,
            Job.project,
            JobRank.gpu_indexes,
            JobRank.gpu_uuids,
            Job.gpu_profile,
            JobRank.assigned_at,
            JobRank.ended_at,
        )
        .join(Job, Job.id == JobRank.job_id)
        .where(or_(JobRank.ended_at.is_(None), JobRank.ended_at > to_datetime(ended_after)))
    )
    return [
        Held(
            job_id,
            user,
            project,
            _held_gpus(gpus, uuids or [], profile),
            start.timestamp(),
            end.timestamp() if end is not None else None,
        )
        for job_id, user, project, gpus, uuids, profile, start, end in rows
    ]


def _held_gpus(indexes: list[int], uuids: list[str], profile: str | None) -> float:
    """GPUs a rank holds: whole GPUs, MIG instances at their share, replicas at 1/N of their GPU."""
    if profile == SHARED_PROFILE:
        return sum(share_of(u) for u in uuids)
    return len(indexes) * (instance_fraction(profile) if profile else 1.0)


def decayed_gpu_seconds(held: Held, now: float, half_life_s: float) -> float:
    end = now if held.end is None else min(held.end, now)
    if end <= held.start:
        return 0.0
    k = math.log(2) / half_life_s
    return held.gpus * (math.exp(-k * (now - end)) - math.exp(-k * (now - held.start))) / k


def period_start(period: BudgetPeriod, now: float) -> float:
    """The start (UTC) of the budget period that contains `now`: Monday, the 1st, or the quarter's first day."""
    day = datetime.fromtimestamp(now, UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    if period is BudgetPeriod.WEEK:
        start = day - timedelta(days=day.weekday())
    elif period is BudgetPeriod.MONTH:
        start = day.replace(day=1)
    else:
        start = day.replace(month=3 * ((day.month - 1) // 3) + 1, day=1)
    return calendar.timegm(start.timetuple())


def project_limits(session: Session, now: float, half_life_s: float) -> dict[str, ProjectLimits]:
    """Every project's quota, GPU-hours left in its budget period, and decayed use, for `schedule`."""
    projects = list(session.scalars(select(Project)))
    earliest = min(
        [now - FORGET_AFTER_HALF_LIVES * half_life_s] + [period_start(p.budget_period, now) for p in projects]
    )
    by_project: dict[str | None, list[Held]] = defaultdict(list)
    for h in holdings(session, earliest):
        by_project[h.project].append(h)
    limits: dict[str, ProjectLimits] = {}
    for p in projects:
        held = by_project.get(p.name, [])
        usage = sum(decayed_gpu_seconds(h, now, half_life_s) for h in held)
        left = None
        if p.gpu_hours_budget is not None:
            since = period_start(p.budget_period, now)
            # The part of still-running ranks to come is reserved by the scheduler itself.
            used = sum(h.seconds_within(since, now) for h in held) / 3600.0
            left = p.gpu_hours_budget - used
        limits[p.name] = ProjectLimits(max_gpus=p.max_gpus, gpu_hours_left=left, usage=usage)
    return limits


def usage_report(session: Session, since: float, until: float, by: str) -> UsageReport:
    """GPU-hours within [since, until] per project, user or job, with the mean GPU utilization of those jobs."""
    if by not in ("project", "user", "job"):
        raise ValueError(f"cannot group usage by {by!r}")
    held = [h for h in holdings(session, since) if h.start < until]
    seconds: dict[str, float] = defaultdict(float)
    jobs: dict[str, set[int]] = defaultdict(set)
    for h in held:
        key = str(h.job_id) if by == "job" else (h.user if by == "user" else (h.project or "(none)"))
        seconds[key] += h.seconds_within(since, until)
        jobs[key].add(h.job_id)
    util = _job_util(session, {j for ids in jobs.values() for j in ids})
    rows = []
    for key in sorted(seconds, key=lambda k: (-seconds[k], k)):
        sampled = sum(util[j][0] for j in jobs[key] if j in util)
        busy = sum(util[j][1] for j in jobs[key] if j in util)
        rows.append(
            UsageRow(
                key=key,
                jobs=len(jobs[key]),
                gpu_hours=round(seconds[key] / 3600.0, 4),
                mean_gpu_util=round(100.0 * busy / sampled, 1) if sampled > 0 else None,
            )
        )
    return UsageReport(since=to_datetime(since), until=to_datetime(until), by=by, rows=rows)


def _job_util(session: Session, ids: Iterable[int]) -> dict[int, tuple[float, float]]:
    wanted = list(ids)
    if not wanted:
        return {}
    rows = session.execute(select(Job.id, Job.sampled_gpu_seconds, Job.busy_gpu_seconds).where(Job.id.in_(wanted)))
    return {job_id: (sampled, busy) for job_id, sampled, busy in rows}
