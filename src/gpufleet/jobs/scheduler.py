"""The built-in workload manager's scheduler: a pure function of (cluster, queue, clock) -> decisions.

No database, no I/O and no clock reads: the caller (the scheduler tick in `workers`) reads the nodes,
the running jobs, the queue and the projects, calls `schedule` with `now`, and applies the decisions.
Being pure is what lets the invariants (no GPU given twice, gangs all-or-none, quotas) be checked by
property-based tests over random clusters, and the throughput be benchmarked without servers
(bench/scheduler.py).

One pass, in order:

1. Only schedulable nodes exist for the pass (`NodeView.schedulable`, see `node_schedulable`); a GPU (or
   MIG instance) is free when the node reports it free *and* no running job holds it, so a stale view
   cannot double-book.
2. The queue is sorted: priority (higher first), then fair share (the project's decayed usage divided by
   its share, lower first), then submission time, then id, so the order is total and deterministic.
3. Each job in turn is `unschedulable` (fits on no schedulable node even if all were empty), `quota`
   (its project would hold more than `max_gpus`), `budget` (its worst case, time limit x GPUs, plus what
   the project's running jobs may still use, exceeds the GPU-hours left), placed, or waits.
4. The first whole-GPU job that waits for resources is the *top pending job*: it gets a reservation,
   the earliest time the running jobs' time limits guarantee it fits, on named nodes. With backfill,
   later jobs still run now if they stay off the reserved nodes or end (by their time limit) before the
   reservation starts, so they never delay it; the others wait with `priority` (they would fit but for
   the reservation) or `resources`. Without backfill nothing passes the top pending job.

Placement: a job's nodes each get `gpus_per_node` GPUs (a job asks for whole nodes' shares, so a
multi-GPU job with `nodes=1` always stays on one node), preferring contiguous GPU indexes (GPUs that
share a PCIe switch or NVLink domain are usually numbered together). A multi-node job prefers nodes
under one topology label (switch or rack). A job whose environment needs a newer NVIDIA driver (its CUDA
version, `protocol.cuda`) lands only on nodes whose driver is at least that; with no such node it is
`unschedulable`. A one-node job with a model or datasets goes to a fitting node whose cache already holds
the most of them (data locality: no copy before it starts), the placement policy breaking ties;
without such a node, placement is as usual. Per category, "pack" fills the fullest node that fits
(keeping whole nodes free for big jobs) and "spread" the emptiest (load balancing).

MIG (Multi-Instance GPU): a node may have some GPUs split into instances (`NodeView.slices`, the free
ones by profile). Those GPUs are not whole GPUs to the scheduler at all (not in `gpus`, not in
`gpu_count`), so a whole-GPU job never lands on a sliced GPU and a slice job never on a whole one. A
*slice job* (`JobRequest.profile`) asks `gpus_per_node` instances of one profile on each of its nodes;
it is placed like a whole-GPU job (category, driver, CPUs and memory, data locality, pack or spread
by the node's free instances of that profile, the lowest instance UUIDs first; a gang of several
nodes prefers one switch), and an instance a running job holds is never given again, whatever the
view says. What a job counts as in quotas and budgets is `gpus`, fractions included: an instance
counts as its `fraction` of a GPU (1/7 for a 1g profile); the caller's fair-share `usage` should be
charged the same way. A slice job never becomes the top pending job and never takes the reservation:
waiting for instances it is `resources`, and the jobs after it go on as if it were not there
(instances are small and churn fast, and holding whole nodes empty for one would idle their whole
GPUs for a sliver of work). It does respect a reservation made for a whole-GPU job: on a reserved
node (whose CPUs and memory the reservation counts on) it runs only if it ends before the reservation
starts, and without backfill it waits behind the top pending job like any other.
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

    `gpus` are the free whole-GPU indexes and `gpu_count` how many whole GPUs the node has; `cpus`/`mem_mib`
    are totals (used only to tell `unschedulable` from `resources`; when left 0 the free figures stand in
    for them).

    MIG: `slices` are the node's free MIG instances by profile name ("1g.18gb" -> the instances' MIG
    device UUIDs, sorted), and `slice_capacity` how many instances of each profile the node has in all,
    free or busy (to tell `unschedulable` from `resources`; when a profile is missing, the free ones
    stand in). Invariant: a GPU in MIG mode is in neither `gpus` nor `gpu_count`: whole GPUs and sliced
    GPUs are disjoint, so a whole-GPU job can never land on a sliced GPU. The whole-GPU indexes therefore
    need not be 0 .. gpu_count-1 (GPU 0 sliced: gpu_count 7, whole GPUs 1-7); at most `gpu_count` of
    them, the lowest, are used.
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
    # Left out of the hash (dicts are not hashable), so a view stays hashable; equality still compares them.
    slices: Mapping[str, tuple[str, ...]] = field(default_factory=dict, hash=False)  # profile -> free MIG UUIDs
    slice_capacity: Mapping[str, int] = field(default_factory=dict, hash=False)  # profile -> instances in all


@dataclass(frozen=True, slots=True)
class JobRequest:
    """A queued job: `nodes` nodes, each with `gpus_per_node` GPUs, CPUs and memory (a gang: all or none).

    With `profile` set it is a slice job: each node gives it `gpus_per_node` MIG instances of that
    profile instead of whole GPUs (at least one; `nodes` > 1 is a gang of such nodes, supported).
    `fraction` is what one of its GPUs (or instances) counts as in quotas, budgets and `gpus`: 1.0
    for whole GPUs, the profile's share of the GPU (1/7 for 1g, 3/7 for 3g) for a slice job.
    """

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
    profile: str | None = None  # a MIG profile ("1g.18gb"): instances of it, not whole GPUs; None: whole GPUs
    fraction: float = 1.0  # what one of its GPUs counts as in quotas and budgets

    @property
    def gpus(self) -> float:
        """GPUs it counts as in quotas and budgets: fractions of GPUs for a slice job."""
        return self.nodes * self.gpus_per_node * self.fraction

    def runs_on(self, driver: DriverVersion | None) -> bool:
        """Whether a node with this driver can run the job (a node whose driver is unknown cannot, when
        the job needs one)."""
        return self.min_driver is None or (driver is not None and driver >= self.min_driver)


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A job already running: the GPUs it holds, and the time its limit ends it (for reservations).

    `allocation` holds whole GPUs only; a slice job's MIG instances are in `instances` (node -> UUIDs),
    and its `allocation` names no GPU indexes (its nodes map to empty sets, or are left out): listing
    the instances' parent GPUs there would count them as whole GPUs. A held instance is never given to
    another job, even when a stale node view lists it as free.
    """

    id: str
    project: str
    allocation: Mapping[str, frozenset[int]]
    ends_by: float
    cpus_per_node: int = 0
    mem_per_node_mib: int = 0
    instances: Mapping[str, frozenset[str]] = field(default_factory=dict)  # node -> MIG UUIDs held
    fraction: float = 1.0  # what one of its instances counts as (see JobRequest.fraction)

    @property
    def gpus(self) -> float:
        """Whole GPUs held plus instances held times `fraction`."""
        whole = sum(len(g) for g in self.allocation.values())
        if not self.instances:
            return float(whole)
        return whole + sum(len(i) for i in self.instances.values()) * self.fraction


@dataclass(frozen=True, slots=True)
class ProjectLimits:
    """A project's quotas and fair-share standing. A project missing from `schedule`'s map has none.

    `max_gpus`: GPUs held at once, MIG instances counting as their fraction (a small tolerance absorbs
    float sums: seven 1/7 instances fit a max_gpus of 1). `gpu_hours_left`: the period's budget less the
    GPU-hours already charged (running jobs' future use is reserved by the scheduler itself). `usage`:
    decayed GPU-seconds (see `decay`), instances charged at their fraction. `share`: its weight.
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
    """Where a job starts. A whole-GPU job: `allocation` maps each node to its GPU indexes, `instances`
    is empty. A slice job: `allocation` maps each node to () and `instances` maps it to the MIG UUIDs
    (the caller finds each instance's parent GPU)."""

    job_id: str
    allocation: dict[str, tuple[int, ...]]  # node name -> GPU indexes
    instances: dict[str, tuple[str, ...]] = field(default_factory=dict)  # node name -> MIG UUIDs


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
        "slice_cap",
        "slices",
        "topology",
    )

    def __init__(self, idx: int, view: NodeView, held: set[int] | None, taken: set[str]) -> None:
        self.idx = idx
        self.name = view.name
        self.category = view.category
        self.topology = view.topology
        self.driver = view.driver
        self.cached = view.cached
        self.gpu_count = view.gpu_count
        free = {g for g in view.gpus if g >= 0}
        if held:
            free -= held
        # Sliced GPUs are left out of both, so the indexes may run past gpu_count; never more than it.
        self.free = sorted(free)[: max(view.gpu_count, 0)]
        # MIG instances: the free ones by profile, less any a running job holds on this node or an earlier
        # profile listed (`taken`: a UUID is given at most once, whatever the view says). Per node: a node
        # that lists another node's UUIDs (an agent's lie) can cost only itself.
        self.slices: dict[str, list[str]] = {}
        self.slice_cap: dict[str, int] = {}
        if view.slices or view.slice_capacity:
            for profile, uuids in view.slices.items():
                listed = sorted(set(uuids))
                self.slices[profile] = [u for u in listed if u not in taken]
                taken.update(listed)
                self.slice_cap[profile] = max(view.slice_capacity.get(profile, 0), len(listed))
            for profile, cap in view.slice_capacity.items():
                if profile not in self.slices:
                    self.slices[profile] = []
                    self.slice_cap[profile] = cap
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


# category, nodes, then per node: GPUs, CPUs, memory; the least driver; the MIG profile (None: whole GPUs)
_Shape = tuple[str | None, int, int, int, int, DriverVersion | None, str | None]


def _category_order(cats: Iterable[str | None]) -> list[str | None]:
    return sorted(cats, key=lambda c: (c is not None, c or ""))


def _by_topology(cands: list[_Node], want: int, spread: bool) -> list[_Node]:
    """`want` of the candidate nodes (at least that many), under as few topology labels as possible."""
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


class _Pass:
    """One scheduling pass: the free-GPU index and the per-pass caches.

    The index keeps, per category, a bucket of node indexes by free-GPU count, so "a node with >= g free
    GPUs, fullest (pack) or emptiest (spread) first" walks at most gpu_count+1 buckets instead of every
    node. Within a pass free resources only ever shrink (placements take, nothing is released), so a
    shape that did not fit once cannot fit later in the pass: `_no_fit` remembers it, which keeps a full
    cluster with 10,000 queued jobs at a few dictionary look-ups per job instead of a node scan each.

    MIG instances have the same kind of index, one per profile (`sbuckets[profile][category][free
    instances of it]`), and the profile is part of the shape, so slice jobs get the same guarantees.
    """

    def __init__(self, nodes: Sequence[NodeView], running: Sequence[RunningJob], policy: Policy) -> None:
        self.policy = policy
        held: dict[str, set[int]] = {}
        for job in running:
            for name, gpus in job.allocation.items():
                held.setdefault(name, set()).update(gpus)
        taken: dict[str, set[str]] = {}  # by node: MIG UUIDs running jobs hold, then those it already listed
        for job in running:
            for name, uuids in job.instances.items():
                taken.setdefault(name, set()).update(uuids)
        self.nodes: list[_Node] = []
        for view in nodes:
            if view.schedulable:
                self.nodes.append(_Node(len(self.nodes), view, held.get(view.name), taken.setdefault(view.name, set())))
        self.by_name = {n.name: n for n in self.nodes}
        self.holders: dict[str, list[str]] = {}  # checksum -> the nodes whose cache holds it
        for n in self.nodes:
            for sha in n.cached:
                self.holders.setdefault(sha, []).append(n.name)
        self.width = max((n.gpu_count for n in self.nodes), default=0) + 1
        self.buckets: dict[str | None, list[set[int]]] = {}
        for n in self.nodes:
            self.buckets.setdefault(n.category, [set() for _ in range(self.width)])[len(n.free)].add(n.idx)
        self.categories = _category_order(self.buckets)
        # The same index for MIG instances, per profile: bucket by the node's free instances of it.
        self.sbuckets: dict[str, dict[str | None, list[set[int]]]] = {}
        self.swidth: dict[str, int] = {}
        self.scats: dict[str, list[str | None]] = {}
        self.profile_nodes: dict[str, list[_Node]] = {}  # the nodes that have instances of a profile
        self._index_slices()
        self.reserved: list[_Node] = []
        self._no_fit: set[tuple[_Shape, bool]] = set()
        self._capacity: dict[_Shape, bool] = {}

    def _index_slices(self) -> None:
        for n in self.nodes:
            for profile, free_slices in n.slices.items():
                self.profile_nodes.setdefault(profile, []).append(n)
                self.swidth[profile] = max(self.swidth.get(profile, 1), len(free_slices) + 1)
        for profile, having in self.profile_nodes.items():
            width = self.swidth[profile]
            by_cat: dict[str | None, list[set[int]]] = {}
            for n in having:
                by_cat.setdefault(n.category, [set() for _ in range(width)])[len(n.slices[profile])].add(n.idx)
            self.sbuckets[profile] = by_cat
            self.scats[profile] = _category_order(by_cat)

    @staticmethod
    def shape(job: JobRequest) -> _Shape:
        return (
            job.category,
            job.nodes,
            job.gpus_per_node,
            job.cpus_per_node,
            job.mem_per_node_mib,
            job.min_driver,
            job.profile,
        )

    def _cats(self, category: str | None) -> Iterable[str | None]:
        if category is None:
            return self.categories
        return (category,) if category in self.buckets else ()

    def can_ever_fit(self, job: JobRequest) -> bool:
        """Whether the job fits on the schedulable nodes with nothing running (cached per shape)."""
        shape = self.shape(job)
        known = self._capacity.get(shape)
        if known is None:
            cat, count, g, c, m, _, profile = shape
            ok_nodes = 0
            if profile is not None:
                # A slice job: nodes with at least `g` instances of its profile (free or not), g >= 1.
                if count >= 1 and g >= 1:
                    for n in self.profile_nodes.get(profile, ()):
                        if (
                            (cat is None or n.category == cat)
                            and n.slice_cap[profile] >= g
                            and n.cpu_cap >= c
                            and n.mem_cap >= m
                            and job.runs_on(n.driver)
                        ):
                            ok_nodes += 1
            elif count >= 1 and g >= 0:
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
        if job.profile is not None:
            local = self._find_local(job, include_reserved) if job.nodes == 1 else None
            found = [local] if local is not None else self._find_slices(job, include_reserved)
        elif job.nodes == 1:
            one = self._find_local(job, include_reserved) or self._find_one(job, include_reserved)
            found = [one] if one is not None else None
        else:
            found = self._find_gang(job, include_reserved)
        if found is None:
            self._no_fit.add(key)
        return found

    @staticmethod
    def _free(n: _Node, job: JobRequest) -> int:
        """The node's free GPUs for a whole-GPU job, free instances of its profile for a slice job."""
        return len(n.free) if job.profile is None else len(n.slices.get(job.profile, ()))

    def _fits(self, n: _Node, job: JobRequest) -> bool:
        return (
            self._free(n, job) >= job.gpus_per_node
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
        # Most data held first; then the placement policy (pack: fewest free GPUs or instances); then the name.
        return min(
            fits,
            key=lambda n: (-len(n.cached & job.data), -self._free(n, job) if spread else self._free(n, job), n.name),
        )

    def _first_fit(self, buckets: Sequence[set[int]], order: range, job: JobRequest) -> _Node | None:
        """The first node, walking the buckets in `order`, with the job's CPUs, memory and driver."""
        for k in order:
            for i in buckets[k]:
                n = self.nodes[i]
                if n.cpu_free >= job.cpus_per_node and n.mem_free >= job.mem_per_node_mib and job.runs_on(n.driver):
                    return n
        return None

    def _find_one(self, job: JobRequest, include_reserved: bool) -> _Node | None:
        g = job.gpus_per_node
        best_pack: _Node | None = None
        best_spread: _Node | None = None
        for cat in self._cats(job.category):
            buckets = self.buckets[cat]
            spread = self.policy.for_category(cat) == "spread"
            order = range(self.width - 1, g - 1, -1) if spread else range(g, self.width)
            hit = self._first_fit(buckets, order, job)
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

    def _find_slices(self, job: JobRequest, include_reserved: bool) -> list[_Node] | None:
        """Nodes for a slice job: `nodes` of them, each with `gpus_per_node` free instances of its profile.

        One node: per category the fullest (pack) or emptiest (spread) fit by free instances of the
        profile, a pack category's fit winning across categories, as `_find_one` does for whole GPUs.
        A gang: the fitting nodes, ordered the same way, grouped by topology as `_find_gang` does.
        """
        profile = job.profile
        by_cat = self.sbuckets.get(profile) if profile is not None else None
        if profile is None or by_cat is None or job.gpus_per_node < 1:
            return None
        cats: Sequence[str | None] = (
            self.scats[profile] if job.category is None else ((job.category,) if job.category in by_cat else ())
        )
        extra = [n for n in self.reserved if job.category in (None, n.category)] if include_reserved else []
        if job.nodes == 1:
            one = self._find_one_slice(job, profile, by_cat, cats)
            if one is None and extra:
                fits = [n for n in extra if self._fits(n, job)]
                if fits:
                    spread = self.policy.for_category(job.category) == "spread"
                    one = (max if spread else min)(fits, key=lambda n: self._free(n, job))
            return [one] if one is not None else None
        g, c, m = job.gpus_per_node, job.cpus_per_node, job.mem_per_node_mib
        width = self.swidth[profile]
        spread = self.policy.for_category(job.category) == "spread"
        order = range(width - 1, g - 1, -1) if spread else range(g, width)
        cands = [
            self.nodes[i]
            for k in order
            for cat in cats
            for i in by_cat[cat][k]
            if self.nodes[i].cpu_free >= c and self.nodes[i].mem_free >= m and job.runs_on(self.nodes[i].driver)
        ]
        cands += [n for n in extra if self._fits(n, job)]
        if len(cands) < job.nodes:
            return None
        return _by_topology(cands, job.nodes, spread)

    def _find_one_slice(
        self, job: JobRequest, profile: str, by_cat: dict[str | None, list[set[int]]], cats: Iterable[str | None]
    ) -> _Node | None:
        """One unreserved node for a one-node slice job, walking the profile's buckets like `_find_one`."""
        g = job.gpus_per_node
        width = self.swidth[profile]
        best_pack: _Node | None = None
        best_spread: _Node | None = None
        for cat in cats:
            buckets = by_cat[cat]
            spread = self.policy.for_category(cat) == "spread"
            hit = self._first_fit(buckets, range(width - 1, g - 1, -1) if spread else range(g, width), job)
            if hit is None:
                continue
            free = len(hit.slices[profile])
            if spread:
                if best_spread is None or free > len(best_spread.slices[profile]):
                    best_spread = hit
            elif best_pack is None or free < len(best_pack.slices[profile]):
                best_pack = hit
        return best_pack or best_spread

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
        return _by_topology(cands, want, spread)

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

    def take_slices(
        self, job: JobRequest, profile: str, chosen: list[_Node]
    ) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[str, ...]]]:
        """Give a slice job the lowest free instances of its `profile`, CPUs and memory on `chosen`:
        (allocation with no GPU indexes, instances by node)."""
        alloc: dict[str, tuple[int, ...]] = {}
        instances: dict[str, tuple[str, ...]] = {}
        g = job.gpus_per_node
        for n in chosen:
            free = n.slices[profile]
            if not n.reserved:
                self.sbuckets[profile][n.category][len(free)].discard(n.idx)
            n.slices[profile] = free[g:]
            n.cpu_free -= job.cpus_per_node
            n.mem_free -= job.mem_per_node_mib
            if not n.reserved:
                self.sbuckets[profile][n.category][len(free) - g].add(n.idx)
            alloc[n.name] = ()
            instances[n.name] = tuple(free[:g])
        return alloc, instances

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
            for profile, free in n.slices.items():
                self.sbuckets[profile][n.category][len(free)].discard(n.idx)
            n.reserved = True
            self.reserved.append(n)
        return Reservation(job.id, at, tuple(names))


class _Books:
    """Per-project accounting for the pass: GPUs held (quota) and worst-case GPU-hours still to use (budget)."""

    def __init__(self, running: Sequence[RunningJob], projects: Mapping[str, ProjectLimits], now: float) -> None:
        self.projects = projects
        self.now = now
        self.in_use: dict[str, float] = {}
        self.committed: dict[str, float] = {}
        # (time, node, GPUs, CPUs, memory) each job gives back at the latest: what reservations replay.
        self.releases: list[tuple[float, str, int, int, int]] = []
        for r in running:
            held = r.gpus
            self.in_use[r.project] = self.in_use.get(r.project, 0.0) + held
            left_s = max(r.ends_by - now, 0.0)
            self.committed[r.project] = self.committed.get(r.project, 0.0) + held * left_s / 3600.0
            for name, gpus in r.allocation.items():
                self.releases.append((r.ends_by, name, len(gpus), r.cpus_per_node, r.mem_per_node_mib))
            for name in r.instances:
                if name not in r.allocation:  # a slice job's nodes give back CPUs and memory, no GPUs
                    self.releases.append((r.ends_by, name, 0, r.cpus_per_node, r.mem_per_node_mib))

    def limits(self, project: str) -> ProjectLimits:
        return self.projects.get(project) or _NO_LIMITS

    def refusal(self, job: JobRequest) -> PendingReason | None:
        """`quota` or `budget` when the job's project may not start it now, else None."""
        lim = self.limits(job.project)
        gpus = job.gpus
        if lim.max_gpus is not None and self.in_use.get(job.project, 0.0) + gpus > lim.max_gpus + _EPS:
            return PendingReason.QUOTA
        cost = gpus * job.time_limit_s / 3600.0
        if lim.gpu_hours_left is not None and self.committed.get(job.project, 0.0) + cost > lim.gpu_hours_left + _EPS:
            return PendingReason.BUDGET
        return None

    def charge(self, job: JobRequest, alloc: Mapping[str, tuple[int, ...]]) -> None:
        """Count a placed job; its nodes' releases (a slice job's allocation is {node: ()}: no GPUs)."""
        gpus = job.gpus
        self.in_use[job.project] = self.in_use.get(job.project, 0.0) + gpus
        cost = gpus * job.time_limit_s / 3600.0
        self.committed[job.project] = self.committed.get(job.project, 0.0) + cost
        end = self.now + job.time_limit_s
        self.releases.extend((end, n, len(g), job.cpus_per_node, job.mem_per_node_mib) for n, g in alloc.items())

    def fair_share(self, project: str) -> float:
        """Decayed usage per unit of share: lower goes first among equal priorities."""
        lim = self.limits(project)
        return lim.usage / lim.share if lim.share > 0 else math.inf


_NO_LIMITS = ProjectLimits()
_EPS = 1e-9  # float sums of fractions: seven 1/7 instances are one GPU, not a hair more


def _start(state: _Pass, job: JobRequest, chosen: list[_Node]) -> Placement:
    """Take what the job gets on `chosen`: whole GPUs, or instances of its profile."""
    if job.profile is None:
        return Placement(job.id, state.take(job, chosen))
    alloc, instances = state.take_slices(job, job.profile, chosen)
    return Placement(job.id, alloc, instances)


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
            placement = _start(state, job, chosen)
            out.placements.append(placement)
            books.charge(job, placement.allocation)
        elif res is None and not blocked and job.profile is None:
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
            # Held for the reservation (or behind the top job, without backfill) when it would fit now
            # but for that; else waiting for resources. A slice job never reserves: it lands here too.
            fits = state.find(job, include_reserved=True) is not None
            out.pending[job.id] = PendingReason.PRIORITY if fits else PendingReason.RESOURCES
    return out
