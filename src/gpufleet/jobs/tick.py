"""One pass of the built-in scheduler against the database: read, decide (the pure `schedule`), apply.

The leader runs it every `scheduler_interval_s`, and at once after a submit or a job's end, in two
transactions:

1. `plan`, read-only (no lock: on SQLite, heartbeat flushes and submits go on meanwhile):
   - find what must end: running runs whose node is down or gone (requeue or node_fail), runs past
     their time limit that no agent reported (timeout), ranks whose node was removed;
   - hold back the pending tasks of throttled job arrays (`%N`) past what each may still start: at most
     N minus its tasks running, lowest task id first, go into the queue;
   - read the cluster: each node's GPUs free of every rank that still holds them, its CPUs and memory
     net of those ranks, whether it is schedulable (up, not drained, not failed), its category and its
     topology label (`labels["switch"]`, else `labels["rack"]`);
   - `schedule` the pending jobs, with each project's quota, budget left and decayed use;
2. `apply`, a short write, only when there is something to write: end what must end, then place
   (each placement re-checked: the job still pending, its nodes still schedulable), then write the
   pending reasons that changed.

Why placing from a snapshot is safe: between the two transactions GPUs can only be freed (agents report
ranks gone), never taken, since only this pass creates ranks on schedulable nodes and only the leader
runs it (burn-in places its step jobs too, but only on nodes it drained at least a pass before: the
re-check sees them unschedulable); a job cancelled, a node drained or lost, or (should two leaders ever
overlap) a GPU taken in between is caught by the re-check, made with the jobs' rows locked.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.core.clock import Clock
from gpufleet.core.db import transaction
from gpufleet.inventory import categories, mig_layouts
from gpufleet.inventory.mig_layouts import instance_fraction
from gpufleet.inventory.models import Gpu, Node
from gpufleet.jobs import accounting, arrays, artifacts, environments, lifecycle
from gpufleet.jobs.models import Job, JobRank, JobState, RankState
from gpufleet.jobs.scheduler import (
    JobRequest,
    NodeView,
    PendingReason,
    Placement,
    Policy,
    RunningJob,
    blocked_by_driver,
    node_schedulable,
    schedule,
)
from gpufleet.protocol.cuda import parse_driver
from gpufleet.protocol.sharing import MAX_REPLICAS, SHARED_PROFILE, SharingMode, parse_sharing, replica_key, share_of

REASONS = {
    PendingReason.QUOTA: "quota: the project holds its maximum of GPUs at once",
    PendingReason.BUDGET: "budget: the project's GPU-hours left do not cover this job's GPUs x time limit",
    PendingReason.RESOURCES: "resources: not enough free GPUs on schedulable nodes",
    PendingReason.PRIORITY: "priority: held for a higher-priority job's reservation",
    PendingReason.UNSCHEDULABLE: "unschedulable: no set of schedulable nodes can hold it now",
}
DRIVER_REASON = (
    "unschedulable: no schedulable node that could hold it has NVIDIA driver {driver} or newer, which its"
    " environment needs (gpufleet env check)"
)
TOPOLOGY_LABELS = ("switch", "rack")
UPDATE_BATCH = 900  # ids per UPDATE ... IN (...): under every SQLite build's bound-parameter limit


@dataclass(frozen=True)
class TickSettings:
    policy: Policy
    half_life_s: float
    max_requeues: int


@dataclass
class TickResult:
    placed: list[int]
    ended: list[int]
    waiting: int


@dataclass
class Plan:
    """What a pass decided from its snapshot, for `apply` to write."""

    failed: dict[tuple[int, int], str]
    overdue: list[tuple[int, int]]
    orphans: list[int]
    placements: list[Placement]
    reasons: dict[str, list[int]]  # pending reason -> jobs whose stored reason differs
    gpus: dict[str, lifecycle.NodeGpus]
    waiting: int

    @property
    def empty(self) -> bool:
        return not (self.failed or self.overdue or self.orphans or self.placements or self.reasons)


def run_tick(sessions: sessionmaker[Session], clock: Clock, settings: TickSettings) -> TickResult:
    result = _one_pass(sessions, clock, settings)
    if result.ended:  # runs ended, some maybe requeued: their GPUs and jobs are placed now, not a pass later
        again = _one_pass(sessions, clock, settings)
        result = TickResult(result.placed + again.placed, result.ended + again.ended, again.waiting)
    return result


def _one_pass(sessions: sessionmaker[Session], clock: Clock, settings: TickSettings) -> TickResult:
    with transaction(sessions, readonly=True) as session:
        found = plan(session, clock, settings)
    if found.empty:
        return TickResult(placed=[], ended=[], waiting=found.waiting)
    with transaction(sessions) as session:
        return apply(session, clock, found, settings)


def plan(session: Session, clock: Clock, settings: TickSettings) -> Plan:
    now = clock.now()
    failed = lifecycle.find_node_failures(session)
    overdue = lifecycle.find_overdue(session, now)
    orphans = lifecycle.find_orphans(session)
    # Plain rows, not objects: a pass reads thousands of queued jobs and held ranks every second, and
    # only the jobs it places are loaded as objects (in `apply`).
    rows: Sequence[Any] = session.execute(
        select(
            Job.id,
            Job.project,
            Job.nodes,
            Job.gpus_per_node,
            Job.cpus_per_node,
            Job.mem_per_node_mib,
            Job.time_limit_s,
            Job.priority,
            Job.submitted_at,
            Job.category,
            Job.artifacts,
            Job.min_driver,
            Job.reason,
            Job.array_job_id,
            Job.array_task_id,
            Job.array_throttle,
            Job.gpu_profile,
        ).where(Job.state == JobState.PENDING)
    ).all()
    if not rows:
        return Plan(failed, overdue, orphans, [], {}, {}, 0)
    reasons: dict[str, list[int]] = defaultdict(list)
    rows, throttled = _throttle(session, rows)
    for task, text in throttled.changed.items():
        reasons[text].append(task)
    queue = [
        JobRequest(
            id=str(row.id),
            project=row.project or "",
            nodes=row.nodes,
            gpus_per_node=row.gpus_per_node,
            cpus_per_node=row.cpus_per_node,
            mem_per_node_mib=row.mem_per_node_mib,
            time_limit_s=row.time_limit_s,
            priority=row.priority,
            submitted_at=row.submitted_at.timestamp(),
            category=row.category,
            min_driver=parse_driver(row.min_driver) if row.min_driver else None,
            data=frozenset(str(a["sha256"]) for a in row.artifacts or ()),
            profile=row.gpu_profile,
            fraction=instance_fraction(row.gpu_profile) if row.gpu_profile else 1.0,
        )
        for row in rows
    ]
    stored = {str(row.id): row.reason for row in rows}
    drivers = {str(row.id): row.min_driver for row in rows if row.min_driver}
    by_id = {job.id: job for job in queue}
    held = lifecycle.held_ranks(session)
    views, gpu_ids, replica_share = _nodes(session, held, frozenset().union(*(job.data for job in queue)))
    # A queued replica counts as the largest share a sharing node gives one (its quota check errs safe).
    queue = [replace(j, fraction=replica_share) if j.profile == SHARED_PROFILE else j for j in queue]
    limits = accounting.project_limits(session, now, settings.half_life_s)
    decisions = schedule(views, _running(held, now), queue, limits, now, settings.policy)
    unschedulable = [by_id[i] for i, why in decisions.pending.items() if why is PendingReason.UNSCHEDULABLE]
    for_driver = blocked_by_driver(views, (job for job in unschedulable if job.id in drivers))
    for job_id, why in decisions.pending.items():
        text = REASONS[why]
        if job_id in for_driver:
            text = DRIVER_REASON.format(driver=drivers[job_id])
        if stored[job_id] != text:  # unchanged reasons are not written
            reasons[text].append(int(job_id))
    waiting = len(decisions.pending) + throttled.waiting
    return Plan(failed, overdue, orphans, decisions.placements, dict(reasons), gpu_ids, waiting)


@dataclass
class Throttled:
    """Pending array tasks held back by their array's throttle: the reason to write for those whose
    stored reason differs, and how many wait."""

    changed: dict[int, str]
    waiting: int


def _throttle(session: Session, rows: Sequence[Any]) -> tuple[list[Any], Throttled]:
    """The pending rows the scheduler may consider: all but the tasks of throttled arrays past what
    each array may start now (its throttle minus its tasks running), lowest task id first."""
    by_array: dict[int, list[Any]] = defaultdict(list)
    kept = []
    for row in rows:
        if row.array_throttle is None:
            kept.append(row)
        else:
            by_array[row.array_job_id].append(row)
    if not by_array:
        return kept, Throttled({}, 0)
    running = _running_tasks(session, by_array)
    changed: dict[int, str] = {}
    waiting = 0
    for array, tasks in by_array.items():
        tasks.sort(key=lambda r: r.array_task_id)
        limit = tasks[0].array_throttle
        room = max(limit - running.get(array, 0), 0)
        kept += tasks[:room]
        text = arrays.THROTTLE_REASON.format(n=limit)
        waiting += len(tasks[room:])
        changed.update({row.id: text for row in tasks[room:] if row.reason != text})
    return kept, Throttled(changed, waiting)


def _running_tasks(session: Session, array_job_ids: Iterable[int]) -> dict[int, int]:
    """How many tasks of each of these arrays run (placed: their ranks assigned or running)."""
    ids = sorted(array_job_ids)
    found: dict[int, int] = {}
    for start in range(0, len(ids), UPDATE_BATCH):
        query = (
            select(Job.array_job_id, func.count())
            .where(Job.array_job_id.in_(ids[start : start + UPDATE_BATCH]), Job.state == JobState.RUNNING)
            .group_by(Job.array_job_id)
        )
        for array, count in session.execute(query):
            if array is not None:
                found[array] = count
    return found


def apply(session: Session, clock: Clock, found: Plan, settings: TickSettings) -> TickResult:
    lifecycle.end_orphans(session, clock, found.orphans)
    ended = lifecycle.end_node_failures(session, clock, found.failed, settings.max_requeues)
    ended += lifecycle.end_overdue(session, clock, found.overdue)
    session.flush()
    placed = []
    if found.placements:
        names = {n for p in found.placements for n in (*p.allocation, *p.instances)}
        usable = _schedulable(session, names)
        held = _Held.read(session, names)
        changing = _changing(session, names)
        ids = [int(p.job_id) for p in found.placements]
        jobs: dict[int, Job] = {}
        for start in range(0, len(ids), UPDATE_BATCH):
            jobs.update(lifecycle.lock_jobs(session, ids[start : start + UPDATE_BATCH]))
        for placement in found.placements:
            job = jobs.get(int(placement.job_id))
            # Cancelled, a node drained or lost, a GPU taken (by a leader that overlapped this one) or bound
            # for another MIG layout since the snapshot: it waits for the next pass.
            if (
                job is None
                or job.state is not JobState.PENDING
                or not usable.issuperset({*placement.allocation, *placement.instances})
                or not held.allows(placement, found.gpus, changing)
            ):
                continue
            lifecycle.place(session, clock, job, placement.allocation, found.gpus, placement.instances)
            held.take(placement, found.gpus)
            placed.append(job.id)
    for reason, waiting in found.reasons.items():
        for start in range(0, len(waiting), UPDATE_BATCH):
            batch = waiting[start : start + UPDATE_BATCH]
            session.execute(
                update(Job).where(Job.id.in_(batch), Job.state == JobState.PENDING).values(reason=reason),
                execution_options={"synchronize_session": False},
            )
    session.flush()
    return TickResult(placed=placed, ended=ended, waiting=found.waiting)


@dataclass
class _Held:
    """What ranks hold on some nodes, as `apply` re-checks a placement against it: GPUs held whole, GPUs
    held in any way (whole, or some of their MIG devices or replicas), and MIG devices and replicas."""

    whole: set[tuple[str, int]] = field(default_factory=set)
    any: set[tuple[str, int]] = field(default_factory=set)
    devices: set[tuple[str, str]] = field(default_factory=set)

    @classmethod
    def read(cls, session: Session, names: set[str]) -> _Held:
        held = cls()
        rows = session.execute(
            select(JobRank.node, JobRank.gpu_indexes, JobRank.gpu_uuids, Job.gpu_profile)
            .join(Job, Job.id == JobRank.job_id)
            .where(JobRank.node.in_(list(names)), JobRank.state != RankState.EXITED)
        )
        for node, indexes, uuids, profile in rows:
            held.any.update((node, i) for i in indexes)
            if profile is None:
                held.whole.update((node, i) for i in indexes)
            else:
                held.devices.update((node, u) for u in uuids or ())
        return held

    def allows(
        self, placement: Placement, nodes: dict[str, lifecycle.NodeGpus], changing: set[tuple[str, int]]
    ) -> bool:
        """A whole GPU nobody holds in any way, or devices nobody holds on GPUs nobody holds whole; and
        no GPU bound for another MIG layout."""
        whole = {(n, i) for n, indexes in placement.allocation.items() for i in indexes}
        devices = {(n, u) for n, uuids in placement.instances.items() for u in uuids}
        parents = {(n, nodes[n].mig_parent.get(u, -1)) for n, u in devices}
        return (
            self.any.isdisjoint(whole)
            and self.devices.isdisjoint(devices)
            and self.whole.isdisjoint(parents)
            and changing.isdisjoint(whole | parents)
        )

    def take(self, placement: Placement, nodes: dict[str, lifecycle.NodeGpus]) -> None:
        whole = {(n, i) for n, indexes in placement.allocation.items() for i in indexes}
        devices = {(n, u) for n, uuids in placement.instances.items() for u in uuids}
        self.whole |= whole
        self.any |= whole | {(n, nodes[n].mig_parent.get(u, -1)) for n, u in devices}
        self.devices |= devices


def _changing(session: Session, names: set[str]) -> set[tuple[str, int]]:
    """(node, GPU index) of these nodes' GPUs bound for another MIG layout, read in `apply`'s own
    transaction: a layout declared since the pass's snapshot holds new jobs off too."""
    query = select(Node.id, Node.name).where(Node.name.in_(list(names)))
    ids: dict[int, str] = {row.id: row.name for row in session.execute(query)}
    return {
        (ids[node_id], i) for node_id, indexes in mig_layouts.to_change(session, list(ids)).items() for i in indexes
    }


def _schedulable(session: Session, names: set[str]) -> set[str]:
    rows = session.execute(
        select(Node.name, Node.state, Node.health, Node.drained_at).where(Node.name.in_(list(names)))
    )
    return {name for name, state, health, drained in rows if node_schedulable(state.value, health, drained is not None)}


def _nodes(
    session: Session, held: list[lifecycle.HeldRank], wanted: frozenset[str]
) -> tuple[list[NodeView], dict[str, lifecycle.NodeGpus], float]:
    """Every node as the scheduler sees it, the nodes' GPUs for placements, and the largest share of a
    GPU one replica is on a sharing node; `wanted`: the checksums queued jobs need (only those of the
    node caches are read, as a pass runs every second and most queues need none)."""
    holds: dict[int, _NodeHolds] = defaultdict(_NodeHolds)
    cpus_used: dict[int, int] = defaultdict(int)
    mem_used: dict[int, int] = defaultdict(int)
    for rank in held:
        if rank.node_id is not None:
            holds[rank.node_id].add(rank)
            cpus_used[rank.node_id] += rank.cpus_per_node
            mem_used[rank.node_id] += rank.mem_per_node_mib
    drivers = environments.node_drivers(session)
    cached = artifacts.cached_by_node(session, wanted)
    changing = mig_layouts.to_change(session)  # GPUs bound for another MIG layout take no new job
    rows = session.execute(
        select(
            Node.id,
            Node.name,
            Node.state,
            Node.health,
            Node.drained_at,
            Node.category,
            Node.labels,
            Node.cpus,
            Node.memory_total_mib,
            Node.expected_gpus,
            Node.settings,
        )
    ).all()
    by_category = categories.category_settings(session)
    shapes: dict[int, _GpuShapes] = {
        row.id: _GpuShapes(sharing=_sharing(by_category.get(row.category or ""), row.settings)) for row in rows
    }
    for node_id, index, uuid, mode, mig in session.execute(
        select(Gpu.node_id, Gpu.index, Gpu.uuid, Gpu.mig_mode, Gpu.mig)
    ):
        if node_id in shapes:
            shapes[node_id].add(index, uuid, mode, mig or [], index in changing.get(node_id, ()), holds[node_id])
    views = []
    gpus = {}
    for node_id, name, state, health, drained_at, category, labels, cpus, mem, expected, _ in rows:
        shape = shapes[node_id]
        gpus[name] = lifecycle.NodeGpus(node_id, shape.uuids, shape.mig_parent)
        topology = next((str(labels[k]) for k in TOPOLOGY_LABELS if labels and k in labels), None)
        views.append(
            NodeView(
                name=name,
                # A GPU in MIG mode or shared is never a whole GPU to the scheduler: its instances or
                # replicas are its offer.
                gpu_count=max(expected, len(shape.uuids)) - len(shape.sliced),
                gpus=frozenset(shape.whole),
                cpus=cpus or 0,
                mem_mib=mem or 0,
                # Unknown CPU or memory (no inventory yet) does not block GPU jobs: counted as plenty.
                cpus_free=(cpus - cpus_used[node_id]) if cpus else 1 << 20,
                mem_free_mib=(mem - mem_used[node_id]) if mem else 1 << 40,
                schedulable=node_schedulable(state.value, health, drained_at is not None),
                category=category,
                topology=topology,
                driver=drivers.get(node_id),
                cached=cached.get(node_id, frozenset()),
                slices={p: tuple(sorted(u)) for p, u in shape.free_slices.items()},
                slice_capacity=dict(shape.capacity),
            )
        )
    replicas = [shape.sharing[1] for shape in shapes.values() if shape.sharing[0] != "exclusive"]
    return views, gpus, 1.0 / min(replicas, default=MAX_REPLICAS)


def _sharing(category: dict[str, Any] | None, node: dict[str, Any] | None) -> tuple[SharingMode, int]:
    """A node's gpu_sharing as (mode, replicas); a stored value that no longer reads is exclusive."""
    value = categories.resolve_values(category, node)["gpu_sharing"].value
    try:
        return parse_sharing(str(value))
    except ValueError:
        return "exclusive", 1


@dataclass
class _NodeHolds:
    """What one node's ranks hold: GPUs in any way (whole, or a MIG device or replica of them), and the MIG
    devices and replicas, by GPU."""

    gpus: set[int] = field(default_factory=set)
    whole: set[int] = field(default_factory=set)
    devices: set[str] = field(default_factory=set)
    replica_keys: dict[int, set[str]] = field(default_factory=lambda: defaultdict(set))

    def add(self, rank: lifecycle.HeldRank) -> None:
        self.gpus.update(rank.gpu_indexes)
        if rank.profile is None:
            self.whole.update(rank.gpu_indexes)
            return
        self.devices.update(rank.gpu_uuids)
        if rank.profile == SHARED_PROFILE:
            for index, key in zip(rank.gpu_indexes, rank.gpu_uuids, strict=False):
                self.replica_keys[index].add(key)


@dataclass
class _GpuShapes:
    """One node's GPUs as the scheduler offers them: whole GPUs free to take, free MIG devices, and free
    replicas of shared GPUs (protocol.sharing)."""

    sharing: tuple[SharingMode, int] = ("exclusive", 1)
    uuids: dict[int, str] = field(default_factory=dict)
    whole: set[int] = field(default_factory=set)  # not in MIG mode, not shared, not bound for another layout
    sliced: set[int] = field(default_factory=set)  # in MIG mode, or shared
    mig_parent: dict[str, int] = field(default_factory=dict)
    free_slices: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    capacity: Counter[str] = field(default_factory=Counter)

    def add(
        self, index: int, uuid: str, mode: str | None, mig: list[dict[str, Any]], changing: bool, holds: _NodeHolds
    ) -> None:
        """Offer GPU `index`: whole if nothing holds it, as replicas on a sharing node, or its MIG devices.
        A GPU held in another way than the node offers it now (its gpu_sharing changed under a running job)
        offers nothing until that job ends."""
        self.uuids[index] = uuid
        shared, replicas = self.sharing
        if mode != "enabled" and shared != "exclusive":
            self.sliced.add(index)
            keys = [replica_key(uuid, shared, k, replicas) for k in range(replicas)]
            held = holds.replica_keys.get(index, set())
            stale = index in holds.whole or not held.issubset(keys)  # held whole, or as other replicas
            for key in keys:
                self.mig_parent[key] = index
                self.capacity[SHARED_PROFILE] += 1
                if not changing and not stale and key not in held:
                    self.free_slices[SHARED_PROFILE].append(key)
            return
        if mode != "enabled":
            if not changing and index not in holds.gpus:
                self.whole.add(index)
            return
        self.sliced.add(index)
        # Held whole or as replicas (a mode changed under a running job, in a race): nothing to offer.
        busy = None if index in holds.whole or index in holds.replica_keys else holds.devices
        for device in mig:
            profile, mig_uuid = str(device.get("profile") or ""), str(device["uuid"])
            self.mig_parent[mig_uuid] = index
            if not profile:
                continue  # a device nobody can ask for by name
            self.capacity[profile] += 1
            if not changing and busy is not None and mig_uuid not in busy:
                self.free_slices[profile].append(mig_uuid)


def _fraction(rank: lifecycle.HeldRank) -> float:
    """What one GPU entry of a held rank counts as: a whole GPU 1, a MIG instance its slices / 7, a
    replica 1/N of its GPU."""
    if rank.profile is None:
        return 1.0
    if rank.profile == SHARED_PROFILE:
        return min((share_of(u) for u in rank.gpu_uuids), default=1.0)
    return instance_fraction(rank.profile)


def _running(held: list[lifecycle.HeldRank], now: float) -> list[RunningJob]:
    """Every (job, run) with ranks still holding GPUs, with the time its limit frees them at the latest."""
    groups: dict[tuple[int, int], list[lifecycle.HeldRank]] = defaultdict(list)
    for rank in held:
        groups[(rank.job_id, rank.run)].append(rank)
    return [
        RunningJob(
            id=f"{job_id}.{run}",
            project=ranks[0].project or "",
            allocation={} if ranks[0].profile else {r.node: frozenset(r.gpu_indexes) for r in ranks},
            instances={r.node: frozenset(r.gpu_uuids) for r in ranks} if ranks[0].profile else {},
            fraction=_fraction(ranks[0]),
            # Not current: its processes are being stopped, so its GPUs are as good as free soon.
            ends_by=ranks[0].ends_by if ranks[0].ends_by is not None else now,
            cpus_per_node=ranks[0].cpus_per_node,
            mem_per_node_mib=ranks[0].mem_per_node_mib,
        )
        for (job_id, run), ranks in groups.items()
    ]
