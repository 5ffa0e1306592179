"""The built-in workload manager's scheduler: a pure function of (cluster, queue, clock) -> decisions.

No database, no I/O and no clock reads: the caller (the scheduler tick in `workers`) reads the nodes,
the running jobs, the queue and the projects, calls `schedule` with `now`, and applies the decisions.
Being pure is what lets the invariants (no GPU given twice, gangs all-or-none, quotas) be checked by
property-based tests over random clusters, and the throughput be benchmarked without servers
(bench/scheduler.py).

One pass, in order:

1. Only schedulable nodes exist for the pass (`NodeView.schedulable`, see `node_schedulable`); a GPU is
   free when the node reports it free *and* no running job holds it, so a stale view cannot double-book.
2. The queue is sorted: priority (higher first), then fair share (the project's decayed usage divided by
   its share, lower first), then submission time, then id, so the order is total and deterministic.
3. Each job in turn is `unschedulable` (fits on no schedulable node even if all were empty), `quota`
   (its project would hold more than `max_gpus`), `budget` (its worst case, time limit x GPUs, plus what
   the project's running jobs may still use, exceeds the GPU-hours left), placed, or waits.
4. The first job that waits for resources is the *top pending job*: it gets a reservation, the earliest
   time the running jobs' time limits guarantee it fits, on named nodes. With backfill, later jobs still
   run now if they stay off the reserved nodes or end (by their time limit) before the reservation
   starts, so they never delay it; the others wait with `priority` (they would fit but for the
   reservation) or `resources`. Without backfill nothing passes the top pending job.

Placement: a job's nodes each get `gpus_per_node` GPUs (a job asks for whole nodes' shares, so a
multi-GPU job with `nodes=1` always stays on one node), preferring contiguous GPU indexes (GPUs that
share a PCIe switch or NVLink domain are usually numbered together). A multi-node job prefers nodes
under one topology label (switch or rack). A job whose environment needs a newer NVIDIA driver (its CUDA
version, `protocol.cuda`) lands only on nodes whose driver is at least that; with no such node it is
`unschedulable`. A one-node job with a model or datasets goes to a fitting node whose cache already holds
the most of them (data locality: no copy before it starts), the placement policy breaking ties;
without such a node, placement is as usual. Per category, "pack" fills the fullest node that fits
(keeping whole nodes free for big jobs) and "spread" the emptiest (load balancing).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from gpufleet.protocol.cuda import DriverVersion

PlacementPolicy = Literal["pack", "spread"]

# Node health values under which a node takes no new work; "degraded" still does (the health loop
# drains a node when it fails, and a drained node is unschedulable anyway).
UNSCHEDULABLE_HEALTH = frozenset({"failed"})


class PendingReason(enum.StrEnum):
    QUOTA = "quota"  # the project would hold more GPUs at once than its max_gpus
    BUDGET = "budget"  # the project's GPU-hours left do not cover the job's worst case
    RESOURCES = "resources"  # does not fit in what is free now
    PRIORITY = "priority"  # would fit now, but is held for a higher-ordered job's reservation
    UNSCHEDULABLE = "unschedulable"  # fits on no schedulable node even with the cluster empty


@dataclass(frozen=True, slots=True)
class NodeView:
    """A schedulable-or-not node as the scheduler sees it: capacity, what is free now, where it sits.

    `gpus` are the free GPU indexes (0 .. gpu_count-1); `cpus`/`mem_mib` are totals (used only to tell
    `unschedulable` from `resources`; when left 0 the free figures stand in for them).
    """

    name: str
    gpu_count: int
    gpus: frozenset[int]
    cpus_free: int = 0
    mem_free_mib: int = 0
    cpus: int = 0
    mem_mib: int = 0
    schedulable: bool = True
    category: str | None = None
    topology: str | None = None  # the switch or rack label; nodes sharing one are close on the network
    driver: DriverVersion | None = None  # the NVIDIA driver, as a version tuple; None: not known
    cached: frozenset[str] = frozenset()  # checksums of the models and datasets its cache holds


@dataclass(frozen=True, slots=True)
class JobRequest:
    """A queued job: `nodes` nodes, each with `gpus_per_node` GPUs, CPUs and memory (a gang: all or none)."""

    id: str
    project: str
    nodes: int = 1
    gpus_per_node: int = 1
    cpus_per_node: int = 0
    mem_per_node_mib: int = 0
    time_limit_s: float = 3600.0
    priority: int = 0
    submitted_at: float = 0.0
    category: str | None = None  # run only on nodes of this category (a partition); None: any
    min_driver: DriverVersion | None = None  # its environment's CUDA needs this driver or newer
    data: frozenset[str] = frozenset()  # checksums of its model and datasets: nodes holding them come first

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def runs_on(self, driver: DriverVersion | None) -> bool:
        """Whether a node with this driver can run the job (a node whose driver is unknown cannot, when
        the job needs one)."""
        return self.min_driver is None or (driver is not None and driver >= self.min_driver)


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A job already running: the GPUs it holds, and the time its limit ends it (for reservations)."""

    id: str
    project: str
    allocation: Mapping[str, frozenset[int]]
    ends_by: float
    cpus_per_node: int = 0
    mem_per_node_mib: int = 0

    @property
    def gpus(self) -> int:
        return sum(len(g) for g in self.allocation.values())


@dataclass(frozen=True, slots=True)
class ProjectLimits:
    """A project's quotas and fair-share standing. A project missing from `schedule`'s map has none.

    `gpu_hours_left`: the period's budget less the GPU-hours already charged (running jobs' future use is
    reserved by the scheduler itself). `usage`: decayed GPU-seconds (see `decay`). `share`: its weight.
    """

    max_gpus: int | None = None
    gpu_hours_left: float | None = None
    usage: float = 0.0
    share: float = 1.0


@dataclass(frozen=True, slots=True)
class Policy:
    placement: Mapping[str, PlacementPolicy] = field(default_factory=dict)  # by node category
    default: PlacementPolicy = "pack"  # for categories not in `placement`, and nodes without one
    backfill: bool = True

    def for_category(self, category: str | None) -> PlacementPolicy:
        if category is None:
            return self.default
        return self.placement.get(category, self.default)


@dataclass(frozen=True, slots=True)
class Placement:
    job_id: str
    allocation: dict[str, tuple[int, ...]]  # node name -> GPU indexes


@dataclass(frozen=True, slots=True)
class Reservation:
    """Where and when the top pending job will run at the latest, given the running jobs' time limits."""

    job_id: str
    start_at: float
    nodes: tuple[str, ...]


@dataclass(slots=True)
class Decisions:
    placements: list[Placement]
    pending: dict[str, PendingReason]
    reservation: Reservation | None = None


def blocked_by_driver(nodes: Sequence[NodeView], jobs: Iterable[JobRequest]) -> set[str]:
    """The ids of `jobs` unschedulable only for their driver: each would fit on the schedulable nodes, empty,
    were its environment's driver need dropped (so its reason can name the driver, and only then). One
    probe for them all: its fit cache is per shape, so a queue of such jobs costs one node scan per shape."""
    probe = _Pass(nodes, (), Policy())
    return {
        job.id
        for job in jobs
        if job.min_driver is not None
        and not probe.can_ever_fit(job)
        and probe.can_ever_fit(replace(job, min_driver=None))
    }


def decay(usage: float, elapsed_s: float, half_life_s: float) -> float:
    """Usage halves every `half_life_s`, so fair share forgets old use; a half life <= 0 forgets at once."""
    if half_life_s <= 0:
        return 0.0
    return float(usage * 0.5 ** (max(elapsed_s, 0.0) / half_life_s))


def node_schedulable(state: str, health: str, drained: bool) -> bool:
    """Whether new work may land on a node: up, not drained, not failed (a NodeView's `schedulable`)."""
    return state == "up" and not drained and health not in UNSCHEDULABLE_HEALTH


class _Node:
    """A node's mutable state during one pass."""

    __slots__ = (
        "cached",
        "category",
        "cpu_cap",
        "cpu_free",
        "driver",
        "free",
        "gpu_count",
        "idx",
        "mem_cap",
        "mem_free",
        "name",
        "reserved",
        "topology",
    )

    def __init__(self, idx: int, view: NodeView, held: set[int] | None) -> None:
        self.idx = idx
        self.name = view.name
        self.category = view.category
        self.topology = view.topology
        self.driver = view.driver
        self.cached = view.cached
        self.gpu_count = view.gpu_count
        free = {g for g in view.gpus if 0 <= g < view.gpu_count}
        if held:
            free -= held
        self.free = sorted(free)
        self.cpu_free = view.cpus_free
        self.mem_free = view.mem_free_mib
        self.cpu_cap = max(view.cpus, view.cpus_free)
        self.mem_cap = max(view.mem_mib, view.mem_free_mib)
        self.reserved = False


def _pick(free: list[int], n: int) -> list[int]:
    """The lowest run of `n` consecutive free indexes, else the lowest `n` (at most 8 or so: cheap)."""
    if n <= 0:
        return []
    for s in range(len(free) - n + 1):
        if free[s + n - 1] - free[s] == n - 1:
            return free[s : s + n]
    return free[:n]


# category, nodes, then per node: GPUs, CPUs, memory; the least driver
_Shape = tuple[str | None, int, int, int, int, DriverVersion | None]


class _Pass:
    """One scheduling pass: the free-GPU index and the per-pass caches.

    The index keeps, per category, a bucket of node indexes by free-GPU count, so "a node with >= g free
    GPUs, fullest (pack) or emptiest (spread) first" walks at most gpu_count+1 buckets instead of every
    node. Within a pass free resources only ever shrink (placements take, nothing is released), so a
    shape that did not fit once cannot fit later in the pass: `_no_fit` remembers it, which keeps a full
    cluster with 10,000 queued jobs at a few dictionary look-ups per job instead of a node scan each.
    """

    def __init__(self, nodes: Sequence[NodeView], running: Sequence[RunningJob], policy: Policy) -> None:
        self.policy = policy
        held: dict[str, set[int]] = {}
        for job in running:
            for name, gpus in job.allocation.items():
                held.setdefault(name, set()).update(gpus)
        self.nodes: list[_Node] = []
        for view in nodes:
            if view.schedulable:
                self.nodes.append(_Node(len(self.nodes), view, held.get(view.name)))
        self.by_name = {n.name: n for n in self.nodes}
        self.holders: dict[str, list[str]] = {}  # checksum -> the nodes whose cache holds it
        for n in self.nodes:
            for sha in n.cached:
                self.holders.setdefault(sha, []).append(n.name)
        self.width = max((n.gpu_count for n in self.nodes), default=0) + 1
        self.buckets: dict[str | None, list[set[int]]] = {}
        for n in self.nodes:
            self.buckets.setdefault(n.category, [set() for _ in range(self.width)])[len(n.free)].add(n.idx)
        self.categories = sorted(self.buckets, key=lambda c: (c is not None, c or ""))
        self.reserved: list[_Node] = []
        self._no_fit: set[tuple[_Shape, bool]] = set()
        self._capacity: dict[_Shape, bool] = {}

    @staticmethod
    def shape(job: JobRequest) -> _Shape:
        return (job.category, job.nodes, job.gpus_per_node, job.cpus_per_node, job.mem_per_node_mib, job.min_driver)

    def _cats(self, category: str | None) -> Iterable[str | None]:
        if category is None:
            return self.categories
        return (category,) if category in self.buckets else ()

    def can_ever_fit(self, job: JobRequest) -> bool:
        """Whether the job fits on the schedulable nodes with nothing running (cached per shape)."""
        shape = self.shape(job)
        known = self._capacity.get(shape)
        if known is None:
            cat, count, g, c, m, _ = shape
            ok_nodes = 0
            if count >= 1 and g >= 0:
                for n in self.nodes:
                    if (
                        (cat is None or n.category == cat)
                        and n.gpu_count >= g
                        and n.cpu_cap >= c
                        and n.mem_cap >= m
                        and job.runs_on(n.driver)
                    ):
                        ok_nodes += 1
            known = self._capacity[shape] = ok_nodes >= count >= 1
        return known

    def find(self, job: JobRequest, include_reserved: bool) -> list[_Node] | None:
        """Nodes for the job now (not yet taken), or None; `include_reserved` lets it use reserved nodes."""
        shape = self.shape(job)
        key = (shape, include_reserved)
        if key in self._no_fit:
            return None
        if job.nodes == 1:
            one = self._find_local(job, include_reserved) or self._find_one(job, include_reserved)
            found = [one] if one is not None else None
        else:
            found = self._find_gang(job, include_reserved)
        if found is None:
            self._no_fit.add(key)
        return found

    def _fits(self, n: _Node, job: JobRequest) -> bool:
        return (
            len(n.free) >= job.gpus_per_node
            and n.cpu_free >= job.cpus_per_node
            and n.mem_free >= job.mem_per_node_mib
            and job.runs_on(n.driver)
        )

    def _find_local(self, job: JobRequest, include_reserved: bool) -> _Node | None:
        """A fitting node that holds the most of the job's data; None when none holds any. Only the few
        nodes that cache one of its checksums are looked at (`holders`), never the whole cluster."""
        if not job.data:
            return None
        names = {name for sha in job.data for name in self.holders.get(sha, ())}
        fits = [
            n
            for n in (self.by_name[name] for name in names)
            if job.category in (None, n.category) and (include_reserved or not n.reserved) and self._fits(n, job)
        ]
        if not fits:
            return None
        spread = self.policy.for_category(job.category) == "spread"
        # Most data held first; then the placement policy (pack: fewest free GPUs); then the name.
        return min(fits, key=lambda n: (-len(n.cached & job.data), -len(n.free) if spread else len(n.free), n.name))

    def _find_one(self, job: JobRequest, include_reserved: bool) -> _Node | None:
        g, c, m = job.gpus_per_node, job.cpus_per_node, job.mem_per_node_mib
        best_pack: _Node | None = None
        best_spread: _Node | None = None
        for cat in self._cats(job.category):
            buckets = self.buckets[cat]
            spread = self.policy.for_category(cat) == "spread"
            order = range(self.width - 1, g - 1, -1) if spread else range(g, self.width)
            hit: _Node | None = None
            for k in order:
                for i in buckets[k]:
                    n = self.nodes[i]
                    if n.cpu_free >= c and n.mem_free >= m and job.runs_on(n.driver):
                        hit = n
                        break
                if hit is not None:
                    break
            if hit is None:
                continue
            # Across categories (a job without one): a pack category's fullest fit wins, so whole nodes
            # stay free; else the emptiest node of a spread category.
            if spread:
                if best_spread is None or len(hit.free) > len(best_spread.free):
                    best_spread = hit
            elif best_pack is None or len(hit.free) < len(best_pack.free):
                best_pack = hit
        found = best_pack or best_spread
        if found is None and include_reserved:
            # The reserved nodes are few (the top pending job's node count): scanned, not indexed.
            fits = [n for n in self.reserved if (job.category in (None, n.category)) and self._fits(n, job)]
            if fits:
                spread = self.policy.for_category(job.category) == "spread"
                found = (max if spread else min)(fits, key=lambda n: len(n.free))
        return found

    def _find_gang(self, job: JobRequest, include_reserved: bool) -> list[_Node] | None:
        g, c, m, want = job.gpus_per_node, job.cpus_per_node, job.mem_per_node_mib, job.nodes
        cats = list(self._cats(job.category))
        extra = [n for n in self.reserved if job.category in (None, n.category)] if include_reserved else []
        # Cheap bound first: too few nodes with enough free GPUs, whatever their CPUs and memory.
        if sum(len(self.buckets[cat][k]) for cat in cats for k in range(g, self.width)) + len(extra) < want:
            return None
        spread = self.policy.for_category(job.category) == "spread"
        order = range(self.width - 1, g - 1, -1) if spread else range(g, self.width)
        cands = [
            self.nodes[i]
            for k in order
            for cat in cats
            for i in self.buckets[cat][k]
            if self.nodes[i].cpu_free >= c and self.nodes[i].mem_free >= m and job.runs_on(self.nodes[i].driver)
        ]
        cands += [n for n in extra if self._fits(n, job)]
        if len(cands) < want:
            return None
        groups: dict[str, list[_Node]] = {}
        loose: list[_Node] = []
        for n in cands:
            if n.topology is None:
                loose.append(n)
            else:
                groups.setdefault(n.topology, []).append(n)
        whole = [grp for _, grp in sorted(groups.items()) if len(grp) >= want]
        if whole:
            # One switch holds the gang. Pack: the tightest such switch (keep roomy ones for bigger
            # gangs); spread: the roomiest. Ties go to the label order, for determinism.
            pick = (max if spread else min)(whole, key=len)
            return pick[:want]
        # Span as few switches as possible: the biggest groups first, unlabelled nodes last.
        ranked = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))
        out = [n for _, grp in ranked for n in grp] + loose
        return out[:want]

    def take(self, job: JobRequest, chosen: list[_Node]) -> dict[str, tuple[int, ...]]:
        """Give the job its GPUs, CPUs and memory on `chosen`, keeping the buckets right."""
        alloc: dict[str, tuple[int, ...]] = {}
        g = job.gpus_per_node
        for n in chosen:
            gpus = _pick(n.free, g)
            if not n.reserved:
                self.buckets[n.category][len(n.free)].discard(n.idx)
            taken = set(gpus)
            n.free = [x for x in n.free if x not in taken]
            n.cpu_free -= job.cpus_per_node
            n.mem_free -= job.mem_per_node_mib
            if not n.reserved:
                self.buckets[n.category][len(n.free)].add(n.idx)
            alloc[n.name] = tuple(gpus)
        return alloc

    def reserve(
        self, job: JobRequest, releases: list[tuple[float, str, int, int, int]], now: float
    ) -> Reservation | None:
        """The earliest time `job` fits if every job ends at its time limit, and the nodes it would use.

        Replays the releases (time, node, GPUs, CPUs, memory) in time order over per-node counts; free
        only grows along the way, so a node that fits once keeps fitting and the first moment `nodes` of
        them fit is the answer. One pass over the releases: O(running jobs), once per pass.
        """
        g, c, m = job.gpus_per_node, job.cpus_per_node, job.mem_per_node_mib
        gpus: dict[str, int] = {}
        cpus: dict[str, int] = {}
        mem: dict[str, int] = {}
        ready: list[str] = []
        for n in self.nodes:
            if job.category not in (None, n.category) or not job.runs_on(n.driver):
                continue
            gpus[n.name], cpus[n.name], mem[n.name] = len(n.free), n.cpu_free, n.mem_free
            if len(n.free) >= g and n.cpu_free >= c and n.mem_free >= m:
                ready.append(n.name)
        done = set(ready)
        at = now
        for t, name, rg, rc, rm in sorted(releases):
            if len(ready) >= job.nodes:
                break
            if name not in gpus or name in done:
                continue
            cap = self.by_name[name]
            gpus[name] = min(gpus[name] + rg, cap.gpu_count)
            cpus[name] = min(cpus[name] + rc, cap.cpu_cap)
            mem[name] = min(mem[name] + rm, cap.mem_cap)
            if gpus[name] >= g and cpus[name] >= c and mem[name] >= m:
                ready.append(name)
                done.add(name)
                at = max(t, now)
        if len(ready) < job.nodes:
            return None
        names = ready[: job.nodes]
        for name in names:
            n = self.by_name[name]
            self.buckets[n.category][len(n.free)].discard(n.idx)
            n.reserved = True
            self.reserved.append(n)
        return Reservation(job.id, at, tuple(names))


class _Books:
    """Per-project accounting for the pass: GPUs held (quota) and worst-case GPU-hours still to use (budget)."""

    def __init__(self, running: Sequence[RunningJob], projects: Mapping[str, ProjectLimits], now: float) -> None:
        self.projects = projects
        self.now = now
        self.in_use: dict[str, int] = {}
        self.committed: dict[str, float] = {}
        # (time, node, GPUs, CPUs, memory) each job gives back at the latest: what reservations replay.
        self.releases: list[tuple[float, str, int, int, int]] = []
        for r in running:
            self.in_use[r.project] = self.in_use.get(r.project, 0) + r.gpus
            left_s = max(r.ends_by - now, 0.0)
            self.committed[r.project] = self.committed.get(r.project, 0.0) + r.gpus * left_s / 3600.0
            for name, gpus in r.allocation.items():
                self.releases.append((r.ends_by, name, len(gpus), r.cpus_per_node, r.mem_per_node_mib))

    def limits(self, project: str) -> ProjectLimits:
        return self.projects.get(project) or _NO_LIMITS

    def refusal(self, job: JobRequest) -> PendingReason | None:
        """`quota` or `budget` when the job's project may not start it now, else None."""
        lim = self.limits(job.project)
        if lim.max_gpus is not None and self.in_use.get(job.project, 0) + job.gpus > lim.max_gpus:
            return PendingReason.QUOTA
        cost = job.gpus * job.time_limit_s / 3600.0
        if lim.gpu_hours_left is not None and self.committed.get(job.project, 0.0) + cost > lim.gpu_hours_left + 1e-9:
            return PendingReason.BUDGET
        return None

    def charge(self, job: JobRequest, alloc: Mapping[str, tuple[int, ...]]) -> None:
        self.in_use[job.project] = self.in_use.get(job.project, 0) + job.gpus
        cost = job.gpus * job.time_limit_s / 3600.0
        self.committed[job.project] = self.committed.get(job.project, 0.0) + cost
        end = self.now + job.time_limit_s
        self.releases.extend((end, n, len(g), job.cpus_per_node, job.mem_per_node_mib) for n, g in alloc.items())

    def fair_share(self, project: str) -> float:
        """Decayed usage per unit of share: lower goes first among equal priorities."""
        lim = self.limits(project)
        return lim.usage / lim.share if lim.share > 0 else math.inf


_NO_LIMITS = ProjectLimits()


def schedule(
    nodes: Sequence[NodeView],
    running: Sequence[RunningJob],
    queue: Sequence[JobRequest],
    projects: Mapping[str, ProjectLimits],
    now: float,
    policy: Policy | None = None,
) -> Decisions:
    """Decide which queued jobs start now and on which GPUs, and why the others wait.

    Pure: the same arguments give the same decisions. Every queued job ends up in exactly one of
    `placements` or `pending`. Raises nothing for odd input: a request no node can hold is
    `unschedulable` (refusing it at submit is the caller's job).
    """
    policy = policy or Policy()
    state = _Pass(nodes, running, policy)
    books = _Books(running, projects, now)
    fairness = {p: books.fair_share(p) for p in {j.project for j in queue}}
    ordered = sorted(queue, key=lambda j: (-j.priority, fairness[j.project], j.submitted_at, j.id))

    out = Decisions(placements=[], pending={})
    blocked = False  # a job waits for resources and there is no backfill: nothing else starts
    no_reservation: set[_Shape] = set()
    for job in ordered:
        if not state.can_ever_fit(job):
            out.pending[job.id] = PendingReason.UNSCHEDULABLE
            continue
        refused = books.refusal(job)
        if refused is not None:
            out.pending[job.id] = refused
            continue
        res = out.reservation
        if blocked:
            chosen = None
        elif res is None:
            chosen = state.find(job, include_reserved=True)
        else:
            # Backfill: off the reserved nodes any job may start; on them only one that is over (its time
            # limit) before the reservation begins, so the top pending job starts no later than promised.
            chosen = state.find(job, include_reserved=False)
            if chosen is None and now + job.time_limit_s <= res.start_at:
                chosen = state.find(job, include_reserved=True)
        if chosen is not None:
            alloc = state.take(job, chosen)
            out.placements.append(Placement(job.id, alloc))
            books.charge(job, alloc)
        elif res is None and not blocked:
            # The top pending job: reserve its nodes, unless it would not fit even when every job has ended
            # (GPUs missing but not held), in which case the next waiting job may have the reservation.
            out.pending[job.id] = PendingReason.RESOURCES
            shape = state.shape(job)
            if shape not in no_reservation:
                out.reservation = state.reserve(job, books.releases, now)
                if out.reservation is None:
                    no_reservation.add(shape)
            blocked = not policy.backfill
        else:
            fits = state.find(job, include_reserved=True) is not None
            out.pending[job.id] = PendingReason.PRIORITY if fits else PendingReason.RESOURCES
    return out
