"""The metric store: write samples in batches, roll them up, prune them, and answer queries.

Raw samples are kept `raw_retention_s` (a day by default), one-minute roll-ups `rollup_retention_s`
(thirty days). A query picks raw rows where they still exist and roll-ups before that, and averages
into `step`-wide buckets.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, func, insert, select
from sqlalchemy.orm import Session

from gpufleet.monitoring.models import MetricRollup, MetricSample
from gpufleet.protocol.metrics import Sample

ROLLUP_BUCKET_S = 60.0
MAX_POINTS = 11_000  # per query, what a graph can use; a smaller step than that is refused


@dataclass(frozen=True)
class Retention:
    raw_s: float = 86_400.0
    rollup_s: float = 30 * 86_400.0


def sample_rows(node_id: int, samples: list[Sample]) -> list[dict[str, Any]]:
    """Rows for `write_rows`: one per sample, every entity's values in one JSON object."""
    return [
        {
            "node_id": node_id,
            "ts": s.ts,
            "values": json.dumps({e.entity: e.values for e in s.entities}, separators=(",", ":")),
        }
        for s in samples
    ]


def write_rows(session: Session, rows: list[dict[str, Any]]) -> None:
    """Insert in one executemany; rows of nodes removed meanwhile are the caller's to filter."""
    if rows:
        session.execute(insert(MetricSample), rows)


def rollup_rows(session: Session, until: float, bucket_s: float = ROLLUP_BUCKET_S) -> list[dict[str, Any]]:
    """Roll-up rows for every complete bucket before `until` not rolled up yet (write them with
    `write_rollups`). Only reads, so the caller can aggregate outside the write lock.

    Idempotent: it starts after the newest bucket already written, so a leader that changes halfway
    repeats nothing.
    """
    newest = session.scalar(select(func.max(MetricRollup.bucket)))
    if newest is not None:
        start = newest + bucket_s
    else:
        oldest = session.scalar(select(func.min(MetricSample.ts)))
        if oldest is None:
            return []
        start = math.floor(oldest / bucket_s) * bucket_s
    end = math.floor(until / bucket_s) * bucket_s
    if end <= start:
        return []
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
        {"node_id": n, "bucket": b, "values": json.dumps(entities, separators=(",", ":"))}
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


def rollup(session: Session, until: float, bucket_s: float = ROLLUP_BUCKET_S) -> int:
    """`rollup_rows` and `write_rollups` in one session (tests; small data). Returns rows written."""
    rows = rollup_rows(session, until, bucket_s)
    write_rollups(session, rows)
    return len(rows)


def prune(session: Session, now: float, retention: Retention) -> None:
    session.execute(delete(MetricSample).where(MetricSample.ts < now - retention.raw_s))
    session.execute(delete(MetricRollup).where(MetricRollup.bucket < now - retention.rollup_s))


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
