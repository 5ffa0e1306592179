"""A job's GPUs over its lifetime: the per-GPU charts of the GPUs its ranks held, while they held them.

`GET /api/v1/jobs/{id}/gpu-charts` answers a `Chart` like `GET /api/v1/nodes/{name}/gpu-charts`
(api.routers.monitoring), read the same way (`monitoring.node_series`, one pass over each node's rows),
but with only the GPU indexes the job's ranks were given, and over the run's window: from the first
rank's placement until the last rank let go of its GPUs, or until now while one still holds them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated

from fastapi import APIRouter, Query

from gpufleet.api.deps import Ctx, RowId, allow, tx
from gpufleet.api.routers.monitoring import CHART_POINTS, GPU_CHARTS
from gpufleet.auth.policy import Permission
from gpufleet.auth.schemas import Principal
from gpufleet.core.durations import parse_duration
from gpufleet.core.errors import InvalidInput, NotFound
from gpufleet.jobs import lifecycle
from gpufleet.jobs.models import Job, JobRank
from gpufleet.monitoring import node_series
from gpufleet.monitoring.schemas import Chart, ChartSeries
from gpufleet.monitoring.store import MAX_POINTS, Retention

router = APIRouter(prefix="/jobs", tags=["jobs"])
_GPU_ENTITY = re.compile(r"^gpu:(\d+)$")


@dataclass(frozen=True)
class Window:
    """Where a run's GPUs were held: [since, until), Unix seconds."""

    since: float
    until: float


def run_ranks(job: Job, run: int | None = None, node: str | None = None) -> list[JobRank]:
    """The ranks of run `run` (default: the job's current, or last, run), only the one on `node` if given.

    Raises NotFound for a node the run has no rank on. A job never placed has no ranks: [] (no error).
    """
    wanted = job.run if run is None else run
    ranks = [r for r in job.ranks if r.run == wanted]
    if node is not None:
        ranks = [r for r in ranks if r.node == node]
        if not ranks:
            raise NotFound(f"run {wanted} of job {job.id} has no rank on {node}")
    return ranks


def held_window(ranks: Sequence[JobRank], now: float) -> Window | None:
    """From the first placement to the last release of the ranks' GPUs (now while one still holds them)."""
    if not ranks:
        return None
    since = min(r.assigned_at.timestamp() for r in ranks)
    ends = [r.ended_at.timestamp() if r.ended_at is not None else None for r in ranks]
    until = now if any(e is None for e in ends) else max(e for e in ends if e is not None)
    return Window(since, min(until, now))


def job_chart(
    ranks: Sequence[tuple[JobRank, dict[str, list[tuple[float, float]]]]],
    metric: str,
    times: list[float],
) -> Chart:
    """One series per allocated GPU ("GPU 3", or "n1 GPU 3" when several nodes are charted together),
    from each rank's node series; a GPU the job did not hold is left out."""
    title, unit = GPU_CHARTS[metric]
    several = len({rank.node for rank, _ in ranks}) > 1
    series = []
    for rank, found in ranks:
        by_index: dict[int, dict[float, float]] = {}
        for entity, points in found.items():
            matched = _GPU_ENTITY.match(entity)
            if matched is not None:
                by_index[int(matched.group(1))] = dict(points)
        for index in sorted(rank.gpu_indexes):
            label = f"{rank.node} GPU {index}" if several else f"GPU {index}"
            values = by_index.get(index, {})
            series.append(ChartSeries(label=label, values=[values.get(t) for t in times]))
    return Chart(title=title, unit=unit, t=times, series=series)


def chart_steps(
    window: Window, step: str | None, interval_s: float, retention: Retention, now: float
) -> tuple[list[float], float]:
    """The chart's times and step: from the window's start (or as far back as the metrics are kept)
    to its end, about CHART_POINTS steps unless `step` says. No times when none of it is kept.

    Unlike a node's charts the steps start at the window's start, not on multiples of the step: the
    start is fixed (the placement), so the steps stay put across fetches, and no step begins before
    the job held its GPUs (another job's samples would count in it).
    """
    since = max(window.since, now - retention.rollup_s)
    span = window.until - since
    step_s = float(parse_duration(step)) if step else max(span / CHART_POINTS, interval_s)
    if span <= 0:
        return [], step_s
    if span / step_s > MAX_POINTS:
        raise InvalidInput(f"at most {MAX_POINTS} points: use a larger step")
    return [since + i * step_s for i in range(math.ceil(span / step_s))], step_s


@router.get("/{job_id}/gpu-charts")
def job_gpu_charts(
    job_id: RowId,
    _: Annotated[Principal, allow(Permission.JOBS_READ)],
    ctx: Ctx,
    metric: Annotated[str, Query(max_length=64, description=", ".join(GPU_CHARTS))] = "gpu_util",
    node: Annotated[str | None, Query(max_length=64, description="only the rank on this node")] = None,
    run: Annotated[int | None, Query(ge=1, le=1_000_000, description="default: the job's current run")] = None,
    step: Annotated[
        str | None, Query(max_length=16, description="bucket width, e.g. 1m; default: about 120 points")
    ] = None,
) -> Chart:
    """The GPUs the job's ranks held (each rank's own indexes only), over the time they held them: one
    series per GPU, the mean of `metric` in each step, null where the GPU reported nothing. A job not
    placed yet has no series."""
    if metric not in GPU_CHARTS:
        raise InvalidInput(f"no GPU chart {metric!r}: one of {', '.join(GPU_CHARTS)}")
    retention = ctx.monitoring.retention
    now = ctx.clock.now()
    with tx(ctx, readonly=True) as db:
        job = lifecycle.get_job(db, job_id)
        ranks = run_ranks(job, run, node)
        window = held_window(ranks, now)
        times, step_s = (
            chart_steps(window, step, ctx.settings.metrics_interval_s, retention, now) if window else ([], 0.0)
        )
        found: list[tuple[JobRank, dict[str, list[tuple[float, float]]]]] = []
        for rank in ranks:
            series: dict[str, list[tuple[float, float]]] = {}
            if window is not None and times and rank.node_id is not None:
                try:
                    series = node_series.gpu_series(
                        db, rank.node_id, metric, times[0], window.until, step_s, retention, now
                    )
                except ValueError as exc:
                    raise InvalidInput(str(exc)) from None
            found.append((rank, series))
    return job_chart(found, metric, times)
