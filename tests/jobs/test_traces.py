"""Trace parsers: slices of the real openb and Philly files (tests/fixtures/SOURCES.md), and bad input."""

from __future__ import annotations

import re
import statistics
from pathlib import Path

import pytest

from gpufleet.core.errors import InvalidInput
from gpufleet.jobs.traces import (
    PHILLY_GPU_MIX,
    detect_format,
    homogeneous,
    parse_openb_nodes,
    parse_openb_pods,
    parse_philly_runtimes,
    read_format,
    read_openb_nodes,
    read_trace,
    resolve_cluster,
    synthesise_philly,
)
from tests.conftest import FIXTURES

TRACES = FIXTURES / "traces"
PODS = TRACES / "openb_pod_list_default-rows7000-7199.csv"
NODES = TRACES / "openb_node_list_gpu_node-first100.csv"
PHILLY = TRACES / "philly_runtime-every400th.csv"
POD_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time"
)


def pods(*rows: str) -> list[str]:
    return [POD_HEADER + "\n", *(r + "\n" for r in rows)]


def test_openb_slice_skips_cpu_only_and_never_run_pods_and_rounds_shares() -> None:
    trace = read_trace(PODS, cluster_gpus=64)
    assert trace.format == "openb"
    assert trace.rows == 200
    # 30 CPU-only pods, 30 Pending GPU pods; of the 140 that ran, 81 asked for a share of one GPU.
    assert trace.counts == {"skipped_cpu_only": 30, "skipped_never_ran": 30, "rounded_shares": 81}
    assert len(trace.jobs) == 140
    assert any("81 GPU share(s)" in note for note in trace.notes)
    by_id = {j.id: j for j in trace.jobs}
    # openb-pod-7001,18708,64512,1,1000,,LS,Running,12704434,12704820,12704713
    first = by_id["openb-pod-7001"]
    assert (first.arrival, first.runtime, first.gpus_per_node, first.nodes) == (12704434, 12704820 - 12704713, 1, 1)
    assert (first.project, first.priority) == ("LS", 1)
    assert {j.gpus_per_node for j in trace.jobs} == {1, 2, 4}
    assert {j.project for j in trace.jobs} <= {"LS", "BE", "Burstable"}
    assert all(j.priority == (1 if j.project == "LS" else 0) for j in trace.jobs)
    assert [j.arrival for j in trace.jobs] == sorted(j.arrival for j in trace.jobs)
    assert "openb-pod-7000" not in by_id  # num_gpu 0


def test_openb_row_details() -> None:
    trace = parse_openb_pods(
        pods(
            "a,1000,1,1,250,,BE,Failed,10,50,20",  # a share, failed after running 30 s
            "b,1000,1,8,1000,,Guaranteed,Succeeded,5,105,",  # no scheduled_time: ran from creation
            "c,1000,1,1,1000,,LS,Pending,7,9,",  # never ran
            "d,1000,1,0,0,,LS,Running,1,2,1",  # CPU only
        ),
        "t.csv",
    )
    assert [(j.id, j.arrival, j.runtime, j.gpus_per_node, j.priority) for j in trace.jobs] == [
        ("b", 5, 100, 8, 1),
        ("a", 10, 30, 1, 0),
    ]
    assert trace.counts == {"skipped_cpu_only": 1, "skipped_never_ran": 1, "rounded_shares": 1}
    two = pods("a,1,1,1,1000,,LS,Running,1,2,1", "b,1,1,1,1000,,LS,Running,1,2,1")
    assert len(parse_openb_pods(two, "t", limit=1).jobs) == 1


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (["name,num_gpu\n", "a,1\n"], "t.csv: missing column(s) gpu_milli, qos, pod_phase"),
        (pods("a,1,1,x,1000,,LS,Running,1,2,1"), "t.csv, line 2: num_gpu 'x' is not a whole number"),
        (pods("a,1,1,1,1000,,LS,Running,1,2,1", "b,1,1,-1,1000,,LS,Running,1,2,1"), "t.csv, line 3: num_gpu -1"),
        (pods("a,1,1,1,1000,,LS,Running,soon,2,1"), "t.csv, line 2: creation_time 'soon' is not a number of seconds"),
        (pods("a,1,1,1,1000,,LS,Running,1,5,9"), "t.csv, line 2: deletion_time 5 is before the pod started (9)"),
        (pods("a,1,1,1,1000,,LS,Running,1,2"), "t.csv, line 2: 10 fields, the header has 11"),
        (
            pods("a,1,1,1,1000,,LS,Running,1,2,1", "a,1,1,1,1000,,LS,Running,1,2,1"),
            "t.csv, line 3: pod a appears twice",
        ),
        ([], "t.csv: empty file"),
    ],
)
def test_malformed_openb_pods_name_the_file_and_line(lines: list[str], message: str) -> None:
    with pytest.raises(InvalidInput, match="^" + re.escape(message)):
        parse_openb_pods(lines, "t.csv")


def test_openb_node_list_slice() -> None:
    nodes = read_openb_nodes(NODES)
    assert len(nodes) == 100
    assert nodes[0].name == "openb-node-0000"
    assert (nodes[0].gpus, nodes[0].model) == (2, "P100")
    assert {n.gpus for n in nodes} == {2, 4, 8}
    with pytest.raises(InvalidInput, match=r"^n.csv, line 3: gpu 'eight' is not a whole number"):
        parse_openb_nodes(["sn,gpu,model\n", "a,8,G2\n", "b,eight,G2\n"], "n.csv")
    with pytest.raises(InvalidInput, match=r"^n.csv: missing column\(s\) gpu"):
        parse_openb_nodes(["sn,model\n", "a,G2\n"], "n.csv")
    with pytest.raises(InvalidInput, match="no node with a GPU"):
        parse_openb_nodes(["sn,gpu,model\n", "a,0,\n"], "n.csv")


def test_philly_slice_and_synthesis_are_seeded_and_offer_the_load() -> None:
    runtimes = parse_philly_runtimes(PHILLY.read_text().splitlines(), str(PHILLY))
    assert len(runtimes) == 208
    assert runtimes == sorted(runtimes)  # the file is sorted: the order must be shuffled
    trace = synthesise_philly(runtimes, "p", cluster_gpus=64, load=0.5, seed=7)
    again = synthesise_philly(runtimes, "p", cluster_gpus=64, load=0.5, seed=7)
    other = synthesise_philly(runtimes, "p", cluster_gpus=64, load=0.5, seed=8)
    assert trace.jobs == again.jobs
    assert trace.jobs != other.jobs
    assert sorted(j.runtime for j in trace.jobs) == runtimes
    assert [j.runtime for j in trace.jobs] != runtimes
    assert {j.gpus_per_node for j in trace.jobs} <= set(PHILLY_GPU_MIX)
    assert all(j.project == "default" and j.priority == 0 and j.nodes == 1 for j in trace.jobs)
    arrivals = [j.arrival for j in trace.jobs]
    assert arrivals == sorted(arrivals)
    assert arrivals[0] > 0
    # Offered load = rate x mean GPUs x mean runtime / GPUs, with the rate from the stated mix.
    mean_gpus = sum(g * w for g, w in PHILLY_GPU_MIX.items())
    rate = 0.5 * 64 / (mean_gpus * statistics.mean(runtimes))
    assert any(f"{rate * 3600:.2f} jobs/hour" in note for note in trace.notes)
    assert len(arrivals) / arrivals[-1] == pytest.approx(rate, rel=0.25)  # 208 exponential gaps
    sample = synthesise_philly(runtimes, "p", cluster_gpus=64, limit=20)
    assert len(sample.jobs) == 20
    assert max(j.runtime for j in sample.jobs) > runtimes[19]  # a random sample, not the 20 shortest


def test_philly_errors() -> None:
    with pytest.raises(InvalidInput, match=r"^p.csv, line 3: runtime '-4' is not a number of seconds >= 0"):
        parse_philly_runtimes(["runtime\n", "1.0\n", "-4\n"], "p.csv")
    with pytest.raises(InvalidInput, match=r"^p.csv, line 2: runtime 'abc'"):
        parse_philly_runtimes(["runtime\n", "abc\n"], "p.csv")
    with pytest.raises(InvalidInput, match="no runtimes"):
        parse_philly_runtimes(["runtime\n"], "p.csv")
    with pytest.raises(InvalidInput, match="load"):
        synthesise_philly([1.0], "p", cluster_gpus=8, load=0)


def test_format_detection(tmp_path: Path) -> None:
    assert read_format(PODS) == "openb"
    assert read_format(PHILLY) == "philly"
    assert detect_format("runtime\n", "x") == "philly"
    with pytest.raises(InvalidInput, match="is an openb node list, not a job trace: pass it as --nodes-file"):
        read_format(NODES)
    with pytest.raises(InvalidInput, match=r"^x: not a known trace"):
        detect_format("job,start,end", "x")
    with pytest.raises(InvalidInput, match="cannot read"):
        read_format(tmp_path / "missing.csv")
    (tmp_path / "bin.csv").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(InvalidInput, match="not UTF-8"):
        read_format(tmp_path / "bin.csv")


def test_cluster_choice(tmp_path: Path) -> None:
    nodes, described = resolve_cluster(PHILLY, "philly", nodes=3, gpus_per_node=4)
    assert nodes == homogeneous(3, 4)
    assert described == "3 nodes x 4 GPUs (homogeneous)"
    nodes, described = resolve_cluster(PODS, "openb", nodes_file=NODES)
    assert len(nodes) == 100
    assert "100 nodes from" in described
    with pytest.raises(InvalidInput, match="has runtimes only, no nodes"):
        resolve_cluster(PHILLY, "philly")
    with pytest.raises(InvalidInput, match=r"no openb_node_list_gpu_node\.csv beside"):
        resolve_cluster(PODS, "openb")
    (tmp_path / "openb_node_list_gpu_node.csv").write_text(NODES.read_text())
    nodes, _ = resolve_cluster(tmp_path / "pods.csv", "openb")
    assert len(nodes) == 100
    with pytest.raises(InvalidInput, match="go together"):
        resolve_cluster(PODS, "openb", nodes=2)
    with pytest.raises(InvalidInput, match="not both"):
        resolve_cluster(PODS, "openb", nodes=2, gpus_per_node=8, nodes_file=NODES)
