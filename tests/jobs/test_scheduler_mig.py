"""The built-in scheduler with MIG: slice jobs on instances, whole-GPU jobs on whole GPUs, never the two mixed."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.jobs.scheduler import (
    Decisions,
    JobRequest,
    NodeView,
    PendingReason,
    Placement,
    Policy,
    ProjectLimits,
    RunningJob,
    blocked_by_driver,
    schedule,
)

NOW = 1_000_000.0
ONE_G = "1g.18gb"
TWO_G = "2g.35gb"
THREE_G = "3g.71gb"
FOUR_G = "4g.71gb"
FRACTION = {ONE_G: 1 / 7, TWO_G: 2 / 7, THREE_G: 3 / 7, FOUR_G: 4 / 7}


def uuids(node: str, gpu: int, count: int) -> tuple[str, ...]:
    return tuple(f"MIG-{node}-{gpu}-{k}" for k in range(count))


def mig_node(name: str, count: int = 7, free: tuple[str, ...] | None = None, **kw: object) -> NodeView:
    """A node whose one GPU is sliced into `count` 1g instances (no whole GPUs): `free` of them free."""
    kw.setdefault("cpus_free", 64)
    kw.setdefault("mem_free_mib", 512_000)
    return NodeView(
        name=name,
        gpu_count=0,
        gpus=frozenset(),
        slices={ONE_G: uuids(name, 0, count) if free is None else free},
        slice_capacity={ONE_G: count},
        **kw,  # type: ignore[arg-type]
    )


def whole_node(name: str, gpus: int = 8, **kw: object) -> NodeView:
    kw.setdefault("cpus_free", 64)
    kw.setdefault("mem_free_mib", 512_000)
    return NodeView(name=name, gpu_count=gpus, gpus=frozenset(range(gpus)), **kw)  # type: ignore[arg-type]


def slice_job(id: str, project: str = "p", profile: str = ONE_G, **kw: object) -> JobRequest:
    kw.setdefault("submitted_at", NOW - 100)
    kw.setdefault("fraction", FRACTION.get(profile, 1.0))
    return JobRequest(id=id, project=project, profile=profile, **kw)  # type: ignore[arg-type]


def job(id: str, project: str = "p", **kw: object) -> JobRequest:
    kw.setdefault("submitted_at", NOW - 100)
    return JobRequest(id=id, project=project, **kw)  # type: ignore[arg-type]


def run(
    nodes: list[NodeView], queue: list[JobRequest], running: list[RunningJob] | None = None, **kw: object
) -> Decisions:
    projects = kw.pop("projects", {})
    return schedule(nodes, running or [], queue, projects, NOW, **kw)  # type: ignore[arg-type]


def instances(d: Decisions) -> dict[str, dict[str, tuple[str, ...]]]:
    return {p.job_id: p.instances for p in d.placements}


def test_28_one_slice_jobs_fill_4_nodes_of_7_instances_and_the_29th_waits() -> None:
    nodes = [mig_node(f"n{i}") for i in range(4)]
    d = run(nodes, [slice_job(f"j{i:02}") for i in range(29)])
    assert len(d.placements) == 28
    given = [u for p in d.placements for us in p.instances.values() for u in us]
    assert len(given) == len(set(given)) == 28
    assert set(given) == {u for n in nodes for u in n.slices[ONE_G]}
    for p in d.placements:
        # A slice placement names its node with no GPU indexes; the instances carry the work.
        assert p.allocation == dict.fromkeys(p.instances, ())
        assert len(p.instances) == 1
    assert d.pending == {"j28": PendingReason.RESOURCES}
    assert d.reservation is None  # a slice job never takes the reservation


def test_pack_fills_the_fullest_node_and_takes_the_lowest_uuids_spread_balances() -> None:
    nodes = [
        mig_node("a", free=uuids("a", 0, 7)[4:], category="c"),  # 3 free
        mig_node("b", category="c"),  # 7 free
    ]
    d = run(nodes, [slice_job("j", gpus_per_node=2, category="c")], policy=Policy(placement={"c": "pack"}))
    assert instances(d) == {"j": {"a": ("MIG-a-0-4", "MIG-a-0-5")}}
    d = run(nodes, [slice_job("j", gpus_per_node=2, category="c")], policy=Policy(placement={"c": "spread"}))
    assert instances(d) == {"j": {"b": ("MIG-b-0-0", "MIG-b-0-1")}}
    # Pack skips a node with too few instances left for the job: 4 wanted, only b has them.
    d = run(nodes, [slice_job("j", gpus_per_node=4, category="c")])
    assert instances(d) == {"j": {"b": uuids("b", 0, 4)}}


def test_a_whole_gpu_job_never_lands_on_a_sliced_gpu() -> None:
    d = run([mig_node("m1"), mig_node("m2")], [job("w")])
    assert d.pending == {"w": PendingReason.UNSCHEDULABLE}
    assert d.placements == []
    d = run([mig_node("m1"), whole_node("plain"), mig_node("m2")], [job("w", gpus_per_node=2)])
    assert [(p.job_id, p.allocation, p.instances) for p in d.placements] == [("w", {"plain": (0, 1)}, {})]


def test_whole_gpus_of_a_node_with_a_sliced_gpu_keep_their_indexes() -> None:
    # GPU 0 is sliced: the node has 7 whole GPUs, numbered 1-7 (gpu_count counts only whole GPUs).
    mixed = NodeView(
        name="mixed",
        gpu_count=7,
        gpus=frozenset(range(1, 8)),
        cpus_free=64,
        mem_free_mib=512_000,
        slices={ONE_G: uuids("mixed", 0, 7)},
        slice_capacity={ONE_G: 7},
    )
    d = run([mixed], [job("w", gpus_per_node=7), slice_job("s", gpus_per_node=7)])
    assert {p.job_id: p.allocation for p in d.placements} == {"w": {"mixed": tuple(range(1, 8))}, "s": {"mixed": ()}}
    assert instances(d)["s"] == {"mixed": uuids("mixed", 0, 7)}
    # A whole-GPU job asking 8 of them could never fit there.
    assert run([mixed], [job("w", gpus_per_node=8)]).pending == {"w": PendingReason.UNSCHEDULABLE}


def test_quota_counts_a_1g_instance_as_a_seventh_of_a_gpu() -> None:
    nodes = [mig_node("a"), mig_node("b")]
    projects = {"p": ProjectLimits(max_gpus=1)}
    d = run(nodes, [slice_job(f"j{i}") for i in range(8)], projects=projects)
    assert len(d.placements) == 7
    assert d.pending == {"j7": PendingReason.QUOTA}
    # Running instances count too: 6 held leave room for one more.
    running = [RunningJob("r", "p", {}, NOW + 600, instances={"a": frozenset(uuids("a", 0, 6))}, fraction=1 / 7)]
    assert running[0].gpus == pytest.approx(6 / 7)
    d = run(nodes, [slice_job("x"), slice_job("y")], running, projects=projects)
    assert {p.job_id for p in d.placements} == {"x"}
    assert d.pending == {"y": PendingReason.QUOTA}


def test_quota_is_not_refused_for_a_float_rounding_hair() -> None:
    # 2 x 1/7 + 3 x 4/7 + 3 x 4/7 + 2 x 4/7 + 1/7 is exactly 5 GPUs, but 5.000000000000001 in floats.
    a = NodeView(
        name="a",
        gpu_count=0,
        gpus=frozenset(),
        slices={ONE_G: uuids("a", 0, 3), FOUR_G: uuids("a", 1, 8)},
        slice_capacity={ONE_G: 3, FOUR_G: 8},
    )
    q = [
        slice_job("j1", gpus_per_node=2, priority=5),
        slice_job("j2", profile=FOUR_G, gpus_per_node=3, priority=4),
        slice_job("j3", profile=FOUR_G, gpus_per_node=3, priority=3),
        slice_job("j4", profile=FOUR_G, gpus_per_node=2, priority=2),
        slice_job("j5", priority=1),
    ]
    d = run([a], q, projects={"p": ProjectLimits(max_gpus=5)})
    assert d.pending == {}
    assert len(d.placements) == 5


def test_pack_across_categories_prefers_the_fullest_fit() -> None:
    # A job without a category: the fullest fitting node of any pack category, whatever the order.
    nodes = [mig_node("roomy", category="x"), mig_node("full", free=uuids("full", 0, 7)[:3], category="y")]
    d = run(nodes, [slice_job("j")])
    assert instances(d) == {"j": {"full": ("MIG-full-0-0",)}}
    d = run(nodes, [slice_job("j")], policy=Policy(default="spread"))
    assert instances(d) == {"j": {"roomy": ("MIG-roomy-0-0",)}}


def test_budget_counts_fractions() -> None:
    # 1 GPU-hour left: a 1g job may run 7 hours (7 x 1/7 GPU-hours), not 8.
    projects = {"p": ProjectLimits(gpu_hours_left=1.0)}
    d = run(
        [mig_node("a")],
        [slice_job("long", time_limit_s=8 * 3600), slice_job("ok", time_limit_s=7 * 3600)],
        projects=projects,
    )
    assert {p.job_id for p in d.placements} == {"ok"}
    assert d.pending == {"long": PendingReason.BUDGET}


def test_a_profile_no_node_has_is_unschedulable() -> None:
    nodes = [mig_node("a"), whole_node("b")]
    d = run(nodes, [slice_job("j", profile=THREE_G), slice_job("k", gpus_per_node=8), slice_job("z", gpus_per_node=0)])
    assert d.pending == {
        "j": PendingReason.UNSCHEDULABLE,
        "k": PendingReason.UNSCHEDULABLE,  # 7 instances of 1g at most on any node
        "z": PendingReason.UNSCHEDULABLE,  # a slice job asks at least one instance
    }


def test_capacity_tells_unschedulable_from_resources() -> None:
    busy = mig_node("a", free=())  # 7 instances, none free
    d = run([busy], [slice_job("j", gpus_per_node=2)])
    assert d.pending == {"j": PendingReason.RESOURCES}
    d = run([busy], [slice_job("j", gpus_per_node=8)])
    assert d.pending == {"j": PendingReason.UNSCHEDULABLE}


def test_a_stale_view_listing_a_held_instance_as_free_does_not_double_book() -> None:
    held = frozenset(uuids("a", 0, 5))
    running = [RunningJob("r", "q", {"a": frozenset()}, NOW + 600, instances={"a": held}, fraction=1 / 7)]
    d = run([mig_node("a")], [slice_job("j", gpus_per_node=2), slice_job("k")], running)  # view: all 7 free
    assert instances(d) == {"j": {"a": ("MIG-a-0-5", "MIG-a-0-6")}}
    assert d.pending == {"k": PendingReason.RESOURCES}
    # A UUID listed twice by a node is given once.
    d = run([mig_node("b", free=("MIG-x", "MIG-x"))], [slice_job("j"), slice_job("k")])
    assert [u for p in d.placements for us in p.instances.values() for u in us] == ["MIG-x"]
    # Another node listing it too (an agent's lie) costs only that node: a job running on it there does
    # not keep the real device of node a from being given.
    liar = [RunningJob("l", "q", {"b": frozenset()}, NOW + 600, instances={"b": frozenset({"MIG-x"})}, fraction=1 / 7)]
    d = run([mig_node("a", free=("MIG-x",)), mig_node("b", free=("MIG-x",))], [slice_job("j")], liar)
    assert instances(d) == {"j": {"a": ("MIG-x",)}}


def test_a_waiting_slice_job_does_not_block_or_reserve() -> None:
    # The slice job comes first (priority) and waits; the whole-GPU job after it still runs, and the
    # reservation, if any, is never the slice job's.
    nodes = [mig_node("m", free=()), whole_node("w")]
    q = [slice_job("s", priority=9), job("big", gpus_per_node=8)]
    for backfill in (True, False):
        d = run(nodes, q, policy=Policy(backfill=backfill))
        assert d.pending == {"s": PendingReason.RESOURCES}
        assert {p.job_id for p in d.placements} == {"big"}
        assert d.reservation is None


def test_a_slice_job_respects_a_whole_gpu_jobs_reservation() -> None:
    # Node a: 4 whole GPUs (2 held until NOW+1000) and 7 free 1g instances. The top job needs the 4
    # whole GPUs: a is reserved from NOW+1000. A slice job there must end by then, like any backfill.
    a = NodeView(
        name="a",
        gpu_count=4,
        gpus=frozenset({2, 3}),
        cpus_free=8,
        cpus=8,
        mem_free_mib=512_000,
        slices={ONE_G: uuids("a", 4, 7)},
        slice_capacity={ONE_G: 7},
    )
    running = [RunningJob("r", "q", {"a": frozenset({0, 1})}, ends_by=NOW + 1000)]
    top = job("top", gpus_per_node=4, cpus_per_node=8, priority=9)
    d = run([a], [top, slice_job("long", cpus_per_node=1, time_limit_s=5000)], running)
    assert d.reservation is not None
    assert (d.reservation.job_id, d.reservation.nodes, d.reservation.start_at) == ("top", ("a",), NOW + 1000)
    assert d.pending == {"top": PendingReason.RESOURCES, "long": PendingReason.PRIORITY}
    d = run([a], [top, slice_job("short", cpus_per_node=1, time_limit_s=900)], running)
    assert instances(d) == {"short": {"a": ("MIG-a-4-0",)}}


def test_running_slice_jobs_give_back_cpus_for_the_reservation() -> None:
    # The top job needs all 8 CPUs of b; a slice job holds 4 of them until NOW+300.
    b = NodeView(
        name="b",
        gpu_count=1,
        gpus=frozenset({0}),
        cpus_free=4,
        cpus=8,
        slices={ONE_G: uuids("b", 1, 6)},
        slice_capacity={ONE_G: 7},
    )
    running = [
        RunningJob("s", "q", {}, NOW + 300, cpus_per_node=4, instances={"b": frozenset({"MIG-b-1-6"})}, fraction=1 / 7)
    ]
    d = run([b], [job("top", cpus_per_node=8)], running)
    assert d.reservation is not None
    assert (d.reservation.nodes, d.reservation.start_at) == (("b",), NOW + 300)


def test_a_slice_gang_takes_instances_on_each_node() -> None:
    nodes = [mig_node("a", topology="s1"), mig_node("b", topology="s2"), mig_node("c", topology="s2")]
    d = run(nodes, [slice_job("g", nodes=2, gpus_per_node=3)])
    assert instances(d) == {"g": {"b": uuids("b", 0, 3), "c": uuids("c", 0, 3)}}
    assert d.placements[0].allocation == {"b": (), "c": ()}
    d = run(nodes[:1], [slice_job("g", nodes=2)])
    assert d.pending == {"g": PendingReason.UNSCHEDULABLE}


def test_slice_jobs_meet_drivers_and_prefer_nodes_holding_their_data() -> None:
    old, new = (535, 183, 1), (550, 127, 5)
    nodes = [mig_node("old", driver=old), mig_node("new", driver=new, free=uuids("new", 0, 7)[:3])]
    d = run(nodes, [slice_job("j", min_driver=(550, 54, 14))])
    assert instances(d) == {"j": {"new": ("MIG-new-0-0",)}}
    d = run(nodes[:1], [slice_job("j", min_driver=(550, 54, 14))])
    assert d.pending == {"j": PendingReason.UNSCHEDULABLE}
    assert blocked_by_driver(nodes[:1], [slice_job("j", min_driver=(550, 54, 14))]) == {"j"}
    # Pack would pick "new" (fewer free); the model cached on "old" wins.
    cached = [replace(nodes[0], cached=frozenset({"sha"})), nodes[1]]
    d = run(cached, [slice_job("j", data=frozenset({"sha"}))])
    assert instances(d) == {"j": {"old": ("MIG-old-0-0",)}}


def test_job_and_running_job_gpus_count_fractions() -> None:
    assert slice_job("j", nodes=2, gpus_per_node=3).gpus == pytest.approx(6 / 7)
    assert job("w", nodes=2, gpus_per_node=3).gpus == 6
    r = RunningJob("r", "p", {"a": frozenset({0, 1})}, NOW, instances={"b": frozenset({"u1", "u2"})}, fraction=3 / 7)
    assert r.gpus == pytest.approx(2 + 6 / 7)


# --- properties over random clusters of whole and sliced GPUs ----------------------------------------

# A sliced GPU's instances, by profile (layouts NVIDIA allows on an A100/H100: compute slices <= 7).
LAYOUTS = [(ONE_G,) * 7, (TWO_G,) * 3, (THREE_G,) * 2, (ONE_G, ONE_G, TWO_G, THREE_G)]

Scenario = tuple[list[NodeView], list[RunningJob], list[JobRequest], dict[str, ProjectLimits], Policy]


@st.composite
def mig_scenarios(draw: st.DrawFn) -> tuple[Scenario, dict[str, set[int]]]:
    """A cluster whose nodes each have some whole and some sliced GPUs (which indexes is random), running
    whole and slice jobs (holding some things the stale views still call free), and a mixed queue. Also
    returns each node's sliced GPU indexes."""
    nodes: list[NodeView] = []
    running: list[RunningJob] = []
    sliced_gpus: dict[str, set[int]] = {}
    for i in range(draw(st.integers(1, 6))):
        name = f"n{i}"
        total = draw(st.sampled_from([1, 2, 4, 8]))
        sliced = frozenset(g for g in range(total) if draw(st.booleans()))
        whole = sorted(set(range(total)) - sliced)
        sliced_gpus[name] = set(sliced)
        by_profile: dict[str, list[str]] = {}
        for gpu in sorted(sliced):
            for k, kind in enumerate(draw(st.sampled_from(LAYOUTS))):
                by_profile.setdefault(kind, []).append(f"MIG-{name}-{gpu}-{k}")
        free_slices = {
            p: tuple(sorted(draw(st.frozensets(st.sampled_from(us))) if us else ())) for p, us in by_profile.items()
        }
        nodes.append(
            NodeView(
                name=name,
                gpu_count=len(whole),
                gpus=draw(st.frozensets(st.sampled_from(whole))) if whole else frozenset(),
                cpus_free=draw(st.integers(0, 16)),
                cpus=16,
                schedulable=draw(st.booleans()) or draw(st.booleans()),
                category=draw(st.sampled_from([None, "a", "b"])),
                topology=draw(st.sampled_from([None, "s1", "s2"])),
                slices=free_slices,
                slice_capacity={p: len(us) for p, us in by_profile.items()},
            )
        )
        # Running jobs: one holding some whole GPUs, and per profile one holding some instances; each
        # may hold what the (stale) view still calls free. Running jobs never share anything.
        held = draw(st.frozensets(st.sampled_from(whole))) if whole else frozenset()
        if held:
            running.append(
                RunningJob(
                    f"r{i}", draw(st.sampled_from(["p", "q", "r"])), {name: held}, NOW + draw(st.integers(-10, 5000))
                )
            )
        for p, us in sorted(by_profile.items()):
            taken = draw(st.frozensets(st.sampled_from(us)))
            if taken:
                running.append(
                    RunningJob(
                        f"r{i}-{p}",
                        draw(st.sampled_from(["p", "q", "r"])),
                        draw(st.sampled_from([{}, {name: frozenset()}])),
                        NOW + draw(st.integers(-10, 5000)),
                        instances={name: taken},
                        fraction=FRACTION[p],
                    )
                )
    projects = {
        p: ProjectLimits(
            max_gpus=draw(st.none() | st.integers(0, 12)),
            gpu_hours_left=draw(st.none() | st.floats(0, 50)),
            usage=draw(st.floats(0, 1e6)),
            share=draw(st.floats(0, 4)),
        )
        for p in ("p", "q", "r")
    }
    queue: list[JobRequest] = []
    for k in range(draw(st.integers(0, 25))):
        profile = draw(st.sampled_from([None, None, None, ONE_G, ONE_G, ONE_G, TWO_G, THREE_G, "7g.141gb"]))
        queue.append(
            JobRequest(
                id=f"j{k}",
                project=draw(st.sampled_from(["p", "q", "r", "s"])),
                nodes=draw(st.sampled_from([1, 1, 2])),
                gpus_per_node=draw(st.integers(0, 4) if profile is None else st.sampled_from([1, 1, 1, 1, 2, 2, 3, 8])),
                cpus_per_node=draw(st.integers(0, 6)),
                time_limit_s=draw(st.sampled_from([60.0, 600.0, 3600.0, 36_000.0])),
                priority=draw(st.integers(0, 3)),
                submitted_at=float(draw(st.integers(0, 100))),
                category=draw(st.sampled_from([None, None, "a", "b"])),
                profile=profile,
                fraction=1.0 if profile is None else FRACTION.get(profile, 1.0),
            )
        )
    policy = Policy(
        placement={"a": draw(st.sampled_from(["pack", "spread"])), "b": draw(st.sampled_from(["pack", "spread"]))},
        default=draw(st.sampled_from(["pack", "spread"])),
        backfill=draw(st.booleans()),
    )
    return (nodes, running, queue, projects, policy), sliced_gpus


def _check_placement(
    p: Placement,
    j: JobRequest,
    view: NodeView,
    sliced: set[int],
    given_gpus: set[tuple[str, int]],
    given_instances: set[str],
) -> None:
    """One placement on one node: whole GPUs that are free, not sliced and not given; or free instances
    of the job's profile, not given."""
    name = view.name
    gpus = p.allocation[name]
    if j.profile is None:
        assert p.instances == {}
        assert len(gpus) == len(set(gpus)) == j.gpus_per_node
        for g in gpus:
            # (b) A whole-GPU placement never names a sliced GPU, nor a GPU already given.
            assert g not in sliced
            assert g in view.gpus
            assert (name, g) not in given_gpus
            given_gpus.add((name, g))
    else:
        assert gpus == ()
        assert p.instances.keys() == p.allocation.keys()
        got = p.instances[name]
        assert len(got) == len(set(got)) == j.gpus_per_node
        for u in got:
            assert u in view.slices[j.profile]  # free, of its profile, on that node
            assert u not in given_instances
            given_instances.add(u)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mig_scenarios())
def test_mig_invariants(case: tuple[Scenario, dict[str, set[int]]]) -> None:
    (nodes, running, queue, projects, policy), sliced_gpus = case
    d = schedule(nodes, running, queue, projects, NOW, policy)
    by_name = {n.name: n for n in nodes}
    jobs = {j.id: j for j in queue}

    # (c) Every queued job gets exactly one verdict.
    assert {p.job_id for p in d.placements}.isdisjoint(d.pending)
    assert {p.job_id for p in d.placements} | set(d.pending) == set(jobs)

    # (a) No MIG instance is held by two jobs, running or placed now (checked placement by placement).
    held_instances = [u for r in running for us in r.instances.values() for u in us]
    assert len(held_instances) == len(set(held_instances))
    given_instances = set(held_instances)
    given_gpus = {(n, g) for r in running for n, gs in r.allocation.items() for g in gs}
    cpus_used: Counter[str] = Counter()
    in_use: defaultdict[str, float] = defaultdict(float)
    for r in running:  # counted here from the inputs, not with the `gpus` properties under test
        in_use[r.project] += sum(len(g) for g in r.allocation.values())
        in_use[r.project] += sum(len(u) for u in r.instances.values()) * r.fraction
    for p in d.placements:
        j = jobs[p.job_id]
        assert len(p.allocation) == j.nodes
        for name in p.allocation:
            view = by_name[name]
            assert view.schedulable
            assert j.category in (None, view.category)
            cpus_used[name] += j.cpus_per_node
            _check_placement(p, j, view, sliced_gpus[name], given_gpus, given_instances)
        in_use[j.project] += j.nodes * j.gpus_per_node * j.fraction
    for name, used in cpus_used.items():
        assert used <= by_name[name].cpus_free
    # (d) Quotas hold, fractions counted (a project already over before the pass placed nothing).
    for project, total in in_use.items():
        lim = projects.get(project)
        if (
            lim is not None
            and lim.max_gpus is not None
            and any(jobs[p.job_id].project == project for p in d.placements)
        ):
            assert total <= lim.max_gpus + 1e-9
    # Slice jobs never reserve; unschedulable means too few nodes could ever hold one of its ranks.
    if d.reservation is not None:
        assert jobs[d.reservation.job_id].profile is None
        assert d.pending[d.reservation.job_id] == PendingReason.RESOURCES
    for j in queue:
        able = [
            n
            for n in nodes
            if n.schedulable
            and j.category in (None, n.category)
            and max(n.cpus, n.cpus_free) >= j.cpus_per_node
            and (
                n.gpu_count >= j.gpus_per_node
                if j.profile is None
                else j.gpus_per_node >= 1 and n.slice_capacity.get(j.profile, 0) >= j.gpus_per_node
            )
        ]
        assert (d.pending.get(j.id) == PendingReason.UNSCHEDULABLE) == (len(able) < j.nodes), j


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mig_scenarios())
def test_slice_placements_never_delay_the_reservation(case: tuple[Scenario, dict[str, set[int]]]) -> None:
    """At the reservation's start, with every job ending at its limit, the top job fits on its nodes:
    the slice jobs placed on a reserved node took none of the CPUs it counts on."""
    (nodes, running, queue, projects, policy), _ = case
    d = schedule(nodes, running, queue, projects, NOW, policy)
    if d.reservation is None:
        return
    jobs = {j.id: j for j in queue}
    top = jobs[d.reservation.job_id]
    t = d.reservation.start_at
    for name in d.reservation.nodes:
        view = next(n for n in nodes if n.name == name)
        free = set(view.gpus)
        cpus = view.cpus_free
        for r in running:
            held = r.allocation.get(name, frozenset())
            free = free | held if r.ends_by <= t else free - held
        for p in d.placements:
            j = jobs[p.job_id]
            if name in p.allocation and NOW + j.time_limit_s > t:
                free -= set(p.allocation[name])
                cpus -= j.cpus_per_node
        assert len(free) >= top.gpus_per_node
        assert cpus >= top.cpus_per_node
