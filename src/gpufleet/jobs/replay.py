"""Trace replay: a discrete-event simulation of the built-in scheduler over a job trace.

Simulated time is a float that jumps from event to event (arrivals and completions); nothing sleeps.
At each event time, every completion and arrival at that time is applied first, then `schedule` runs
once with `now` = that time (twice or more only for FIFO's chunks, below), and its placements start
at once: a job ends `runtime` seconds after it starts. A job the scheduler calls `unschedulable`
(larger than any node, or a gang wider than the cluster) is counted and never queued.

Policies:

- `fifo`: strict first-in first-out, no backfill: every job has priority 0 and no project has usage,
  so the scheduler's order is submission time then id (arrival order), and `Policy(backfill=False)`
  lets nothing pass the first job that waits.
- `gpufleet`: the built-in scheduler as it ships: the trace's priorities, fair share (each project's
  GPU-seconds decayed with a half life of `half_life_s`, 7 days by default as in Slurm), backfill
  against the top waiting job's reservation, and "pack" placement.

Traces carry no time limits. A job's time limit is its real runtime x `time_limit_factor` (1.0 by
default: exact estimates, the best case for backfill; use 2 or more for users' usual overestimates).

Speed (openb: ~6,200 jobs on 1,213 nodes). A pass costs the scheduler O(nodes + running jobs + queue
it is given), so the replay keeps all three down without changing a decision that matters:

- `schedule` runs only when something can start: after an arrival, or a completion while jobs wait,
  and only if some node has as many free GPUs as the smallest waiting job asks for per node (FIFO:
  only if the first waiting job fits, as nothing may pass it). So for FIFO an arrival behind a
  waiting job runs nothing; and FIFO passes the queue in chunks of `fifo_chunk` jobs, continuing
  only while every job of a chunk started (without backfill, a job behind the first waiting one
  never starts, so this is the same as passing it all).
- `light_passes`: a pass first runs without the running jobs, which only date the top waiting job's
  reservation here (the node views already leave their GPUs out, and the replay sets no quotas); if
  it leaves no job waiting, no reservation was needed and its decisions are the full pass's.
- A job that does not fit the empty cluster (the scheduler's `unschedulable`, asked once per shape)
  never enters the queue.
- `prune`: the scheduler gets every node that holds a job, and of the idle nodes of each size only as
  many as the jobs passed could use (their node count summed). Idle nodes of one size are
  interchangeable, so a pass decides the same up to which of equally free nodes it picks; the
  scheduler breaks such ties by its own set order, which depends on the node list, so a pruned replay
  may pick a different one of two equally free nodes than an unpruned one (`prune=False`), and the two
  replays may then drift apart a little. `bench/replay.py --check-prune` measures by how much.

Figures (see `ReplayResult`): job completion time (JCT) = end - arrival, queueing delay = start -
arrival, both over completed jobs, mean and p99 (nearest rank); GPU allocation rate = allocated
GPU-seconds / (GPUs x makespan), makespan = last end - first arrival; and two measures of idle GPUs
while jobs wait, defined on `ReplayResult`.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Literal

from gpufleet.core.errors import InvalidInput
from gpufleet.jobs.scheduler import (
    Decisions,
    JobRequest,
    NodeView,
    PendingReason,
    Policy,
    ProjectLimits,
    RunningJob,
    decay,
    schedule,
)
from gpufleet.jobs.traces import TraceJob, TraceNode, read_format, read_trace, resolve_cluster

PolicyName = Literal["fifo", "gpufleet"]
POLICIES: tuple[PolicyName, ...] = ("fifo", "gpufleet")


@dataclass(frozen=True, slots=True)
class ReplayOptions:
    time_limit_factor: float = 1.0  # a job's time limit = runtime x this (>= 1: jobs end by their limit)
    half_life_s: float = 7 * 86_400.0  # fair share's usage decay (gpufleet policy)
    prune: bool = True  # give the scheduler only the nodes that can matter (see the module doc)
    fifo_chunk: int = 64  # FIFO passes the queue this many jobs at a time
    light_passes: bool = True  # try a pass without the running jobs first (see `_Replay._schedule`)


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """What happened to one job: when it started and ended (None if it never did) and on which GPUs."""

    id: str
    arrival: float
    gpus: int
    start: float | None
    end: float | None
    allocation: Mapping[str, tuple[int, ...]]
    unschedulable: bool = False


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """One policy's replay of one trace.

    - `idle_while_waiting`: the time-averaged fraction of *all* GPUs that sat free while at least one
      job waited in the queue: ∫ free GPUs × [a job waits] dt / (GPUs × makespan). Capacity lost to
      the policy's ordering (FIFO's head-of-line blocking) and to fragmentation together.
    - `fragmentation`: of those GPU-seconds (free while a job waited), the share on nodes with fewer
      free GPUs than the smallest per-node request among the waiting jobs, that is free GPUs no waiting
      job could use where they were: ∫ free GPUs on such nodes × [a job waits] dt / ∫ free GPUs ×
      [a job waits] dt; 0 when no job ever waited. The rest of `idle_while_waiting` could have held a
      waiting job but the policy kept it free (FIFO's blocking, or backfill's reservation).
    - `free_on_partial_nodes`: the time-averaged share of free GPUs that were on partly used nodes
      (∫ free GPUs on nodes neither empty nor full dt / ∫ free GPUs dt): how well placement packs.
    """

    policy: PolicyName
    nodes: int
    gpus: int
    jobs: int
    completed: int
    unschedulable: int
    never_started: int  # neither started nor unschedulable when the events ran out (a scheduler bug)
    mean_jct_s: float
    p99_jct_s: float
    mean_wait_s: float
    p99_wait_s: float
    allocation_rate: float
    idle_while_waiting: float
    fragmentation: float
    free_on_partial_nodes: float
    makespan_s: float
    passes: int
    schedule_s: float  # time spent inside `schedule`
    wall_s: float  # the whole replay
    outcomes: tuple[JobOutcome, ...] = field(default=(), repr=False, compare=False)

    def figures(self) -> list[tuple[str, str]]:
        """(label, value) pairs for people: the table of `gpufleet sim replay` and bench/replay.py."""
        return [
            ("jobs", str(self.jobs)),
            ("completed", str(self.completed)),
            ("unschedulable", str(self.unschedulable)),
            ("mean JCT", format_seconds(self.mean_jct_s)),
            ("p99 JCT", format_seconds(self.p99_jct_s)),
            ("mean queueing delay", format_seconds(self.mean_wait_s)),
            ("p99 queueing delay", format_seconds(self.p99_wait_s)),
            ("GPU allocation rate", f"{self.allocation_rate:.1%}"),
            ("GPUs idle while jobs wait", f"{self.idle_while_waiting:.2%}"),
            ("  of which fragmented", f"{self.fragmentation:.0%}"),
            ("free GPUs on partly used nodes", f"{self.free_on_partial_nodes:.0%}"),
            ("makespan", format_seconds(self.makespan_s)),
            ("scheduler passes", str(self.passes)),
            ("wall time", f"{self.wall_s:.1f}s"),
        ]

    def as_dict(self) -> dict[str, object]:
        """Every figure (not the per-job outcomes), with stable keys, for `-o json`."""
        return {
            "policy": self.policy,
            "nodes": self.nodes,
            "gpus": self.gpus,
            "jobs": self.jobs,
            "completed": self.completed,
            "unschedulable": self.unschedulable,
            "never_started": self.never_started,
            "mean_jct_s": round(self.mean_jct_s, 3),
            "p99_jct_s": round(self.p99_jct_s, 3),
            "mean_wait_s": round(self.mean_wait_s, 3),
            "p99_wait_s": round(self.p99_wait_s, 3),
            "allocation_rate": round(self.allocation_rate, 6),
            "idle_while_waiting": round(self.idle_while_waiting, 6),
            "fragmentation": round(self.fragmentation, 6),
            "free_on_partial_nodes": round(self.free_on_partial_nodes, 6),
            "makespan_s": round(self.makespan_s, 3),
            "passes": self.passes,
            "schedule_s": round(self.schedule_s, 3),
            "wall_s": round(self.wall_s, 3),
        }


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank percentile (`q` in 0..100) of values already sorted; 0.0 for none."""
    if not values:
        return 0.0
    rank = max(1, math.ceil(q / 100.0 * len(values)))
    return values[min(rank, len(values)) - 1]


class _Replay:
    """The simulation's state: free GPUs per node, the queue, running jobs, and the time integrals."""

    def __init__(self, nodes: Sequence[TraceNode], policy: PolicyName, options: ReplayOptions) -> None:
        self.fifo = policy == "fifo"
        self.options = options
        self.policy = Policy(backfill=not self.fifo)
        self.names = [n.name for n in nodes]
        self.index = {n.name: i for i, n in enumerate(nodes)}
        if len(self.index) != len(nodes):
            raise InvalidInput("two nodes share a name")
        self.cap = [n.gpus for n in nodes]
        self.free = [set(range(n.gpus)) for n in nodes]
        self.views: list[NodeView | None] = [None] * len(nodes)
        self.busy: set[int] = set()
        self.idle: dict[int, set[int]] = {}
        for i, g in enumerate(self.cap):
            self.idle.setdefault(g, set()).add(i)
        self.total = sum(self.cap)
        self.hist = [0] * (max(self.cap, default=0) + 1)  # nodes by free GPUs
        for g in self.cap:
            self.hist[g] += 1
        self.free_total = self.total
        self.free_partial = 0  # free GPUs on nodes neither empty nor full

        self.queue: dict[str, JobRequest] = {}
        self.shapes: Counter[int] = Counter()  # waiting jobs by GPUs per node
        self.shapes_ever: dict[tuple[int, int], bool] = {}  # (nodes, GPUs per node) -> fits the empty cluster
        self.blocked = False  # FIFO: a job waits, so an arrival alone cannot start anything
        self.running: dict[str, RunningJob] = {}
        self.ends: list[tuple[float, int, str]] = []
        self.seq = 0
        self.trace: dict[str, TraceJob] = {}
        self.start: dict[str, float] = {}
        self.end: dict[str, float] = {}
        self.alloc: dict[str, dict[str, tuple[int, ...]]] = {}
        self.unschedulable: set[str] = set()

        self.in_use: dict[str, float] = defaultdict(float)  # GPUs held, by project
        self.usage: dict[str, float] = {}
        self.t = 0.0
        self.alloc_int = 0.0
        self.free_int = 0.0
        self.partial_int = 0.0
        self.wait_free_int = 0.0
        self.wait_frag_int = 0.0
        self.passes = 0
        self.light = options.light_passes
        self.schedule_s = 0.0

    # --- node bookkeeping -------------------------------------------------------------------------

    def _set_free(self, i: int, new: set[int]) -> None:
        old_n, new_n, cap = len(self.free[i]), len(new), self.cap[i]
        self.hist[old_n] -= 1
        self.hist[new_n] += 1
        self.free_total += new_n - old_n
        self.free_partial += (new_n if 0 < new_n < cap else 0) - (old_n if 0 < old_n < cap else 0)
        self.free[i] = new
        self.views[i] = None
        if new_n == cap:
            self.busy.discard(i)
            self.idle[cap].add(i)
        else:
            self.idle[cap].discard(i)
            self.busy.add(i)

    def _view(self, i: int) -> NodeView:
        view = self.views[i]
        if view is None:
            view = self.views[i] = NodeView(name=self.names[i], gpu_count=self.cap[i], gpus=frozenset(self.free[i]))
        return view

    def _node_views(self, jobs: Sequence[JobRequest]) -> list[NodeView]:
        if not self.options.prune:
            return [self._view(i) for i in range(len(self.names))]
        wanted = sum(j.nodes for j in jobs)
        chosen = list(self.busy)
        for idle in self.idle.values():
            chosen.extend(idle if len(idle) <= wanted else heapq.nsmallest(wanted, idle))
        chosen.sort()
        return [self._view(i) for i in chosen]

    # --- time -----------------------------------------------------------------------------------------

    def advance(self, t: float) -> None:
        """Integrate the state held since the last event up to `t`, and decay fair-share usage."""
        dt = t - self.t
        if dt <= 0:
            return
        allocated = self.total - self.free_total
        self.alloc_int += allocated * dt
        self.free_int += self.free_total * dt
        self.partial_int += self.free_partial * dt
        if self.queue:
            smallest = min(self.shapes)
            stranded = sum(k * self.hist[k] for k in range(min(smallest, len(self.hist))))
            self.wait_free_int += self.free_total * dt
            self.wait_frag_int += stranded * dt
        if not self.fifo:
            hl = self.options.half_life_s
            for project in set(self.usage) | set(self.in_use):
                held = self.in_use.get(project, 0)
                # GPU-seconds gained at a constant rate over dt, each decaying from when it was used:
                # the exact integral of held x 0.5 ** ((t - s) / hl) over s; a half life <= 0 keeps none.
                gained = held * hl / math.log(2) * (1 - 0.5 ** (dt / hl)) if hl > 0 else 0.0
                self.usage[project] = decay(self.usage.get(project, 0.0), dt, hl) + gained
        self.t = t

    # --- events ---------------------------------------------------------------------------------------

    def fits_ever(self, job: TraceJob) -> bool:
        """Whether the job fits the cluster when it is empty: the scheduler's own verdict, once per shape."""
        shape = (job.nodes, job.gpus_per_node)
        known = self.shapes_ever.get(shape)
        if known is None:
            pairs = zip(self.names, self.cap, strict=True)
            empty = [NodeView(name=n, gpu_count=g, gpus=frozenset(range(g))) for n, g in pairs]
            probe = JobRequest(id=job.id, project=job.project, nodes=job.nodes, gpus_per_node=job.gpus_per_node)
            verdict = schedule(empty, [], [probe], {}, 0.0, self.policy).pending.get(job.id)
            known = self.shapes_ever[shape] = verdict != PendingReason.UNSCHEDULABLE
        return known

    def could_start(self) -> bool:
        """Whether a pass could start anything now (False only when it certainly could not).

        FIFO starts nothing while its first job waits, so that job must fit: `nodes` nodes with
        `gpus_per_node` free GPUs each. Otherwise some node must have as many free GPUs as the smallest
        per-node request in the queue.
        """
        if self.fifo and self.queue:
            head = next(iter(self.queue.values()))
            return sum(self.hist[head.gpus_per_node :]) >= head.nodes
        smallest = min(self.shapes, default=0)
        return any(self.hist[k] for k in range(max(smallest, 1), len(self.hist)))

    def arrive(self, job: TraceJob) -> None:
        self.trace[job.id] = job
        if not self.fits_ever(job):
            self.unschedulable.add(job.id)
            return
        limit = job.runtime * self.options.time_limit_factor
        self.queue[job.id] = JobRequest(
            id=job.id,
            project=job.project,
            nodes=job.nodes,
            gpus_per_node=job.gpus_per_node,
            time_limit_s=limit,
            priority=0 if self.fifo else job.priority,
            submitted_at=job.arrival,
        )
        self.shapes[job.gpus_per_node] += 1

    def complete_until(self, t: float) -> bool:
        """End every job due by `t`; whether any ended."""
        ended = False
        while self.ends and self.ends[0][0] <= t:
            _, _, job_id = heapq.heappop(self.ends)
            run = self.running.pop(job_id)
            for name, gpus in run.allocation.items():
                i = self.index[name]
                self._set_free(i, self.free[i] | gpus)
            self.in_use[run.project] -= run.gpus
            ended = True
        return ended

    def _leave_queue(self, job_id: str) -> JobRequest:
        req = self.queue.pop(job_id)
        self.shapes[req.gpus_per_node] -= 1
        if not self.shapes[req.gpus_per_node]:
            del self.shapes[req.gpus_per_node]
        return req

    def _schedule(self, jobs: list[JobRequest], now: float) -> Decisions:
        """One pass over `jobs`, first without the running jobs when the last pass left nobody waiting.

        The running jobs matter to a pass only through the GPUs they hold (the node views already leave
        those out), quotas and budgets (the replay sets none) and the releases that date the top waiting
        job's reservation. So a pass that leaves no job waiting decided exactly what the full pass
        would: it is kept, and the O(running jobs) work is saved. Otherwise the full pass runs.
        """
        views = self._node_views(jobs)
        projects = {} if self.fifo else {p: ProjectLimits(usage=u) for p, u in self.usage.items()}
        if self.light:
            decisions = self._timed(views, [], jobs, projects, now)
            if not any(r != PendingReason.UNSCHEDULABLE for r in decisions.pending.values()):
                return decisions
        decisions = self._timed(views, list(self.running.values()), jobs, projects, now)
        if self.options.light_passes:
            self.light = not any(r != PendingReason.UNSCHEDULABLE for r in decisions.pending.values())
        return decisions

    def _timed(
        self,
        views: list[NodeView],
        running: list[RunningJob],
        jobs: list[JobRequest],
        projects: Mapping[str, ProjectLimits],
        now: float,
    ) -> Decisions:
        t0 = time.perf_counter()
        decisions = schedule(views, running, jobs, projects, now, self.policy)
        self.schedule_s += time.perf_counter() - t0
        self.passes += 1
        return decisions

    def _apply(self, decisions: Decisions, now: float) -> bool:
        """Start the placed jobs, drop the unschedulable ones; whether any job still waits."""
        for placement in decisions.placements:
            req = self._leave_queue(placement.job_id)
            job = self.trace[req.id]
            held: dict[str, frozenset[int]] = {}
            for name, gpus in placement.allocation.items():
                i = self.index[name]
                taken = frozenset(gpus)
                if len(taken) != req.gpus_per_node or not taken <= self.free[i]:
                    raise RuntimeError(f"scheduler gave job {req.id} GPUs {sorted(gpus)} of {name}, not free there")
                self._set_free(i, self.free[i] - taken)
                held[name] = taken
            if len(held) != req.nodes:
                raise RuntimeError(f"scheduler gave job {req.id} {len(held)} node(s), it asked for {req.nodes}")
            self.running[req.id] = RunningJob(req.id, req.project, held, now + req.time_limit_s)
            self.in_use[req.project] += req.gpus
            self.start[req.id] = now
            self.end[req.id] = now + job.runtime
            self.alloc[req.id] = dict(placement.allocation)
            self.seq += 1
            heapq.heappush(self.ends, (now + job.runtime, self.seq, req.id))
        waiting = False
        for job_id, reason in decisions.pending.items():
            if reason == PendingReason.UNSCHEDULABLE:
                self._leave_queue(job_id)
                self.unschedulable.add(job_id)
            else:
                waiting = True
        return waiting

    def run_passes(self, now: float) -> None:
        if not self.fifo:
            self._apply(self._schedule(list(self.queue.values()), now), now)
            return
        while self.queue:
            chunk = list(islice(self.queue.values(), self.options.fifo_chunk))
            if self._apply(self._schedule(chunk, now), now):
                break


def replay(
    jobs: Iterable[TraceJob],
    nodes: Sequence[TraceNode],
    policy: PolicyName,
    options: ReplayOptions | None = None,
) -> ReplayResult:
    """Replay `jobs` on `nodes` under `policy` and measure what happened (see the module doc)."""
    options = options or ReplayOptions()
    if policy not in POLICIES:
        raise InvalidInput(f"unknown policy {policy!r}; one of {', '.join(POLICIES)}")
    if options.time_limit_factor < 1.0:
        raise InvalidInput("the time-limit factor must be at least 1 (a job must end by its time limit)")
    if options.fifo_chunk < 1:
        raise InvalidInput("the FIFO chunk must be at least 1 job")
    if not nodes:
        raise InvalidInput("no nodes to replay on")
    began = time.perf_counter()
    ordered = sorted(jobs, key=lambda j: (j.arrival, j.id))
    if len({j.id for j in ordered}) != len(ordered):
        raise InvalidInput("two jobs share an id")
    for j in ordered:
        if j.nodes < 1 or j.gpus_per_node < 1:
            raise InvalidInput(f"job {j.id} asks for {j.nodes} node(s) x {j.gpus_per_node} GPU(s); both must be >= 1")
        if not (math.isfinite(j.arrival) and math.isfinite(j.runtime)) or j.runtime < 0:
            raise InvalidInput(f"job {j.id}: arrival and runtime must be finite, runtime >= 0")
    sim = _Replay(nodes, policy, options)
    first = ordered[0].arrival if ordered else 0.0
    sim.t = first
    nxt = 0
    while nxt < len(ordered) or sim.ends:
        t = min(
            ordered[nxt].arrival if nxt < len(ordered) else math.inf,
            sim.ends[0][0] if sim.ends else math.inf,
        )
        sim.advance(t)
        ended = sim.complete_until(t)
        arrived = False
        blocked = sim.blocked
        while nxt < len(ordered) and ordered[nxt].arrival <= t:
            sim.arrive(ordered[nxt])
            nxt += 1
            arrived = True
        if sim.queue and (ended or (arrived and not (sim.fifo and blocked))) and sim.could_start():
            sim.run_passes(t)
        sim.blocked = bool(sim.queue)  # FIFO: the first queued job waits, so no later arrival can pass it
    return _result(sim, ordered, policy, first, time.perf_counter() - began)


def _result(sim: _Replay, jobs: Sequence[TraceJob], policy: PolicyName, first: float, wall_s: float) -> ReplayResult:
    outcomes = tuple(
        JobOutcome(
            id=j.id,
            arrival=j.arrival,
            gpus=j.gpus,
            start=sim.start.get(j.id),
            end=sim.end.get(j.id),
            allocation=sim.alloc.get(j.id, {}),
            unschedulable=j.id in sim.unschedulable,
        )
        for j in jobs
    )
    done = [o for o in outcomes if o.end is not None and o.start is not None]
    jct = sorted(o.end - o.arrival for o in done if o.end is not None)
    wait = sorted(o.start - o.arrival for o in done if o.start is not None)
    last = max((o.end for o in done if o.end is not None), default=first)
    makespan = last - first
    capacity = sim.total * makespan
    return ReplayResult(
        policy=policy,
        nodes=len(sim.names),
        gpus=sim.total,
        jobs=len(jobs),
        completed=len(done),
        unschedulable=len(sim.unschedulable),
        never_started=len(jobs) - len(done) - len(sim.unschedulable),
        mean_jct_s=sum(jct) / len(jct) if jct else 0.0,
        p99_jct_s=percentile(jct, 99),
        mean_wait_s=sum(wait) / len(wait) if wait else 0.0,
        p99_wait_s=percentile(wait, 99),
        allocation_rate=sim.alloc_int / capacity if capacity > 0 else 0.0,
        idle_while_waiting=sim.wait_free_int / capacity if capacity > 0 else 0.0,
        fragmentation=sim.wait_frag_int / sim.wait_free_int if sim.wait_free_int > 0 else 0.0,
        free_on_partial_nodes=sim.partial_int / sim.free_int if sim.free_int > 0 else 0.0,
        makespan_s=makespan,
        passes=sim.passes,
        schedule_s=sim.schedule_s,
        wall_s=wall_s,
        outcomes=outcomes,
    )


@dataclass(frozen=True, slots=True)
class ReplayReport:
    """A trace file replayed under one or more policies, with what was assumed on the way."""

    trace: str
    format: str
    rows: int
    jobs: int
    cluster: str
    notes: tuple[str, ...]
    time_limit_factor: float
    results: tuple[ReplayResult, ...]

    def as_dict(self) -> dict[str, object]:
        return {
            "trace": self.trace,
            "format": self.format,
            "rows": self.rows,
            "jobs": self.jobs,
            "cluster": self.cluster,
            "notes": list(self.notes),
            "time_limit_factor": self.time_limit_factor,
            "results": [r.as_dict() for r in self.results],
        }


def replay_file(
    trace: Path,
    policies: Sequence[PolicyName] = POLICIES,
    *,
    nodes_file: Path | None = None,
    nodes: int | None = None,
    gpus_per_node: int | None = None,
    limit: int | None = None,
    load: float = 0.8,
    seed: int = 1,
    options: ReplayOptions | None = None,
) -> ReplayReport:
    """Read a trace file (format from its header), pick the cluster, replay it under each policy.

    Raises `InvalidInput` for an unreadable or malformed file, or a cluster that cannot be chosen.
    """
    options = options or ReplayOptions()
    fmt = read_format(trace)
    cluster, described = resolve_cluster(trace, fmt, nodes_file=nodes_file, nodes=nodes, gpus_per_node=gpus_per_node)
    loaded = read_trace(trace, cluster_gpus=sum(n.gpus for n in cluster), limit=limit, load=load, seed=seed)
    factor = options.time_limit_factor
    limits = "the exact runtime" if factor == 1 else f"{factor:g} x the runtime"
    notes = (
        *loaded.notes,
        f"time limits: {limits}; scheduler passes at arrivals and completions only, in simulated time",
    )
    results = tuple(replay(loaded.jobs, cluster, policy, options) for policy in policies)
    return ReplayReport(
        trace=str(trace),
        format=loaded.format,
        rows=loaded.rows,
        jobs=len(loaded.jobs),
        cluster=described,
        notes=notes,
        time_limit_factor=factor,
        results=results,
    )


def format_seconds(seconds: float) -> str:
    """A duration for people: 45s, 12.5m, 3.2h, 4.1d."""
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds / 60:.1f}m"
    if seconds < 86_400:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86_400:.1f}d"
