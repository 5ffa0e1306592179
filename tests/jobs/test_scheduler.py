"""The built-in scheduler as a pure function: examples of each rule, then invariants over random input."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.jobs.scheduler import (
    Decisions,
    JobRequest,
    NodeView,
    PendingReason,
    Policy,
    ProjectLimits,
    RunningJob,
    decay,
    node_schedulable,
    schedule,
)
from gpufleet.protocol.cuda import parse_driver

NOW = 1_000_000.0
ALL8 = frozenset(range(8))


def node(name: str, free: frozenset[int] = ALL8, **kw: object) -> NodeView:
    return NodeView(name=name, gpu_count=8, gpus=free, cpus_free=64, mem_free_mib=512_000, **kw)  # type: ignore[arg-type]


def job(id: str, project: str = "p", **kw: object) -> JobRequest:
    kw.setdefault("submitted_at", NOW - 100)
    return JobRequest(id=id, project=project, **kw)  # type: ignore[arg-type]


def run(
    nodes: list[NodeView], queue: list[JobRequest], running: list[RunningJob] | None = None, **kw: object
) -> Decisions:
    projects = kw.pop("projects", {})
    return schedule(nodes, running or [], queue, projects, NOW, **kw)  # type: ignore[arg-type]


def placed(d: Decisions) -> dict[str, dict[str, tuple[int, ...]]]:
    return {p.job_id: p.allocation for p in d.placements}


def test_gang_job_gets_both_nodes_or_none() -> None:
    d = run([node("a"), node("b")], [job("g", nodes=2, gpus_per_node=8)])
    assert placed(d) == {"g": {"a": tuple(range(8)), "b": tuple(range(8))}}

    half = frozenset(range(4))
    d = run([node("a"), node("b", half)], [job("g", nodes=2, gpus_per_node=8)])
    assert d.placements == []
    assert d.pending == {"g": PendingReason.RESOURCES}


def test_one_gpu_jobs_fill_the_cluster_and_the_rest_wait() -> None:
    d = run([node("a"), node("b")], [job(f"j{i:02}") for i in range(20)])
    assert len(d.placements) == 16
    assert Counter(n for p in d.placements for n in p.allocation) == {"a": 8, "b": 8}
    assert set(d.pending.values()) == {PendingReason.RESOURCES}


def test_down_drained_or_unhealthy_nodes_are_never_used() -> None:
    assert node_schedulable("up", "healthy", drained=False)
    assert node_schedulable("up", "degraded", drained=False)
    assert not node_schedulable("down", "healthy", drained=False)
    assert not node_schedulable("up", "healthy", drained=True)
    assert not node_schedulable("up", "failed", drained=False)
    nodes = [node("down", schedulable=False), node("ok"), node("drained", schedulable=False)]
    d = run(nodes, [job(f"j{i}", gpus_per_node=4) for i in range(4)])
    assert {n for p in d.placements for n in p.allocation} == {"ok"}
    assert len(d.placements) == 2
    # A job that only unschedulable nodes could hold is unschedulable, not merely waiting.
    d = run(nodes, [job("big", nodes=2, gpus_per_node=8)])
    assert d.pending == {"big": PendingReason.UNSCHEDULABLE}
    d = run(nodes, [job("huge", gpus_per_node=9)])
    assert d.pending == {"huge": PendingReason.UNSCHEDULABLE}


def test_quota_caps_gpus_at_once_counting_running_jobs() -> None:
    running = [RunningJob("r", "p", {"a": frozenset({0, 1})}, ends_by=NOW + 600)]
    projects = {"p": ProjectLimits(max_gpus=4)}
    d = run(
        [node("a", frozenset(range(2, 8)))],
        [job("x", gpus_per_node=2), job("y", gpus_per_node=1)],
        running,
        projects=projects,
    )
    assert placed(d).keys() == {"x"}
    assert d.pending == {"y": PendingReason.QUOTA}


def test_budget_counts_the_worst_case_of_running_and_new_jobs() -> None:
    # 1 GPU-hour left; the running job may still use 0.5 (1 GPU x 30 min), so a 1-hour job is refused
    # and a 30-minute one is allowed.
    running = [RunningJob("r", "p", {"a": frozenset({0})}, ends_by=NOW + 1800)]
    projects = {"p": ProjectLimits(gpu_hours_left=1.0)}
    q = [job("long", time_limit_s=3600), job("short", time_limit_s=1800)]
    d = run([node("a", frozenset(range(1, 8)))], q, running, projects=projects)
    assert placed(d).keys() == {"short"}
    assert d.pending == {"long": PendingReason.BUDGET}


def test_higher_priority_goes_first() -> None:
    q = [job("low", gpus_per_node=8, priority=1), job("high", gpus_per_node=8, priority=5)]
    d = run([node("a")], q)
    assert placed(d).keys() == {"high"}
    assert d.pending == {"low": PendingReason.RESOURCES}


def test_fair_share_favours_the_project_that_used_less_per_share() -> None:
    projects = {"heavy": ProjectLimits(usage=1000.0, share=1.0), "light": ProjectLimits(usage=1000.0, share=4.0)}
    q = [job("h", "heavy", gpus_per_node=8, submitted_at=0.0), job("l", "light", gpus_per_node=8)]
    d = run([node("a")], q, projects=projects)
    assert placed(d).keys() == {"l"}


def test_decay_halves_usage_every_half_life() -> None:
    assert decay(100.0, 3600.0, 3600.0) == 50.0
    assert decay(100.0, 7200.0, 3600.0) == 25.0
    assert decay(100.0, 0.0, 3600.0) == 100.0
    assert decay(100.0, 10.0, 0.0) == 0.0


def _backfill_case(time_limit_s: float, backfill: bool = True) -> Decisions:
    # Node a: 4 GPUs held until NOW+1000. The top job needs all 8 of a node: its reservation is a at
    # NOW+1000. 4 GPUs of a are free now: a 1-GPU job may use them only if it ends by then.
    running = [RunningJob("r", "q", {"a": frozenset(range(4))}, ends_by=NOW + 1000)]
    q = [job("top", gpus_per_node=8, priority=9), job("small", gpus_per_node=1, time_limit_s=time_limit_s)]
    return run([node("a", frozenset(range(4, 8)))], q, running, policy=Policy(backfill=backfill))


def test_backfill_runs_a_short_job_that_ends_before_the_reservation() -> None:
    d = _backfill_case(time_limit_s=900)
    assert d.reservation is not None
    assert (d.reservation.job_id, d.reservation.start_at, d.reservation.nodes) == ("top", NOW + 1000, ("a",))
    assert placed(d).keys() == {"small"}
    assert d.pending == {"top": PendingReason.RESOURCES}


def test_backfill_never_delays_the_top_pending_job() -> None:
    d = _backfill_case(time_limit_s=1200)
    assert d.placements == []
    assert d.pending == {"top": PendingReason.RESOURCES, "small": PendingReason.PRIORITY}
    # Without backfill even the short one waits behind the top job.
    d = _backfill_case(time_limit_s=900, backfill=False)
    assert d.placements == []
    assert d.pending["small"] == PendingReason.PRIORITY


def test_backfill_uses_nodes_outside_the_reservation_freely() -> None:
    running = [RunningJob("r", "q", {"a": frozenset(range(4))}, ends_by=NOW + 1000)]
    q = [job("top", gpus_per_node=8, priority=9), job("long", gpus_per_node=4, time_limit_s=99_999)]
    d = run([node("a", frozenset(range(4, 8))), node("b", frozenset(range(4)))], q, running)
    assert placed(d) == {"long": {"b": (0, 1, 2, 3)}}


def test_multi_gpu_job_stays_on_one_node_with_contiguous_gpus() -> None:
    d = run([node("a", frozenset({0, 2, 3, 4, 5, 7})), node("b", frozenset({1, 6}))], [job("j", gpus_per_node=4)])
    assert placed(d) == {"j": {"a": (2, 3, 4, 5)}}


def test_multi_node_job_prefers_one_switch() -> None:
    nodes = [
        node("a1", topology="sw-a"),
        node("b1", topology="sw-b"),
        node("a2", topology="sw-a"),
        node("b2", topology="sw-b"),
        node("b3", topology="sw-b"),
    ]
    d = run(nodes, [job("g", nodes=3, gpus_per_node=8)])
    assert set(placed(d)["g"]) == {"b1", "b2", "b3"}
    d = run(nodes, [job("g", nodes=2, gpus_per_node=8)])  # pack: the tightest switch that holds it
    assert set(placed(d)["g"]) == {"a1", "a2"}
    d = run(nodes, [job("g", nodes=4, gpus_per_node=8)])  # spans as few switches as it can
    assert set(placed(d)["g"]) >= {"b1", "b2", "b3"}


def test_pack_fills_a_node_spread_balances() -> None:
    nodes = [node("a", category="c"), node("b", category="c")]
    q = [job("j1"), job("j2")]
    packed = run(nodes, q, policy=Policy(placement={"c": "pack"}))
    assert len({n for p in packed.placements for n in p.allocation}) == 1
    spread = run(nodes, q, policy=Policy(placement={"c": "spread"}))
    assert {n for p in spread.placements for n in p.allocation} == {"a", "b"}


def test_category_constraint_and_gpus_held_by_running_jobs() -> None:
    # The node view says all 8 are free, but a running job holds 0-5: only 6 and 7 may be given.
    running = [RunningJob("r", "q", {"a": frozenset(range(6))}, ends_by=NOW + 10)]
    nodes = [node("a", category="gpu"), node("b", category="cpu")]
    d = run(nodes, [job("j", gpus_per_node=2, category="gpu"), job("k", category="gpu")], running)
    assert placed(d) == {"j": {"a": (6, 7)}}
    assert d.pending == {"k": PendingReason.RESOURCES}


# --- properties over random clusters, running jobs and queues ----------------------------------


@st.composite
def scenarios(
    draw: st.DrawFn,
) -> tuple[list[NodeView], list[RunningJob], list[JobRequest], dict[str, ProjectLimits], Policy]:
    n_nodes = draw(st.integers(1, 8))
    nodes: list[NodeView] = []
    running: list[RunningJob] = []
    for i in range(n_nodes):
        count = draw(st.sampled_from([1, 2, 4, 8]))
        free = draw(st.frozensets(st.integers(0, count - 1)))
        nodes.append(
            NodeView(
                name=f"n{i}",
                gpu_count=count,
                gpus=free,
                cpus_free=draw(st.integers(0, 16)),
                cpus=16,
                schedulable=draw(st.booleans()) or draw(st.booleans()),
                category=draw(st.sampled_from([None, "a", "b"])),
                topology=draw(st.sampled_from([None, "s1", "s2"])),
            )
        )
        # Running jobs hold some GPUs, sometimes ones the (stale) view still calls free.
        held = draw(st.frozensets(st.integers(0, count - 1)))
        if held:
            running.append(
                RunningJob(
                    f"r{i}", draw(st.sampled_from(["p", "q", "r"])), {f"n{i}": held}, NOW + draw(st.integers(-10, 5000))
                )
            )
    projects = {
        p: ProjectLimits(
            max_gpus=draw(st.none() | st.integers(0, 24)),
            gpu_hours_left=draw(st.none() | st.floats(0, 50)),
            usage=draw(st.floats(0, 1e6)),
            share=draw(st.floats(0, 4)),
        )
        for p in ("p", "q", "r")
    }
    queue = [
        JobRequest(
            id=f"j{k}",
            project=draw(st.sampled_from(["p", "q", "r", "s"])),
            nodes=draw(st.integers(1, 3)),
            gpus_per_node=draw(st.integers(0, 9)),
            cpus_per_node=draw(st.integers(0, 8)),
            time_limit_s=draw(st.sampled_from([60.0, 600.0, 3600.0, 36_000.0])),
            priority=draw(st.integers(0, 3)),
            submitted_at=float(draw(st.integers(0, 100))),
            category=draw(st.sampled_from([None, None, "a", "b"])),
        )
        for k in range(draw(st.integers(0, 25)))
    ]
    policy = Policy(
        placement={"a": draw(st.sampled_from(["pack", "spread"])), "b": draw(st.sampled_from(["pack", "spread"]))},
        default=draw(st.sampled_from(["pack", "spread"])),
        backfill=draw(st.booleans()),
    )
    return nodes, running, queue, projects, policy


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_invariants(
    case: tuple[list[NodeView], list[RunningJob], list[JobRequest], dict[str, ProjectLimits], Policy],
) -> None:
    nodes, running, queue, projects, policy = case
    d = schedule(nodes, running, queue, projects, NOW, policy)
    by_name = {n.name: n for n in nodes}
    jobs = {j.id: j for j in queue}

    # Every queued job gets exactly one verdict.
    assert {p.job_id for p in d.placements}.isdisjoint(d.pending)
    assert {p.job_id for p in d.placements} | set(d.pending) == set(jobs)

    given_out: set[tuple[str, int]] = {(n, g) for r in running for n, gs in r.allocation.items() for g in gs}
    cpus_used: Counter[str] = Counter()
    in_use: Counter[str] = Counter()
    for r in running:
        in_use[r.project] += int(r.gpus)  # whole GPUs only here: no fractions
    for p in d.placements:
        j = jobs[p.job_id]
        # Gang: exactly `nodes` distinct nodes, each with exactly gpus_per_node GPUs.
        assert len(p.allocation) == j.nodes
        for name, gpus in p.allocation.items():
            view = by_name[name]
            assert view.schedulable
            assert j.category in (None, view.category)
            assert len(gpus) == len(set(gpus)) == j.gpus_per_node
            for g in gpus:
                # Never a GPU already given (to a running job or earlier in this pass), never one not free.
                assert (name, g) not in given_out
                assert g in view.gpus
                given_out.add((name, g))
            cpus_used[name] += j.cpus_per_node
        in_use[j.project] += int(j.gpus)
    for name, used in cpus_used.items():
        assert used <= by_name[name].cpus_free
    for project, used in in_use.items():
        lim = projects.get(project)
        if (
            lim is not None
            and lim.max_gpus is not None
            and any(jobs[p.job_id].project == project for p in d.placements)
        ):
            assert used <= lim.max_gpus
    if d.reservation is not None:
        assert d.pending[d.reservation.job_id] == PendingReason.RESOURCES
        assert len(d.reservation.nodes) == jobs[d.reservation.job_id].nodes


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_nothing_placed_delays_the_reservation(
    case: tuple[list[NodeView], list[RunningJob], list[JobRequest], dict[str, ProjectLimits], Policy],
) -> None:
    """At the reservation's start, with every job ending at its limit, the top job fits on its nodes."""
    nodes, running, queue, projects, policy = case
    d = schedule(nodes, running, queue, projects, NOW, policy)
    if d.reservation is None:
        return
    top = next(j for j in queue if j.id == d.reservation.job_id)
    jobs = {j.id: j for j in queue}
    t = d.reservation.start_at
    assert t >= NOW
    for name in d.reservation.nodes:
        view = next(n for n in nodes if n.name == name)
        assert view.schedulable
        free = {g for g in view.gpus if g < view.gpu_count}
        cpus = view.cpus_free
        for r in running:
            held = r.allocation.get(name, frozenset())
            if r.ends_by <= t:
                free |= held
            else:
                free -= held
        for p in d.placements:
            j = jobs[p.job_id]
            if name in p.allocation and NOW + j.time_limit_s > t:
                free -= set(p.allocation[name])
                cpus -= j.cpus_per_node
        assert len(free) >= top.gpus_per_node
        assert cpus >= top.cpus_per_node


def test_schedule_is_deterministic() -> None:
    nodes = [node(f"n{i}", topology=f"s{i % 3}") for i in range(12)]
    q = [job(f"j{i}", nodes=1 + i % 3, gpus_per_node=1 + i % 8, priority=i % 4) for i in range(60)]
    assert run(nodes, q) == run(nodes, q)


# --- NVIDIA drivers: a job whose environment needs a newer driver lands only where one is ---------

OLD_DRIVER = (535, 183, 1)  # runs CUDA up to 12.2
NEW_DRIVER = (550, 127, 5)
CUDA_12_4 = (550, 54, 14)  # what CUDA 12.4 needs: between the two above


def _nodes_of(d: Decisions, job_id: str) -> set[str]:
    return set(placed(d)[job_id])


def test_runs_on_compares_drivers_as_numbers() -> None:
    needs = job("j", min_driver=CUDA_12_4)
    assert needs.runs_on(NEW_DRIVER)  # 550.127.05 >= 550.54.14, though not as text
    assert needs.runs_on(CUDA_12_4)
    assert not needs.runs_on(OLD_DRIVER)
    assert not needs.runs_on((550, 54, 13))
    assert not needs.runs_on(None)
    assert job("k").runs_on(None)
    assert job("k").runs_on(OLD_DRIVER)


def test_pack_does_not_put_a_driver_job_on_the_fuller_old_driver_node() -> None:
    nodes = [node("old", frozenset(range(1, 8)), driver=OLD_DRIVER), node("new", driver=NEW_DRIVER)]
    assert _nodes_of(run(nodes, [job("j")]), "j") == {"old"}  # pack's choice without a driver to meet
    d = run(nodes, [job("j", min_driver=CUDA_12_4)])
    assert placed(d) == {"j": {"new": (0,)}}
    assert d.pending == {}


def test_spread_does_not_put_a_driver_job_on_the_emptier_old_driver_node() -> None:
    nodes = [
        node("old", category="c", driver=OLD_DRIVER),
        node("new", frozenset({6, 7}), category="c", driver=NEW_DRIVER),
    ]
    policy = Policy(placement={"c": "spread"})
    assert _nodes_of(run(nodes, [job("j")], policy=policy), "j") == {"old"}  # spread's choice
    d = run(nodes, [job("j", min_driver=CUDA_12_4)], policy=policy)
    assert placed(d) == {"j": {"new": (6,)}}


def test_a_node_with_an_unknown_driver_takes_only_jobs_that_need_none() -> None:
    nodes = [node("unknown", driver=None)]
    d = run(nodes, [job("needs", min_driver=CUDA_12_4), job("any")])
    assert d.pending == {"needs": PendingReason.UNSCHEDULABLE}
    assert placed(d) == {"any": {"unknown": (0,)}}
    assert d.reservation is None


def test_jobs_needing_a_driver_fill_only_the_compatible_node() -> None:
    nodes = [node("old", driver=OLD_DRIVER), node("new", driver=NEW_DRIVER)]
    d = run(nodes, [job(f"j{i:02}", min_driver=CUDA_12_4) for i in range(10)])
    assert Counter(n for p in d.placements for n in p.allocation) == {"new": 8}
    assert set(d.pending.values()) == {PendingReason.RESOURCES}


def test_a_gang_with_one_compatible_node_is_unschedulable() -> None:
    nodes = [node("old", driver=OLD_DRIVER), node("new", driver=NEW_DRIVER), node("unknown")]
    d = run(nodes, [job("g", nodes=2, gpus_per_node=1, min_driver=CUDA_12_4)])
    assert d.placements == []
    assert d.pending == {"g": PendingReason.UNSCHEDULABLE}
    assert d.reservation is None
    # Two compatible nodes: it runs, on exactly those.
    nodes.append(node("newer", driver=(580, 65, 6)))
    d = run(nodes, [job("g", nodes=2, gpus_per_node=1, min_driver=CUDA_12_4)])
    assert _nodes_of(d, "g") == {"new", "newer"}


def test_a_driver_job_waits_for_the_busy_compatible_node_and_reserves_only_it() -> None:
    running = [RunningJob("r", "q", {"new": ALL8}, ends_by=NOW + 500)]
    nodes = [node("old", driver=OLD_DRIVER), node("new", driver=NEW_DRIVER), node("unknown")]
    q = [job("top", gpus_per_node=8, min_driver=CUDA_12_4, priority=5), job("other", gpus_per_node=8)]
    d = run(nodes, q, running)
    assert d.pending == {"top": PendingReason.RESOURCES}  # it will fit once "new" frees up: not unschedulable
    assert d.reservation is not None
    assert (d.reservation.job_id, d.reservation.nodes, d.reservation.start_at) == ("top", ("new",), NOW + 500)
    # A job that needs no driver runs on a node the reservation does not hold.
    assert _nodes_of(d, "other") <= {"old", "unknown"}


def test_backfill_onto_a_reserved_node_still_needs_the_driver() -> None:
    # "a" (old driver) is reserved for the top job at NOW+1000; 4 of its GPUs are free until then. A
    # short job would backfill there, but one that needs a newer driver may not: it waits for "b".
    running = [
        RunningJob("r", "q", {"a": frozenset(range(4))}, ends_by=NOW + 1000),
        RunningJob("s", "q", {"b": ALL8}, ends_by=NOW + 5000),
    ]
    nodes = [node("a", frozenset(range(4, 8)), driver=OLD_DRIVER), node("b", driver=NEW_DRIVER)]
    q = [
        job("top", gpus_per_node=8, priority=9),
        job("short", time_limit_s=900, min_driver=CUDA_12_4),
        job("plain", time_limit_s=900),
    ]
    d = run(nodes, q, running)
    assert d.reservation is not None
    assert (d.reservation.job_id, d.reservation.nodes) == ("top", ("a",))
    assert d.pending["short"] == PendingReason.RESOURCES
    assert "short" not in placed(d)
    assert _nodes_of(d, "plain") == {"a"}  # the same backfill without a driver to meet does run


DRIVERS = [None, OLD_DRIVER, CUDA_12_4, NEW_DRIVER, (580, 65, 6)]
NEEDS = [None, None, (535, 54, 3), CUDA_12_4, (580, 65, 6)]


@st.composite
def driver_scenarios(
    draw: st.DrawFn,
) -> tuple[list[NodeView], list[RunningJob], list[JobRequest], dict[str, ProjectLimits], Policy]:
    nodes, running, queue, projects, policy = draw(scenarios())
    nodes = [replace(n, driver=draw(st.sampled_from(DRIVERS))) for n in nodes]
    queue = [replace(j, min_driver=draw(st.sampled_from(NEEDS))) for j in queue]
    return nodes, running, queue, projects, policy


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(driver_scenarios())
def test_drivers_are_always_met_and_unschedulable_means_no_compatible_nodes(
    case: tuple[list[NodeView], list[RunningJob], list[JobRequest], dict[str, ProjectLimits], Policy],
) -> None:
    nodes, running, queue, projects, policy = case
    d = schedule(nodes, running, queue, projects, NOW, policy)
    by_name = {n.name: n for n in nodes}
    jobs = {j.id: j for j in queue}
    assert {p.job_id for p in d.placements} | set(d.pending) == set(jobs)
    for p in d.placements:
        assert all(jobs[p.job_id].runs_on(by_name[name].driver) for name in p.allocation)
    if d.reservation is not None:
        top = jobs[d.reservation.job_id]
        assert all(top.runs_on(by_name[name].driver) for name in d.reservation.nodes)
    for j in queue:
        # Nodes that could hold one of its ranks with the cluster empty (the views' cpus are totals of 16).
        able = [
            n
            for n in nodes
            if n.schedulable
            and j.category in (None, n.category)
            and n.gpu_count >= j.gpus_per_node
            and max(n.cpus, n.cpus_free) >= j.cpus_per_node
            and j.runs_on(n.driver)
        ]
        assert (d.pending.get(j.id) == PendingReason.UNSCHEDULABLE) == (len(able) < j.nodes), j


def test_a_driver_written_with_fewer_fields_is_the_same_version() -> None:
    # NVIDIA's CUDA 12.8 driver is "570.26"; an environment that names "570.26.0" must run on it.
    assert job("j", min_driver=parse_driver("570.26.0")).runs_on(parse_driver("570.26"))
