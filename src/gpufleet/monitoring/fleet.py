"""Fleet-wide metrics for the dashboard: every node's newest sample (the GPU heat map) and the fleet's charts.

Why a module of its own: `store.query` answers for one metric of one entity of one node. The
dashboard's overview asks about the whole fleet at once, and must answer in well under 300 ms at
1,000 nodes x 8 GPUs. A thousand `store.query` calls, or averaging a thousand nodes' roll-ups on every
page view, would take seconds. So the heat map is one query returning one row per node, and the charts
read the fleet roll-ups (`models.FleetRollup`): one small row per minute, which the leader computes
from the node roll-ups when it writes them (`store.fleet_rollup_rows`).

The charts lag by up to two minutes (a minute is rolled up once complete, and roll-ups run every
minute); the heat map is as fresh as the last sample flush.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict

from sqlalchemy import and_, func, select
from sqlalchemy.orm import Session

from gpufleet.monitoring.models import FleetRollup, MetricSample
from gpufleet.monitoring.store import MAX_POINTS

# What each fleet series is, from a fleet roll-up's [sum, count] (the sum and count of every GPU's mean
# over the minute):
# - "mean": sum/count, the mean GPU. Over a step of several minutes, sum of sums / sum of counts, so
#   every GPU-minute weighs the same.
# - "total": sum alone. The mean of a sum is the sum of the means, so the sum of every GPU's mean power
#   over the minute is the fleet's mean total draw in that minute, whatever the sample interval.
#   Dividing by count would give the mean GPU's power, and dividing by the number of raw samples would
#   depend on how often agents sample. Over a step, the total is the mean of the per-minute totals:
#   divided by the number of minutes that have a roll-up, not by step/60, so a minute without one (the
#   head was down) is a gap, not a dip. A GPU silent for a whole minute adds nothing to that minute's
#   total: the total is of the GPUs that reported.
FLEET_SERIES: dict[str, str] = {"gpu_util": "mean", "power_w": "total", "gpu_temp_c": "mean"}


def latest_gpu_values(session: Session, since: float) -> dict[int, dict[str, dict[str, float]]]:
    """{node id: {"gpu:N": {metric: value}}}: the GPUs' `store.SUMMARY_METRICS` in every node's newest
    sample with ts >= `since` (read from the sample's small summary, not its full values).

    One query: samples joined to the newest ts per node. Nodes with no sample since `since` are absent;
    of two rows with a node's newest ts (a sample stored twice) either may be returned. Keep `since`
    recent (a few sample intervals): the newest-per-node subquery reads every sample after it.
    """
    # Grouped by `node_id + 0`, not the bare column: SQLite, which keeps no statistics, would otherwise
    # walk the whole (node_id, ts) index, every sample of the day, to save a sort; an expression leaves
    # it the ts index, which reads only the samples since `since`. PostgreSQL plans the same either way.
    node = (MetricSample.node_id + 0).label("node_id")
    newest = (
        select(node, func.max(MetricSample.ts).label("ts")).where(MetricSample.ts >= since).group_by(node).subquery()
    )
    rows = session.execute(
        select(MetricSample.node_id, MetricSample.summary).join(
            newest, and_(MetricSample.node_id == newest.c.node_id, MetricSample.ts == newest.c.ts)
        )
    )  # no ORDER BY: sorting would copy every row's JSON
    return {node_id: json.loads(raw) for node_id, raw in rows if raw is not None}


def fleet_series(session: Session, since: float, until: float, step: float) -> dict[str, list[tuple[float, float]]]:
    """{series: [(bucket start, value), ...]} for each of `FLEET_SERIES`, from the fleet roll-ups whose
    minute starts in [since, until), averaged into `step`-wide buckets starting at `since`: "gpu_util"
    and "gpu_temp_c" the fleet's mean GPU, "power_w" the fleet's total draw (see `FLEET_SERIES`).
    Buckets without data are left out. Raises ValueError for a bad range, like `store.query`.
    """
    if until <= since or step <= 0:
        raise ValueError("the range must be non-empty and the step positive")
    if (until - since) / step > MAX_POINTS:
        raise ValueError(f"at most {MAX_POINTS} points: use a larger step")
    # per series and step bucket: [sum of sums, sum of counts, minutes]
    acc: dict[str, dict[float, list[float]]] = {name: defaultdict(lambda: [0.0, 0.0, 0.0]) for name in FLEET_SERIES}
    rows = session.execute(
        select(FleetRollup.bucket, FleetRollup.values).where(FleetRollup.bucket >= since, FleetRollup.bucket < until)
    )
    for bucket, raw in rows:
        at = since + math.floor((bucket - since) / step) * step
        values = json.loads(raw)
        for name, cells in acc.items():
            stats = values.get(name)
            if stats is None:
                continue
            cell = cells[at]
            cell[0] += stats[0]
            cell[1] += stats[1]
            cell[2] += 1
    series: dict[str, list[tuple[float, float]]] = {}
    for name, kind in FLEET_SERIES.items():
        points = sorted(acc[name].items())
        if kind == "mean":
            series[name] = [(at, total / count) for at, (total, count, _) in points if count]
        else:
            series[name] = [(at, total / minutes) for at, (total, _, minutes) in points if minutes]
    return series
