"""The metric store: write samples in batches, roll them up, prune them, and answer queries.

Raw samples are kept `raw_retention_s` (a day by default), one-minute roll-ups `rollup_retention_s`
(thirty days). A query picks raw rows where they still exist and roll-ups before that, and averages
into `step`-wide buckets. Fleet roll-ups (one row per minute for the whole fleet, for the dashboard's
charts: see `monitoring.fleet`) are computed from the node roll-ups and kept as long as they are.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, func, insert, select
from sqlalchemy.orm import Session

from gpufleet.monitoring.models import FleetRollup, MetricRollup, MetricSample
from gpufleet.protocol.metrics import Sample

ROLLUP_BUCKET_S = 60.0
MAX_POINTS = 11_000  # per query, what a graph can use; a smaller step than that is refused
# GPU metrics the fleet roll-ups and each sample's and roll-up's `summary` keep: the gauges the
# dashboard's fleet views and GPU charts show. Few on purpose: reading a thousand nodes' newest samples
# or a day of a node's roll-ups is mostly decoding JSON, and a summary is a twentieth of a full row.
SUMMARY_METRICS = frozenset({"gpu_util", "power_w", "gpu_temp_c", "fb_used_mib", "fb_free_mib"})


@dataclass(frozen=True)
class Retention:
    raw_s: float = 86_400.0
    rollup_s: float = 30 * 86_400.0
    logs_s: float = 7 * 86_400.0  # log lines and their events (gpufleet.logs.store)


def _summary(entities: dict[str, dict[str, Any]]) -> str:
    """The GPUs' SUMMARY_METRICS of a sample's or roll-up's entities, as the `summary` column keeps them."""
    gpus = {
        entity: {m: v for m, v in values.items() if m in SUMMARY_METRICS}
        for entity, values in entities.items()
        if entity.startswith("gpu:")
    }
    return json.dumps(gpus, separators=(",", ":"))


def sample_rows(node_id: int, samples: list[Sample]) -> list[dict[str, Any]]:
    """Rows for `write_rows`: one per sample, every entity's values in one JSON object, and the
    GPUs' `SUMMARY_METRICS` again in a small one (the dashboard's fleet and GPU views read only that)."""
    return [
        {
            "node_id": node_id,
            "ts": s.ts,
            "values": json.dumps(entities, separators=(",", ":")),
            "summary": _summary(entities),
        }
        for s, entities in ((s, {e.entity: e.values for e in s.entities}) for s in samples)
    ]


def write_rows(session: Session, rows: list[dict[str, Any]]) -> None:
    """Insert in one executemany; rows of nodes removed meanwhile are the caller's to filter."""
    if rows:
        session.execute(insert(MetricSample), rows)


def rollup_window(session: Session, until: float, bucket_s: float = ROLLUP_BUCKET_S) -> tuple[float, float] | None:
    """[start, end) of the complete buckets before `until` not rolled up yet; None when there are none.
    Two indexed look-ups: cheap enough to ask before starting any aggregation."""
    newest = session.scalar(select(func.max(MetricRollup.bucket)))
    if newest is not None:
        start = newest + bucket_s
    else:
        oldest = session.scalar(select(func.min(MetricSample.ts)))
        if oldest is None:
            return None
        start = math.floor(oldest / bucket_s) * bucket_s
    end = math.floor(until / bucket_s) * bucket_s
    return (start, end) if end > start else None


def rollup_rows(session: Session, until: float, bucket_s: float = ROLLUP_BUCKET_S) -> list[dict[str, Any]]:
    """Roll-up rows for every complete bucket before `until` not rolled up yet (write them with
    `write_rollups`). Only reads, so the caller can aggregate outside the write lock.

    Idempotent: it starts after the newest bucket already written, so a leader that changes halfway
    repeats nothing.
    """
    window = rollup_window(session, until, bucket_s)
    if window is None:
        return []
    start, end = window
    acc: dict[tuple[int, float], dict[str, dict[str, list[float]]]] = defaultdict(dict)
    query = select(MetricSample.node_id, MetricSample.ts, MetricSample.values).where(
        MetricSample.ts >= start, MetricSample.ts < end
    )
    for node_id, ts, raw in session.execute(query):
        entities = acc[(node_id, math.floor(ts / bucket_s) * bucket_s)]
        for entity, values in json.loads(raw).items():
            stats = entities.setdefault(entity, {})
            for metric, value in values.items():
                cell = stats.get(metric)
                if cell is None:
                    stats[metric] = [value, value, value, 1.0]
                else:
                    cell[0] = min(cell[0], value)
                    cell[1] = max(cell[1], value)
                    cell[2] += value
                    cell[3] += 1
    return [
        {
            "node_id": n,
            "bucket": b,
            "values": json.dumps(entities, separators=(",", ":")),
            "summary": _summary(entities),
        }
        for (n, b), entities in acc.items()
    ]


def write_rollups(session: Session, rows: list[dict[str, Any]]) -> None:
    """Insert roll-ups, skipping buckets another leader wrote meanwhile."""
    if not rows:
        return
    newest = session.scalar(select(func.max(MetricRollup.bucket)))
    if newest is not None:
        rows = [r for r in rows if r["bucket"] > newest]
    if rows:
        session.execute(insert(MetricRollup), rows)


def fleet_rollup_rows(node_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Fleet roll-up rows (write them with `write_fleet_rollups`) from `rollup_rows`' node rows; reads nothing.

    Per bucket and metric of `SUMMARY_METRICS`: [sum, count] of the means of every GPU that reported it
    in the bucket. Each GPU counts once, however many samples it sent, so sum/count is the fleet's mean
    (utilisation, temperature) and sum its total (power, memory used). A non-finite mean is left out:
    one GPU reporting NaN must not blank the whole fleet's minute. Sums are stored to three decimals,
    counts as integers: shorter rows decode faster, and a chart needs no more.
    """
    acc: dict[float, dict[str, list[float]]] = defaultdict(dict)
    for row in node_rows:
        fleet = acc[row["bucket"]]
        for entity, stats in json.loads(row["values"]).items():
            if not entity.startswith("gpu:"):
                continue
            for metric, cell in stats.items():
                if metric not in SUMMARY_METRICS or not cell[3]:
                    continue
                mean = cell[2] / cell[3]
                if not math.isfinite(mean):
                    continue
                sums = fleet.get(metric)
                if sums is None:
                    fleet[metric] = [mean, 1.0]
                else:
                    sums[0] += mean
                    sums[1] += 1
    return [
        {
            "bucket": bucket,
            "values": json.dumps(
                {metric: [round(total, 3), int(count)] for metric, (total, count) in metrics.items()},
                separators=(",", ":"),
            ),
        }
        for bucket, metrics in sorted(acc.items())
        if metrics
    ]


def write_fleet_rollups(session: Session, rows: list[dict[str, Any]]) -> None:
    """Insert fleet roll-ups, skipping buckets already written (by another leader, or an earlier pass).

    `bucket` is unique besides: two leaders writing the same minute at once make one of them fail and
    roll back its whole pass (node roll-ups included), which the next pass repeats.
    """
    if not rows:
        return
    buckets = [r["bucket"] for r in rows]
    present = set(
        session.scalars(
            select(FleetRollup.bucket).where(FleetRollup.bucket >= min(buckets), FleetRollup.bucket <= max(buckets))
        )
    )
    rows = [r for r in rows if r["bucket"] not in present]
    if rows:
        session.execute(insert(FleetRollup), rows)


def rollup(session: Session, until: float, bucket_s: float = ROLLUP_BUCKET_S) -> int:
    """`rollup_rows`, `write_rollups` and the fleet's in one session (tests; small data). Returns node rows written."""
    rows = rollup_rows(session, until, bucket_s)
    write_rollups(session, rows)
    write_fleet_rollups(session, fleet_rollup_rows(rows))
    return len(rows)


def prune(session: Session, now: float, retention: Retention) -> None:
    session.execute(delete(MetricSample).where(MetricSample.ts < now - retention.raw_s))
    session.execute(delete(MetricRollup).where(MetricRollup.bucket < now - retention.rollup_s))
    session.execute(delete(FleetRollup).where(FleetRollup.bucket < now - retention.rollup_s))


def query(
    session: Session,
    node_id: int,
    entity: str,
    metric: str,
    since: float,
    until: float,
    step: float,
    retention: Retention,
    now: float,
) -> list[tuple[float, float]]:
    """(bucket start, average) pairs for one metric of one entity. Raises ValueError for a bad range."""
    if until <= since or step <= 0:
        raise ValueError("the range must be non-empty and the step positive")
    if (until - since) / step > MAX_POINTS:
        raise ValueError(f"at most {MAX_POINTS} points: use a larger step")
    sums: dict[float, list[float]] = defaultdict(lambda: [0.0, 0.0])

    def add(at: float, total: float, count: float) -> None:
        cell = sums[since + math.floor((at - since) / step) * step]
        cell[0] += total
        cell[1] += count

    raw_from = max(since, now - retention.raw_s)
    if since < raw_from:  # the part older than the raw data: roll-ups
        rows = session.execute(
            select(MetricRollup.bucket, MetricRollup.values).where(
                MetricRollup.node_id == node_id,
                MetricRollup.bucket >= since,
                MetricRollup.bucket < raw_from,
            )
        )
        for bucket, raw in rows:
            stats = json.loads(raw).get(entity, {}).get(metric)
            if stats is not None:
                add(bucket, stats[2], stats[3])
    rows = session.execute(
        select(MetricSample.ts, MetricSample.values).where(
            MetricSample.node_id == node_id,
            MetricSample.ts >= raw_from,
            MetricSample.ts < until,
        )
    )
    for ts, raw in rows:
        value = json.loads(raw).get(entity, {}).get(metric)
        if value is not None:
            add(ts, value, 1)
    return [(bucket, total / count) for bucket, (total, count) in sorted(sums.items()) if count]
