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

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpufleet.core.clock import Clock
from gpufleet.inventory.models import Gpu, Node
from gpufleet.jobs import accounting, lifecycle
from gpufleet.jobs.models import Job, JobRank, JobState
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

    held = lifecycle.held_ranks(session)
    nodes = _node_views(session, held)
    running = _running(session, held, now)
    pending = list(session.scalars(select(Job).where(Job.state == JobState.PENDING)))
    if not pending:
        return TickResult(placed=[], ended=ended, waiting=0)
    queue = [
        JobRequest(
            id=str(j.id),
            project=j.project or "",
            nodes=j.nodes,
            gpus_per_node=j.gpus_per_node,
            cpus_per_node=j.cpus_per_node,
            mem_per_node_mib=j.mem_per_node_mib,
            time_limit_s=j.time_limit_s,
            priority=j.priority,
            submitted_at=j.submitted_at.timestamp(),
            category=j.category,
        )
        for j in pending
    ]
    limits = accounting.project_limits(session, now, settings.half_life_s)
    decisions = schedule(nodes, running, queue, limits, now, settings.policy)

    by_id = {str(j.id): j for j in pending}
    placed = []
    for placement in decisions.placements:
        job = by_id[placement.job_id]
        lifecycle.place(session, clock, job, placement.allocation)
        placed.append(job.id)
    for job_id, why in decisions.pending.items():
        job = by_id[job_id]
        if job.reason != REASONS[why]:  # unchanged rows are not written
            job.reason = REASONS[why]
    session.flush()
    return TickResult(placed=placed, ended=ended, waiting=len(decisions.pending))


def _node_views(session: Session, held: list[JobRank]) -> list[NodeView]:
    busy_gpus: dict[int, set[int]] = defaultdict(set)
    for rank in held:
        if rank.node_id is not None:
            busy_gpus[rank.node_id].update(rank.gpu_indexes)
    cpus_used: dict[int, int] = defaultdict(int)
    mem_used: dict[int, int] = defaultdict(int)
    for rank in held:
        if rank.node_id is not None:
            cpus_used[rank.node_id] += rank.job.cpus_per_node
            mem_used[rank.node_id] += rank.job.mem_per_node_mib
    present: dict[int, set[int]] = defaultdict(set)
    for node_id, index in session.execute(select(Gpu.node_id, Gpu.index)):
        present[node_id].add(index)
    views = []
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
        gpus = present.get(node_id, set())
        topology = next((str(labels[k]) for k in TOPOLOGY_LABELS if labels and k in labels), None)
        views.append(
            NodeView(
                name=name,
                gpu_count=max(expected, len(gpus)),
                gpus=frozenset(gpus - busy_gpus.get(node_id, set())),
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
    return views


def _running(session: Session, held: list[JobRank], now: float) -> list[RunningJob]:
    """Every (job, run) with ranks still holding GPUs, with the time its limit frees them at the latest."""
    groups: dict[tuple[int, int], list[JobRank]] = defaultdict(list)
    for rank in held:
        groups[(rank.job_id, rank.run)].append(rank)
    out = []
    for (job_id, run), ranks in groups.items():
        job = ranks[0].job
        current = job.state is JobState.RUNNING and job.run == run
        ends = lifecycle.ends_by(job, now) if current else now  # not current: its processes are being killed
        out.append(
            RunningJob(
                id=f"{job_id}.{run}",
                project=job.project or "",
                allocation={r.node: frozenset(r.gpu_indexes) for r in ranks},
                ends_by=ends,
                cpus_per_node=job.cpus_per_node,
                mem_per_node_mib=job.mem_per_node_mib,
            )
        )
    return out
