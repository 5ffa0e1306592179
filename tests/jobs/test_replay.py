"""Trace replay: exact outcomes on hand-made traces, invariants on random ones, the real slices, the CLI."""

from __future__ import annotations

import itertools
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.core.errors import InvalidInput
from gpufleet.entry import main
from gpufleet.jobs.replay import (
    JobOutcome,
    ReplayOptions,
    ReplayResult,
    format_seconds,
    percentile,
    replay,
    replay_file,
)
from gpufleet.jobs.traces import TraceJob, TraceNode, homogeneous, read_trace
from tests.conftest import FIXTURES

TRACES = FIXTURES / "traces"
PODS = TRACES / "openb_pod_list_default-rows7000-7199.csv"
NODES = TRACES / "openb_node_list_gpu_node-first100.csv"
PHILLY = TRACES / "philly_runtime-every400th.csv"


def job(id: str, arrival: float, gpus: int, runtime: float, **kw: object) -> TraceJob:
    return TraceJob(id=id, arrival=arrival, runtime=runtime, gpus_per_node=gpus, **kw)  # type: ignore[arg-type]


def times(result: ReplayResult) -> dict[str, tuple[float | None, float | None]]:
    return {o.id: (o.start, o.end) for o in result.outcomes}


def jct(result: ReplayResult) -> dict[str, float]:
    return {o.id: o.end - o.arrival for o in result.outcomes if o.end is not None}


# A 4-GPU node: A holds half of it, B wants all of it, C (short) fits in the other half.
BACKFILL_CASE = [job("a", 0, 2, 10), job("b", 1, 4, 10), job("c", 2, 2, 5)]


def test_fifo_runs_jobs_in_arrival_order_with_exact_times() -> None:
    jobs = [job("a", 0, 4, 10), job("b", 1, 2, 5), job("c", 2, 1, 3), job("d", 3, 2, 1)]
    result = replay(jobs, homogeneous(1, 4), "fifo")
    # b and c start together once a ends; d (2 GPUs) is one GPU short until c ends.
    assert times(result) == {"a": (0, 10), "b": (10, 15), "c": (10, 13), "d": (13, 14)}
    assert jct(result) == {"a": 10, "b": 14, "c": 11, "d": 11}
    assert result.mean_jct_s == 11.5
    assert result.mean_wait_s == (0 + 9 + 8 + 10) / 4
    assert result.p99_jct_s == 14
    assert result.p99_wait_s == 10
    assert (result.completed, result.unschedulable, result.never_started) == (4, 0, 0)
    assert result.makespan_s == 15
    assert result.allocation_rate == pytest.approx((4 * 10 + 2 * 5 + 1 * 3 + 2 * 1) / (4 * 15))


def test_fifo_never_lets_a_later_job_pass_a_waiting_one() -> None:
    result = replay(BACKFILL_CASE, homogeneous(1, 4), "fifo")
    assert times(result) == {"a": (0, 10), "b": (10, 20), "c": (20, 25)}
    # 1-2 s: B waits and the 2 free GPUs are too few for it (fragmented); 2-10 s: C could use them.
    assert result.idle_while_waiting == pytest.approx((2 * 1 + 2 * 8) / (4 * 25))
    assert result.fragmentation == pytest.approx(2 / 18)


def test_backfill_starts_a_short_job_that_ends_before_the_reservation() -> None:
    fifo = replay(BACKFILL_CASE, homogeneous(1, 4), "fifo")
    result = replay(BACKFILL_CASE, homogeneous(1, 4), "gpufleet")
    assert times(result) == {"a": (0, 10), "b": (10, 20), "c": (2, 7)}  # b starts no later than under FIFO
    assert result.mean_jct_s == pytest.approx((10 + 19 + 5) / 3)
    assert result.mean_jct_s < fifo.mean_jct_s == pytest.approx((10 + 19 + 23) / 3)
    assert result.idle_while_waiting == pytest.approx((2 * 1 + 2 * 3) / (4 * 20))
    assert result.fragmentation == 1.0  # with backfill, what stays free while B waits is too small for it
    # A C of 9 s would end after B's reservation (A's limit, 10 s): it waits. With limits of 3 x the
    # runtime the reservation moves to 30 s and C (limit 27 s) fits before it, so it starts at once,
    # and B, promised 30 s, starts at 11 s, when C really ends: later than with exact limits.
    longer = [*BACKFILL_CASE[:2], job("c", 2, 2, 9)]
    assert times(replay(longer, homogeneous(1, 4), "gpufleet")) == {"a": (0, 10), "b": (10, 20), "c": (20, 29)}
    padded = replay(longer, homogeneous(1, 4), "gpufleet", ReplayOptions(time_limit_factor=3))
    assert times(padded) == {"a": (0, 10), "b": (11, 21), "c": (2, 11)}


def test_figures_on_a_fragmented_cluster() -> None:
    # Two 2-GPU nodes. Pack puts a and b on one node, c on the other; d (2 GPUs) waits 1-10 s with
    # one GPU free on a node where it cannot fit.
    jobs = [job("a", 0, 1, 10), job("b", 0, 1, 20), job("c", 0, 1, 10), job("d", 1, 2, 5)]
    result = replay(jobs, homogeneous(2, 2), "fifo")
    assert {k: v[0] for k, v in times(result).items()} == {"a": 0, "b": 0, "c": 0, "d": 10}
    nodes_of = {o.id: set(o.allocation) for o in result.outcomes}
    assert nodes_of["a"] == nodes_of["b"] != nodes_of["c"]
    assert result.makespan_s == 20
    assert result.allocation_rate == pytest.approx(50 / 80)
    assert result.idle_while_waiting == pytest.approx(9 / 80)
    assert result.fragmentation == 1.0
    assert result.free_on_partial_nodes == pytest.approx(20 / 30)
    assert replay(jobs, homogeneous(2, 2), "gpufleet").as_dict() | {"wall_s": 0, "schedule_s": 0} == (
        result.as_dict() | {"policy": "gpufleet", "wall_s": 0, "schedule_s": 0}
    )


def test_jobs_that_fit_no_node_are_unschedulable_and_the_rest_run() -> None:
    jobs = [job("big", 0, 8, 10), job("gang", 0, 4, 10, nodes=3), job("ok", 1, 4, 10, nodes=2)]
    for policy in ("fifo", "gpufleet"):
        result = replay(jobs, homogeneous(2, 4), policy)
        assert (result.jobs, result.completed, result.unschedulable, result.never_started) == (3, 1, 2, 0)
        assert {o.id for o in result.outcomes if o.unschedulable} == {"big", "gang"}
        assert times(result)["ok"] == (1, 11)
        ok = next(o for o in result.outcomes if o.id == "ok")
        assert ok.allocation == {"node0000": (0, 1, 2, 3), "node0001": (0, 1, 2, 3)}


def test_gpufleet_orders_by_priority_then_fair_share_fifo_by_arrival() -> None:
    one = homogeneous(1, 1)
    # x0 holds the GPU for 100 s, so project x has used it; x1 (earlier) and y1 then wait for it.
    jobs = [
        job("x0", 0, 1, 100, project="x"),
        job("x1", 1, 1, 10, project="x"),
        job("y1", 2, 1, 10, project="y"),
    ]
    assert times(replay(jobs, one, "fifo"))["x1"] == (100, 110)
    assert times(replay(jobs, one, "gpufleet"))["y1"] == (100, 110)  # y has no usage: it goes first
    # A higher priority passes both, under gpufleet only.
    urgent = [*jobs, job("z", 3, 1, 10, project="x", priority=1)]
    assert times(replay(urgent, one, "gpufleet"))["z"] == (100, 110)
    assert times(replay(urgent, one, "fifo"))["z"] == (120, 130)


def test_zero_runtime_and_simultaneous_events() -> None:
    jobs = [job("a", 0, 1, 0), job("b", 0, 1, 5), job("c", 5, 1, 0), job("d", 5, 1, 1)]
    result = replay(jobs, homogeneous(1, 1), "fifo")
    assert times(result) == {"a": (0, 0), "b": (0, 5), "c": (5, 5), "d": (5, 6)}


def test_bad_input() -> None:
    with pytest.raises(InvalidInput, match="unknown policy"):
        replay([], homogeneous(1, 1), "sjf")  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="at least 1"):
        replay([], homogeneous(1, 1), "fifo", ReplayOptions(time_limit_factor=0.5))
    with pytest.raises(InvalidInput, match="share an id"):
        replay([job("a", 0, 1, 1), job("a", 1, 1, 1)], homogeneous(1, 1), "fifo")
    with pytest.raises(InvalidInput, match="both must be >= 1"):
        replay([job("a", 0, 0, 1)], homogeneous(1, 1), "fifo")
    with pytest.raises(InvalidInput, match="no nodes"):
        replay([job("a", 0, 1, 1)], [], "fifo")
    with pytest.raises(InvalidInput, match="share a name"):
        replay([], [TraceNode("n", 1), TraceNode("n", 2)], "fifo")
    empty = replay([], homogeneous(1, 1), "gpufleet")
    assert (empty.jobs, empty.makespan_s, empty.mean_jct_s, empty.allocation_rate) == (0, 0, 0, 0)


def test_helpers() -> None:
    assert percentile([], 99) == 0.0
    assert percentile([1.0], 99) == 1.0
    assert percentile([float(i) for i in range(1, 101)], 99) == 99.0
    assert percentile([float(i) for i in range(1, 201)], 99) == 198.0
    assert [format_seconds(s) for s in (5, 90, 5400, 200_000)] == ["5s", "1.5m", "1.5h", "2.3d"]


# --- invariants over random traces -------------------------------------------------------------------

CLUSTERS = [homogeneous(3, 4), [TraceNode("a", 8), TraceNode("b", 2), TraceNode("c", 4), TraceNode("d", 1)]]


@st.composite
def traces(draw: st.DrawFn) -> list[TraceJob]:
    count = draw(st.integers(0, 25))
    return [
        TraceJob(
            id=f"j{i:02}",
            arrival=float(draw(st.integers(0, 40))),
            runtime=float(draw(st.integers(0, 30))),
            gpus_per_node=draw(st.sampled_from([1, 1, 1, 2, 4, 8, 9])),
            nodes=draw(st.sampled_from([1, 1, 1, 1, 2])),
            project=draw(st.sampled_from(["p", "q"])),
            priority=draw(st.sampled_from([0, 0, 1])),
        )
        for i in range(count)
    ]


def check_invariants(jobs: Sequence[TraceJob], nodes: Sequence[TraceNode], result: ReplayResult) -> None:
    by_id = {j.id: j for j in jobs}
    caps = {n.name: n.gpus for n in nodes}
    assert result.jobs == len(jobs) == len(result.outcomes)
    assert result.never_started == 0
    assert result.completed + result.unschedulable == len(jobs)
    held: list[tuple[float, float, str, int]] = []
    for o in result.outcomes:
        j = by_id[o.id]
        if o.unschedulable:
            assert o.start is None
            assert not o.allocation
            assert j.gpus_per_node > max(caps.values()) or sum(g >= j.gpus_per_node for g in caps.values()) < j.nodes
            continue
        assert o.start is not None
        assert o.end is not None
        assert o.start >= o.arrival
        assert o.end == o.start + j.runtime
        assert len(o.allocation) == j.nodes
        for name, gpus in o.allocation.items():
            assert len(gpus) == j.gpus_per_node
            assert all(0 <= g < caps[name] for g in gpus)
            held.extend((o.start, o.end, name, g) for g in gpus)
    # No GPU held by two jobs at once (zero-length holds overlap nothing).
    by_gpu: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for start, end, name, g in held:
        by_gpu.setdefault((name, g), []).append((start, end))
    for spans in by_gpu.values():
        spans.sort()
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert start >= end
    # Never more GPUs allocated than exist, at any event time.
    for t in {s for s, _, _, _ in held}:
        assert sum(1 for s, e, _, _ in held if s <= t < e) <= sum(caps.values())
    for figure in (result.allocation_rate, result.idle_while_waiting, result.fragmentation):
        assert 0.0 <= figure <= 1.0 + 1e-9


def same(a: ReplayResult, b: ReplayResult) -> bool:
    return a.outcomes == b.outcomes and a.as_dict() | {"wall_s": 0, "schedule_s": 0, "passes": 0} == (
        b.as_dict() | {"wall_s": 0, "schedule_s": 0, "passes": 0}
    )


@settings(max_examples=60, deadline=None)
@given(jobs=traces(), which=st.integers(0, 1))
def test_invariants_and_exact_shortcuts(jobs: list[TraceJob], which: int) -> None:
    nodes = CLUSTERS[which]
    for policy in ("fifo", "gpufleet"):
        result = replay(jobs, nodes, policy)
        check_invariants(jobs, nodes, result)
        # The light passes are exact: the same decisions with and without them.
        heavy = replay(jobs, nodes, policy, ReplayOptions(light_passes=False))
        assert same(result, heavy)
    fifo = replay(jobs, nodes, "fifo")
    ran = sorted((o.arrival, o.id, o.start) for o in fifo.outcomes if o.start is not None)
    starts = [start for _, _, start in ran]
    assert starts == sorted(starts)  # strict FIFO: nobody starts before a job that arrived earlier
    # FIFO's chunks are exact (on the whole node list, where the pruning cannot change a tie).
    whole = ReplayOptions(prune=False, fifo_chunk=10_000)
    assert same(
        replay(jobs, nodes, "fifo", ReplayOptions(prune=False, fifo_chunk=1)), replay(jobs, nodes, "fifo", whole)
    )


@settings(max_examples=40, deadline=None)
@given(jobs=traces())
def test_pruning_changes_nothing_for_one_gpu_jobs(jobs: list[TraceJob]) -> None:
    # With only 1-GPU jobs on equal nodes every free GPU is as good as another: start and end times agree.
    ones = [TraceJob(j.id, j.arrival, j.runtime, 1, 1, j.project, j.priority) for j in jobs]
    nodes = homogeneous(3, 4)
    for policy in ("fifo", "gpufleet"):
        pruned = replay(ones, nodes, policy)
        full = replay(ones, nodes, policy, ReplayOptions(prune=False))
        assert times(pruned) == times(full)
        assert pruned.mean_jct_s == full.mean_jct_s


# --- the real slices -----------------------------------------------------------------------------------


def test_openb_slice_on_its_node_list_and_on_a_small_cluster() -> None:
    report = replay_file(PODS, nodes_file=NODES)
    assert (report.format, report.jobs, report.rows) == ("openb", 140, 200)
    assert "100 nodes from" in report.cluster
    for result in report.results:
        assert (result.completed, result.mean_wait_s) == (140, 0)  # 100 nodes: nobody waits
    trace = read_trace(PODS, cluster_gpus=8)
    small = homogeneous(2, 4)
    results = {p: replay(trace.jobs, small, p) for p in ("fifo", "gpufleet")}
    for result in results.values():
        check_invariants(trace.jobs, small, result)
        assert result.completed == 140
        assert result.mean_wait_s > 0
    assert results["gpufleet"].mean_wait_s < results["fifo"].mean_wait_s


def test_philly_slice_needs_a_cluster_and_is_reproducible() -> None:
    with pytest.raises(InvalidInput, match="no nodes"):
        replay_file(PHILLY)
    a = replay_file(PHILLY, nodes=2, gpus_per_node=4, load=0.9, seed=3)
    b = replay_file(PHILLY, nodes=2, gpus_per_node=4, load=0.9, seed=3)
    assert [same(x, y) for x, y in zip(a.results, b.results, strict=True)] == [True, True]
    assert any("Poisson" in n for n in a.notes)
    assert any("assumed" in n for n in a.notes)
    for result in a.results:
        assert result.unschedulable > 0  # 8-GPU jobs on 4-GPU nodes
        assert result.completed + result.unschedulable == 208


# --- the command ---------------------------------------------------------------------------------------


def gpufleet(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["gpufleet", *args])
    monkeypatch.setenv("COLUMNS", "200")
    code = 0
    try:
        main()
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_table_json_and_errors(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, err = gpufleet(monkeypatch, capsys, "sim", "replay", str(PODS), "--nodes-file", str(NODES))
    assert code == 0, err
    for text in ("fifo", "gpufleet", "mean JCT", "30 CPU-only pod(s) skipped"):
        assert text in out

    code, out, err = gpufleet(
        monkeypatch, capsys, "sim", "replay", str(PHILLY), "--nodes", "2", "--gpus-per-node", "8", "--policy", "fifo",
        "--limit", "50", "-o", "json",
    )  # fmt: skip
    assert code == 0, err
    data = json.loads(out)
    assert (data["format"], data["jobs"]) == ("philly", 50)
    assert [r["policy"] for r in data["results"]] == ["fifo"]
    assert data["results"][0]["completed"] == 50
    assert set(data["results"][0]) >= {"mean_jct_s", "p99_jct_s", "mean_wait_s", "p99_wait_s", "allocation_rate"}

    # The node list beside the trace is found by its name.
    (tmp_path / "openb_node_list_gpu_node.csv").write_text(NODES.read_text())
    (tmp_path / "pods.csv").write_text(PODS.read_text())
    code, out, err = gpufleet(monkeypatch, capsys, "sim", "replay", str(tmp_path / "pods.csv"), "-o", "json")
    assert code == 0, err
    assert json.loads(out)["cluster"].startswith("100 nodes from")

    (tmp_path / "bad.csv").write_text(
        PODS.read_text().replace("openb-pod-7001,18708,64512,1,", "openb-pod-7001,18708,64512,one,")
    )
    for args, message in [
        ([str(PHILLY)], "has runtimes only, no nodes"),
        ([str(NODES)], "is an openb node list"),
        ([str(tmp_path / "missing.csv"), "--nodes", "1", "--gpus-per-node", "1"], "cannot read"),
        ([str(tmp_path / "bad.csv"), "--nodes", "1", "--gpus-per-node", "1"], "bad.csv, line 3: num_gpu 'one'"),
    ]:
        code, out, err = gpufleet(monkeypatch, capsys, "sim", "replay", *args)
        assert code == 2
        assert err.startswith("gpufleet: error: ")
        assert message in err
        assert len(err.strip().splitlines()) == 1
        assert "Traceback" not in err


def test_outcome_type_is_plain_data() -> None:
    outcome = JobOutcome("a", 0.0, 1, 0.0, 1.0, {"n": (0,)})
    assert not outcome.unschedulable
