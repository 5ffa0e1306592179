"""Shared file systems across the fleet: each node's view of each mount, a verdict per file system, alerts.

The agents send one `fs:<mount point>` entity per shared mount (agent.storage) and a `MountInfo` saying
what it is. Here, in memory, from the tracker (the nodes this replica holds):

- `NodeMount`: one node's view of one mount: its state (ok, hung, stale, error, not mounted), the mean
  time per operation over the last sample interval (the change of `fs_op_seconds` over that of
  `fs_ops`: NFS RPC round trips, Lustre llite calls; where the kind keeps no counters, the probe's own
  stat+statvfs time), operations per second and how full it is;
- `FileSystem`: the same file system (its source: `server:/export`, the Lustre name, the GPFS device)
  as every node sees it, with a verdict telling "hung on 3 of 40 nodes" (look at those nodes, their
  network path) from "hung everywhere" (look at the server), and "slow on 3 nodes" from "slow
  everywhere": a node is slow when its time per operation is `factor` times its own baseline, or, with
  at least three nodes, `factor` times the median of the others;
- `StorageWatch`, fed each node's new samples by the health pass like the GPU anomaly watch, fires
  `StorageMountHung` (hung, stale, gone: a stuck mount stalls every job that reads it), `StorageAlmostFull`
  (space or inodes over `fill_pct`) and `StorageSlow` (time per operation `factor` times the mount's own
  baseline on that node, an exponentially weighted mean of its normal samples).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpufleet.inventory.models import Node
from gpufleet.monitoring.checks import Entities, Values
from gpufleet.monitoring.thresholds import ThresholdRule, Transition
from gpufleet.monitoring.tracker import HealthTracker
from gpufleet.protocol.metrics import FS_STATES, MountInfo

HUNG_RULE = ThresholdRule("StorageMountHung", "fs_state", "fs", "!=", 0, 0, "critical", builtin=True)
FULL_RULE = ThresholdRule("StorageAlmostFull", "fs_used_pct", "fs", ">=", 90, 0, "warning", builtin=True)
SLOW_RULE = ThresholdRule("StorageSlow", "fs_op_seconds", "fs", ">", 0, 0, "warning", builtin=True)
STORAGE_RULES = (HUNG_RULE, FULL_RULE, SLOW_RULE)

ALPHA = 0.05  # weight of a new interval in a warm baseline
WARMUP = 12  # intervals before a baseline is judged against
CONSECUTIVE = 3  # slow intervals in a row before StorageSlow fires
MIN_OPS = 10  # fewer operations in an interval say nothing about latency: the probe's time is used
FLOOR_S = 0.001  # a rise smaller than this is never "slow"
FILL_HYSTERESIS_PCT = 2.0


def used_pct(values: Values) -> float | None:
    """Space used as df computes it (reserved blocks count as used), percent."""
    size, free, avail = values.get("fs_size_bytes"), values.get("fs_free_bytes"), values.get("fs_avail_bytes")
    if size is None or free is None or avail is None:
        return None
    used = size - free
    return 100.0 * used / (used + avail) if used + avail > 0 else 0.0


def inodes_used_pct(values: Values) -> float | None:
    files, free = values.get("fs_files"), values.get("fs_files_free")
    if not files or free is None:
        return None
    return 100.0 * (files - free) / files


def interval_latency(latest: Values, previous: Values | None) -> tuple[float | None, float | None]:
    """(seconds per operation, operations per second) between two samples of one mount; the ops rate is
    None without counters. Falls back to the probe's time when too few operations ran."""
    probe = latest.get("fs_probe_seconds") if latest.get("fs_state") == 0 else None
    if previous is None:
        return probe, None
    ops_now, ops_then = latest.get("fs_ops"), previous.get("fs_ops")
    time_now, time_then = latest.get("fs_op_seconds"), previous.get("fs_op_seconds")
    if ops_now is None or ops_then is None or time_now is None or time_then is None:
        return probe, None
    ops = ops_now - ops_then
    spent = time_now - time_then
    if ops < 0 or spent < 0:  # a remount restarted the counters
        return probe, None
    if ops < MIN_OPS:
        return probe, ops
    return spent / ops, ops


@dataclass(frozen=True)
class NodeMount:
    node: str
    node_id: int
    mountpoint: str
    state: str
    latency_ms: float | None = None
    ops_per_s: float | None = None
    probe_ms: float | None = None
    used_pct: float | None = None
    inodes_used_pct: float | None = None
    retransmissions: float | None = None  # NFS: transmissions beyond one per operation, since the mount
    required: bool = False
    baseline_ms: float | None = None
    slow: bool = False


@dataclass
class FileSystem:
    source: str
    fstype: str
    mountpoints: list[str]
    nodes: list[NodeMount] = field(default_factory=list)
    verdict: str = ""
    status: str = "ok"  # ok, slow, degraded (part of the fleet), down (everywhere)

    @property
    def used_pct(self) -> float | None:
        fills = [n.used_pct for n in self.nodes if n.used_pct is not None]
        return max(fills) if fills else None


def _names(nodes: Sequence[NodeMount], most: int = 5) -> str:
    shown = ", ".join(n.node for n in nodes[:most])
    return shown + (f" and {len(nodes) - most} more" if len(nodes) > most else "")


def judge(fs: FileSystem, fill_pct: float) -> None:
    """Set the file system's verdict and status from its nodes' views."""
    total = len(fs.nodes)
    bad = [n for n in fs.nodes if n.state != "ok"]
    slow = [n for n in fs.nodes if n.state == "ok" and n.slow]
    parts: list[str] = []
    if bad and len(bad) == total:
        states = sorted({n.state for n in bad})
        fs.status = "down"
        parts.append(f"{'/'.join(states)} on all {total} node(s): the server or the storage network")
    elif bad:
        states = sorted({n.state for n in bad})
        fs.status = "degraded"
        parts.append(
            f"{'/'.join(states)} on {len(bad)} of {total} nodes ({_names(bad)}), fine on the others: "
            "those nodes or their path to the server"
        )
    if slow:
        answering = total - len(bad)
        if len(slow) * 2 > answering >= 2:
            parts.append(f"slow everywhere ({len(slow)} of {answering} nodes): the server or its network")
        else:
            parts.append(f"slow on {len(slow)} of {answering} nodes ({_names(slow)}): those nodes or their path")
        if fs.status == "ok":
            fs.status = "slow"
    if not parts:
        parts.append(f"ok on all {total} node(s)")
    fill = fs.used_pct
    if fill is not None and fill >= fill_pct:
        parts.append(f"{fill:.0f} % full")
    fs.verdict = "; ".join(parts)


def fleet_view(
    nodes: Mapping[int, str],
    samples: Mapping[int, list[tuple[float, Entities]]],
    mounts: Mapping[int, list[MountInfo]],
    baselines: Mapping[tuple[int, str], float] | None = None,
    *,
    factor: float = 5.0,
    fill_pct: float = 90.0,
) -> list[FileSystem]:
    """Every shared file system any node reports, with each node's view and a verdict; pure.

    `samples` are each node's recent `fs:` entities, latest first (HealthTracker.recent); `baselines`
    each (node, entity)'s usual seconds per operation (StorageWatch.baselines)."""
    baselines = baselines or {}
    systems: dict[tuple[str, str], FileSystem] = {}
    for node_id, name in nodes.items():
        recent = samples.get(node_id, [])
        if not recent:
            continue
        latest = recent[0][1]
        previous = recent[1][1] if len(recent) > 1 else {}
        elapsed = recent[0][0] - recent[1][0] if len(recent) > 1 else 0.0
        for info in mounts.get(node_id, []):
            entity = f"fs:{info.mountpoint}"
            values = latest.get(entity)
            if values is None:
                continue
            key = (info.fstype, info.source or f"{name}:{info.mountpoint}")
            fs = systems.setdefault(key, FileSystem(info.source or info.mountpoint, info.fstype, []))
            if info.mountpoint not in fs.mountpoints:
                fs.mountpoints.append(info.mountpoint)
            latency, ops = interval_latency(values, previous.get(entity))
            ops_rate = ops / elapsed if ops is not None and elapsed > 0 else None
            transmissions, requests = values.get("nfs_transmissions"), values.get("fs_ops")
            baseline = baselines.get((node_id, entity))
            probe = values.get("fs_probe_seconds")
            fs.nodes.append(
                NodeMount(
                    node=name,
                    node_id=node_id,
                    mountpoint=info.mountpoint,
                    state=FS_STATES.get(int(values.get("fs_state", 3)), "error"),
                    latency_ms=None if latency is None else round(latency * 1000, 3),
                    ops_per_s=None if ops_rate is None else round(ops_rate, 2),
                    probe_ms=None if probe is None else round(probe * 1000, 3),
                    used_pct=_round(used_pct(values)),
                    inodes_used_pct=_round(inodes_used_pct(values)),
                    retransmissions=(
                        transmissions - requests if transmissions is not None and requests is not None else None
                    ),
                    required=info.required,
                    baseline_ms=None if baseline is None else round(baseline * 1000, 3),
                    slow=baseline is not None and latency is not None and _slower(latency, baseline, factor),
                )
            )
    out = sorted(systems.values(), key=lambda f: (f.source, f.fstype))
    for fs in out:
        _slow_against_peers(fs, factor)
        fs.nodes.sort(key=lambda n: n.node)
        judge(fs, fill_pct)
    return out


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def _slower(latency: float, baseline: float, factor: float) -> bool:
    return latency > factor * baseline and latency - baseline > FLOOR_S


def _slow_against_peers(fs: FileSystem, factor: float) -> None:
    """With three nodes or more, a node is slow too when `factor` times slower than the others' median."""
    answering = [n for n in fs.nodes if n.state == "ok" and n.latency_ms is not None]
    if len(answering) < 3:
        return
    for i, node in enumerate(fs.nodes):
        if node.slow or node.state != "ok" or node.latency_ms is None:
            continue
        others = [n.latency_ms for n in answering if n is not node and n.latency_ms is not None]
        median = statistics.median(others)
        if _slower(node.latency_ms / 1000, median / 1000, factor):
            fs.nodes[i] = NodeMount(**{**node.__dict__, "slow": True})


@dataclass
class _Baseline:
    mean: float
    count: int = 1
    slow_in_a_row: int = 0


@dataclass
class StorageWatch:
    """Each (node, mount)'s latency baseline and the storage alerts firing. Not thread-safe: the health
    pass's thread feeds it; the API reads `baselines` (a dict copy is atomic enough for a view)."""

    fill_pct: float = 90.0
    factor: float = 5.0
    baselines_: dict[tuple[int, str], _Baseline] = field(default_factory=dict)
    previous: dict[tuple[int, str], Values] = field(default_factory=dict)
    firing: set[tuple[str, int, str]] = field(default_factory=set)

    @property
    def baselines(self) -> dict[tuple[int, str], float]:
        """Warm baselines only: seconds per operation by (node id, entity)."""
        return {k: b.mean for k, b in list(self.baselines_.items()) if b.count >= WARMUP}

    def observe(
        self, node_id: int, samples: list[tuple[float, Entities]], mounts: Sequence[MountInfo] = ()
    ) -> list[Transition]:
        """Feed a node's new samples (oldest first); returns the storage alerts to fire and resolve."""
        infos = {f"fs:{m.mountpoint}": m for m in mounts}
        out: list[Transition] = []
        for _ts, entities in samples:
            for entity, values in entities.items():
                if entity.startswith("fs:"):
                    out += self._one(node_id, entity, values, infos.get(entity))
        return out

    def forget(self, node_id: int) -> None:
        """A node was removed: drop its mounts' state."""
        self.baselines_ = {k: v for k, v in self.baselines_.items() if k[0] != node_id}
        self.previous = {k: v for k, v in self.previous.items() if k[0] != node_id}
        self.firing = {k for k in self.firing if k[1] != node_id}

    def _one(self, node_id: int, entity: str, values: Values, info: MountInfo | None) -> list[Transition]:
        key = (node_id, entity)
        where = entity[3:]
        if info is not None and info.source:
            where = f"{where} ({info.fstype} from {info.source})"
        out: list[Transition] = []
        state = int(values.get("fs_state", 0))
        out += self._toggle(
            HUNG_RULE, node_id, entity, state != 0, f"{where} is {FS_STATES.get(state, 'failing')} on this node"
        )
        fills = [p for p in (used_pct(values), inodes_used_pct(values)) if p is not None]
        full_key = (FULL_RULE.name, node_id, entity)
        limit = self.fill_pct - (FILL_HYSTERESIS_PCT if full_key in self.firing else 0.0)
        fill = max(fills) if fills else None
        out += self._toggle(
            FULL_RULE, node_id, entity, fill is not None and fill >= limit, f"{where} is {fill or 0:.0f} % full"
        )
        if state == 0:
            out += self._latency(node_id, entity, values, where)
        previous = self.previous.get(key)
        if previous is None or state == 0:
            self.previous[key] = values  # a hung mount's counters stand still: compare with the last good
        return out

    def _latency(self, node_id: int, entity: str, values: Values, where: str) -> list[Transition]:
        key = (node_id, entity)
        latency, _ops = interval_latency(values, self.previous.get(key))
        if latency is None:
            return []
        base = self.baselines_.get(key)
        if base is None:
            self.baselines_[key] = _Baseline(latency)
            return []
        slow = base.count >= WARMUP and _slower(latency, base.mean, self.factor)
        if slow:
            base.slow_in_a_row += 1
        else:
            base.slow_in_a_row = 0
            base.count += 1
            base.mean += max(ALPHA, 1.0 / base.count) * (latency - base.mean)  # slow values never become normal
        summary = f"{where}: {latency * 1000:.1f} ms per operation, usually {base.mean * 1000:.1f} ms on this node"
        return self._toggle(SLOW_RULE, node_id, entity, base.slow_in_a_row >= CONSECUTIVE, summary)

    def _toggle(self, rule: ThresholdRule, node_id: int, entity: str, on: bool, summary: str) -> list[Transition]:
        key = (rule.name, node_id, entity)
        if on and key not in self.firing:
            self.firing.add(key)
            return [Transition(rule, node_id, entity, True, summary)]
        if not on and key in self.firing:
            self.firing.discard(key)
            return [Transition(rule, node_id, entity, False)]
        return []


def fleet_from(tracker: HealthTracker, names: Mapping[int, str], watch: StorageWatch | None = None) -> list[FileSystem]:
    """`fleet_view` over what this replica's tracker holds of the nodes `names` lists (id -> name)."""
    samples = {node_id: tracker.recent(node_id, "fs") for node_id in names}
    mounts = {node_id: tracker.mounts(node_id) for node_id in names}
    watch = watch or StorageWatch()
    return fleet_view(names, samples, mounts, watch.baselines, factor=watch.factor, fill_pct=watch.fill_pct)


def fleet_of_replica(session: Session, tracker: HealthTracker, watch: StorageWatch | None = None) -> list[FileSystem]:
    """The fleet view of the nodes this replica's tracker holds (their names read in `session`)."""
    held = tracker.tracked()
    names: dict[int, str] = {}
    if held:
        query = select(Node.id, Node.name).where(Node.id.in_(held))
        names = {row.id: row.name for row in session.execute(query)}
    return fleet_from(tracker, names, watch)
