"""One pass of the built-in scheduler against the database: read, decide (the pure `schedule`), apply.

The leader runs it every `scheduler_interval_s`, and at once after a submit or a job's end. In order:

1. end what must end: running jobs whose node is down or gone (requeue or node_fail), jobs past their
   time limit that no agent reported (timeout), ranks whose node was removed;
2. read the cluster: each node's GPUs free of every rank that still holds them, its CPUs and memory
   net of those ranks, whether it is schedulable (up, not drained, not failed), its category and its
   topology label (`labels["switch"]`, else `labels["rack"]`);
3. `schedule` over the pending jobs, with each project's quota, budget left and decayed use;
4. apply: placements become runs with ranks (sent to the agents by the dispatcher), waiting jobs get
   their pending reason.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from gpufleet.core.clock import Clock
from gpufleet.inventory.models import Gpu, Node
from gpufleet.jobs import accounting, lifecycle
from gpufleet.jobs.models import Job, JobState
from gpufleet.jobs.scheduler import (
    JobRequest,
    NodeView,
    PendingReason,
    Policy,
    RunningJob,
    node_schedulable,
    schedule,
)

REASONS = {
    PendingReason.QUOTA: "quota: the project holds its maximum of GPUs at once",
    PendingReason.BUDGET: "budget: the project's GPU-hours left do not cover this job's GPUs x time limit",
    PendingReason.RESOURCES: "resources: not enough free GPUs on schedulable nodes",
    PendingReason.PRIORITY: "priority: held for a higher-priority job's reservation",
    PendingReason.UNSCHEDULABLE: "unschedulable: no set of schedulable nodes can hold it now",
}
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


def run_tick(session: Session, clock: Clock, settings: TickSettings) -> TickResult:
    now = clock.now()
    lifecycle.forget_orphans(session, clock)
    ended = [j.id for j in lifecycle.node_failures(session, clock, settings.max_requeues)]
    ended += [j.id for j in lifecycle.overdue(session, clock)]
    session.flush()

    # Plain rows, not objects: a pass reads thousands of queued jobs and held ranks every second, and
    # only the jobs it places are loaded as objects.
    queue = [
        JobRequest(
            id=str(job_id),
            project=project or "",
            nodes=nodes,
            gpus_per_node=gpus,
            cpus_per_node=cpus,
            mem_per_node_mib=mem,
            time_limit_s=limit,
            priority=priority,
            submitted_at=submitted.timestamp(),
            category=category,
        )
        for job_id, project, nodes, gpus, cpus, mem, limit, priority, submitted, category in session.execute(
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
            ).where(Job.state == JobState.PENDING)
        )
    ]
    if not queue:
        return TickResult(placed=[], ended=ended, waiting=0)
    held = lifecycle.held_ranks(session)
    nodes, gpus = _nodes(session, held)
    limits = accounting.project_limits(session, now, settings.half_life_s)
    decisions = schedule(nodes, _running(held, now), queue, limits, now, settings.policy)

    placed = []
    ids = [int(p.job_id) for p in decisions.placements]
    jobs = {}
    for start in range(0, len(ids), UPDATE_BATCH):
        jobs.update(
            {j.id: j for j in session.scalars(select(Job).where(Job.id.in_(ids[start : start + UPDATE_BATCH])))}
        )
    for placement in decisions.placements:
        job = jobs[int(placement.job_id)]
        lifecycle.place(session, clock, job, placement.allocation, gpus)
        placed.append(job.id)
    by_reason: dict[PendingReason, list[int]] = defaultdict(list)
    for job_id, why in decisions.pending.items():
        by_reason[why].append(int(job_id))
    for why, ids in by_reason.items():
        for start in range(0, len(ids), UPDATE_BATCH):  # unchanged rows are not written
            batch = ids[start : start + UPDATE_BATCH]
            session.execute(
                update(Job).where(Job.id.in_(batch), Job.reason != REASONS[why]).values(reason=REASONS[why])
            )
    session.flush()
    return TickResult(placed=placed, ended=ended, waiting=len(decisions.pending))


def _nodes(session: Session, held: list[lifecycle.HeldRank]) -> tuple[list[NodeView], dict[str, lifecycle.NodeGpus]]:
    """Every node as the scheduler sees it (GPUs free of every held rank, CPUs and memory net of them),
    and every node's GPU UUIDs for the placements."""
    busy_gpus: dict[int, set[int]] = defaultdict(set)
    cpus_used: dict[int, int] = defaultdict(int)
    mem_used: dict[int, int] = defaultdict(int)
    for rank in held:
        if rank.node_id is not None:
            busy_gpus[rank.node_id].update(rank.gpu_indexes)
            cpus_used[rank.node_id] += rank.cpus_per_node
            mem_used[rank.node_id] += rank.mem_per_node_mib
    uuids: dict[int, dict[int, str]] = defaultdict(dict)
    for node_id, index, uuid in session.execute(select(Gpu.node_id, Gpu.index, Gpu.uuid)):
        uuids[node_id][index] = uuid
    views = []
    gpus = {}
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
        )
    )
    for node_id, name, state, health, drained_at, category, labels, cpus, mem, expected in rows:
        present = uuids.get(node_id, {})
        gpus[name] = lifecycle.NodeGpus(node_id, present)
        topology = next((str(labels[k]) for k in TOPOLOGY_LABELS if labels and k in labels), None)
        views.append(
            NodeView(
                name=name,
                gpu_count=max(expected, len(present)),
                gpus=frozenset(set(present) - busy_gpus.get(node_id, set())),
                cpus=cpus or 0,
                mem_mib=mem or 0,
                # Unknown CPU or memory (no inventory yet) does not block GPU jobs: counted as plenty.
                cpus_free=(cpus - cpus_used[node_id]) if cpus else 1 << 20,
                mem_free_mib=(mem - mem_used[node_id]) if mem else 1 << 40,
                schedulable=node_schedulable(state.value, health, drained_at is not None),
                category=category,
                topology=topology,
            )
        )
    return views, gpus


def _running(held: list[lifecycle.HeldRank], now: float) -> list[RunningJob]:
    """Every (job, run) with ranks still holding GPUs, with the time its limit frees them at the latest."""
    groups: dict[tuple[int, int], list[lifecycle.HeldRank]] = defaultdict(list)
    for rank in held:
        groups[(rank.job_id, rank.run)].append(rank)
    return [
        RunningJob(
            id=f"{job_id}.{run}",
            project=ranks[0].project or "",
            allocation={r.node: frozenset(r.gpu_indexes) for r in ranks},
            # Not current: its processes are being stopped, so its GPUs are as good as free soon.
            ends_by=ranks[0].ends_by if ranks[0].ends_by is not None else now,
            cpus_per_node=ranks[0].cpus_per_node,
            mem_per_node_mib=ranks[0].mem_per_node_mib,
        )
        for (job_id, run), ranks in groups.items()
    ]
