"""One node's GPUs over time for the dashboard's node page: every GPU's series from one read of the
rows, and the node's newest sample.

Why not `store.query`: it answers for one entity, so a chart of a node's 8 GPUs would read every row
8 times. Here each row is read once for all its GPUs, and only its small `summary` (the GPUs'
`store.SUMMARY_METRICS`, written beside the full values: see `store.sample_rows` and
`store.rollup_rows`), not the full row of every metric of the node, which is twenty times larger to
decode. The split between raw samples and one-minute roll-ups is `store.query`'s (raw rows within
their retention, roll-ups before that), with one addition: a step of a minute or more reads roll-ups
wherever they are already written, raw rows only for the minutes not rolled up yet. A day at 5 s
samples is 17,280 raw rows; the same day in roll-ups is 1,440, and the averages are the same (a
roll-up keeps the sum and count of its minute).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gpufleet.monitoring.models import MetricRollup, MetricSample
from gpufleet.monitoring.store import MAX_POINTS, ROLLUP_BUCKET_S, SUMMARY_METRICS, Retention

RawReader = Callable[[dict[str, float]], float | None]  # a GPU's values in one sample -> value
RollupReader = Callable[[dict[str, list[float]]], tuple[float, float] | None]  # roll-up stats -> (sum, count)
Readers = tuple[RawReader, RollupReader]


def _plain(metric: str) -> Readers:
    def raw(values: dict[str, float]) -> float | None:
        return values.get(metric)

    def rolled(stats: dict[str, list[float]]) -> tuple[float, float] | None:
        cell = stats.get(metric)  # [min, max, sum, count]
        return (cell[2], cell[3]) if cell is not None else None

    return raw, rolled


def _fb_used_pct() -> Readers:
    def raw(values: dict[str, float]) -> float | None:
        used, free = values.get("fb_used_mib"), values.get("fb_free_mib")
        if used is None or free is None or used + free <= 0:
            return None
        return 100.0 * used / (used + free)

    def rolled(stats: dict[str, list[float]]) -> tuple[float, float] | None:
        # A GPU's memory (used + free) is fixed, so the mean share is the share of the means.
        used, free = stats.get("fb_used_mib"), stats.get("fb_free_mib")
        if used is None or free is None or not used[3] or not free[3]:
            return None
        mean_used, mean_free = used[2] / used[3], free[2] / free[3]
        if mean_used + mean_free <= 0:
            return None
        return 100.0 * mean_used / (mean_used + mean_free) * used[3], used[3]

    return raw, rolled


# Values computed from several metrics of one entity, by name. fb_used_pct: the share of the GPU's
# memory in use, from fb_used_mib / (fb_used_mib + fb_free_mib).
DERIVED: dict[str, Callable[[], Readers]] = {"fb_used_pct": _fb_used_pct}


GPU_SERIES = frozenset(SUMMARY_METRICS | DERIVED.keys())


def _readers(metric: str) -> Readers:
    """Raises ValueError for a metric the summaries do not keep."""
    derived = DERIVED.get(metric)
    if derived is not None:
        return derived()
    if metric not in SUMMARY_METRICS:
        raise ValueError(f"no GPU series {metric!r}: one of {', '.join(sorted(GPU_SERIES))}")
    return _plain(metric)


def _gpus(summary: str | None, values: str) -> dict[str, Any]:
    """A row's GPUs: its summary, or (a row written before summaries existed) its full values."""
    if summary is not None:
        decoded: dict[str, Any] = json.loads(summary)
        return decoded
    return {entity: v for entity, v in json.loads(values).items() if entity.startswith("gpu:")}


class _Buckets:
    """Per entity and `step`-wide bucket from `since`: [sum, count]."""

    def __init__(self, since: float, step: float) -> None:
        self.since = since
        self.step = step
        self.sums: dict[str, dict[float, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0.0]))

    def add(self, entity: str, at: float, total: float, count: float) -> None:
        if count and math.isfinite(total):
            cell = self.sums[entity][self.since + math.floor((at - self.since) / self.step) * self.step]
            cell[0] += total
            cell[1] += count

    def means(self) -> dict[str, list[tuple[float, float]]]:
        return {
            entity: [(at, total / count) for at, (total, count) in sorted(buckets.items()) if count]
            for entity, buckets in self.sums.items()
        }


def gpu_series(
    session: Session,
    node_id: int,
    metric: str,
    since: float,
    until: float,
    step: float,
    retention: Retention,
    now: float,
) -> dict[str, list[tuple[float, float]]]:
    """{"gpu:N": [(bucket start, average), ...]} for `metric` (one of `GPU_SERIES`) of every GPU of
    node `node_id`, in `step`-wide buckets from `since`.

    GPUs and buckets without a value are left out, and so are non-finite values. Raises ValueError
    for an unknown metric or a bad range, like `store.query`.
    """
    if until <= since or step <= 0:
        raise ValueError("the range must be non-empty and the step positive")
    if (until - since) / step > MAX_POINTS:
        raise ValueError(f"at most {MAX_POINTS} points: use a larger step")
    read_raw, read_rollup = _readers(metric)
    buckets = _Buckets(since, step)
    split = max(since, now - retention.raw_s)  # roll-ups before, raw rows from here
    if step >= ROLLUP_BUCKET_S:
        newest = session.scalar(select(func.max(MetricRollup.bucket)).where(MetricRollup.node_id == node_id))
        if newest is not None:
            split = max(split, min(newest + ROLLUP_BUCKET_S, until))
    if since < split:
        rollups = session.execute(
            select(MetricRollup.bucket, MetricRollup.summary, MetricRollup.values).where(
                MetricRollup.node_id == node_id, MetricRollup.bucket >= since, MetricRollup.bucket < split
            )
        )
        for start, summary, values in rollups:
            for entity, stats in _gpus(summary, values).items():
                if (found := read_rollup(stats)) is not None:
                    buckets.add(entity, start, *found)
    if split < until:
        samples = session.execute(
            select(MetricSample.ts, MetricSample.summary, MetricSample.values).where(
                MetricSample.node_id == node_id, MetricSample.ts >= split, MetricSample.ts < until
            )
        )
        for ts, summary, values in samples:
            for entity, gpu in _gpus(summary, values).items():
                if (value := read_raw(gpu)) is not None:
                    buckets.add(entity, ts, value, 1.0)
    return buckets.means()


def latest(session: Session, node_id: int, since: float) -> tuple[float, dict[str, dict[str, Any]]] | None:
    """(ts, {entity: {metric: value}}) of the node's newest sample with ts >= `since`, or None.

    One row through the (node_id, ts) index; `fleet.latest_gpu_values` answers for every node at once.
    """
    row = session.execute(
        select(MetricSample.ts, MetricSample.values)
        .where(MetricSample.node_id == node_id, MetricSample.ts >= since)
        .order_by(MetricSample.ts.desc(), MetricSample.id.desc())
        .limit(1)
    ).one_or_none()
    if row is None:
        return None
    return row[0], json.loads(row[1])
