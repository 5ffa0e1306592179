"""The CPU burn-in steps for real, as the step job runs them: `python -m gpufleet.agent.burnin KIND ...`
with real stress-ng and fio, a gloo all-reduce between two local processes and a TCP network pair, each
for about a second. The result line must parse with the head's reader (protocol.burnin.parse_result),
with a positive value in the unit the profiles' thresholds use. No timing is asserted.

stress-ng and fio come from Debian (.ci/run installs them); where missing these skip naming them.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from gpufleet.protocol.burnin import StepResult, parse_result

# Under the heavy lock (tests.conftest.heavy): these load every CPU on purpose (stress-ng, fio, torch in two
# processes), which beside the Slurm tests left slurmctld too slow to start their jobs in time.
pytestmark = pytest.mark.usefixtures("heavy")

RUNNER = [sys.executable, "-m", "gpufleet.agent.burnin"]


def burnin(
    *args: str, env: Mapping[str, str] | None = None, timeout: float = 60
) -> tuple[subprocess.CompletedProcess[str], StepResult]:
    done = subprocess.run([*RUNNER, *args], capture_output=True, text=True, timeout=timeout, check=False, env=_env(env))
    return done, parse_result(done.stdout)


def _env(extra: Mapping[str, str] | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(extra or {})
    return env


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def pair(*args: str, port: int, timeout: float = 90) -> list[tuple[subprocess.CompletedProcess[str], StepResult]]:
    """Run the step as ranks 0 and 1 of a two-node job on this machine."""
    procs = []
    for rank in (0, 1):
        env = _env({"WORLD_SIZE": "2", "NODE_RANK": str(rank), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
        procs.append(
            subprocess.Popen([*RUNNER, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        )
    outcomes = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=timeout)
            done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
            assert proc.returncode == 0, err[-3000:]
            outcomes.append((done, parse_result(out)))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return outcomes


@pytest.mark.requires_tool("stress-ng")
def test_cpu_stress_measures_bogo_ops() -> None:
    done, step = burnin("cpu-stress", "--seconds", "1")
    assert done.returncode == 0, done.stderr
    assert (step.kind, step.unit, step.ok, step.skipped) == ("cpu-stress", "bogo-ops/s", True, False)
    assert step.value > 0
    assert step.evidence["stressors"]["cpu"]["bogo-ops"] > 0
    assert "stress-ng" in step.evidence["tool"]
    assert f"cpu-stress: stress-ng --cpu {len(os.sched_getaffinity(0))} " in done.stdout  # the job log's lines


@pytest.mark.requires_tool("stress-ng")
def test_memory_stress_verifies_pages() -> None:
    done, step = burnin("memory-stress", "--seconds", "1", "--vm-bytes", "64M", "--workers", "1")
    assert done.returncode == 0, done.stderr
    assert (step.kind, step.unit, step.ok) == ("memory-stress", "bogo-ops/s", True)
    assert step.value > 0
    assert "--verify" in step.evidence["argv"]
    assert step.evidence["vm_bytes_per_worker"] == 64 << 20


@pytest.mark.requires_tool("fio")
def test_disk_writes_then_reads_and_cleans_up(tmp_path: Path) -> None:
    done, step = burnin("disk", "--seconds", "1", "--size", "16M", "--dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert (step.kind, step.unit, step.ok) == ("disk", "MB/s", True)
    assert step.value > 0
    assert step.value == pytest.approx(min(step.evidence["write_mb_s"], step.evidence["read_mb_s"]))
    assert step.evidence["write"]["io_bytes"] > 0
    assert step.evidence["read"]["io_bytes"] > 0
    assert list(tmp_path.iterdir()) == []  # the file and its directory are gone


def test_gloo_allreduce_between_two_processes() -> None:
    pytest.importorskip("torch", reason="torch is not installed (the burnin extra: pip install -e '.[dev]')")
    both = pair("allreduce", "--seconds", "1", "--size", "4M", port=free_port())
    for rank, (_, step) in enumerate(both):
        assert (step.kind, step.unit, step.ok, step.skipped) == ("allreduce", "GB/s", True, False)
        assert step.value > 0
        assert step.evidence["backend"] == "gloo"
        assert step.evidence["node_rank"] == rank
        assert step.evidence["world"] == 2
        sizes = step.evidence["sizes"]["0"]
        assert [row["bytes"] for row in sizes] == [65536, 524288, 4 << 20]
        assert all(row["calls"] >= 1 for row in sizes)


def test_tcp_network_pair_measures_both_directions() -> None:
    port = free_port()
    both = pair("network", "--seconds", "1", "--streams", "2", "--port", str(port), "--transport", "tcp", port=port)
    for rank, (_, step) in enumerate(both):
        assert (step.kind, step.unit, step.ok, step.skipped) == ("network", "Gbit/s", True, False)
        assert step.value > 0
        (link,) = step.evidence["links"]
        assert link["partner"] == 1 - rank
        assert link["transport"] == "tcp"
        assert step.value == pytest.approx(min(link["rx_gbit_s"], link["tx_gbit_s"]))
        assert step.evidence["latency_us"] > 0
    # Each side's sending is what the other side received.
    (zero,), (one,) = both[0][1].evidence["links"], both[1][1].evidence["links"]
    assert zero["rx_gbit_s"] == pytest.approx(one["tx_gbit_s"])
    assert one["rx_gbit_s"] == pytest.approx(zero["tx_gbit_s"])


def test_one_process_per_gpu_layout_on_the_cpu() -> None:
    """The GPU layout's machinery (spawned local processes, one rank each, figures back through a queue),
    run on the CPU with gloo: two local processes of one node."""
    torch = pytest.importorskip("torch")
    from datetime import timedelta

    from gpufleet.agent.burnin.collective import WorkerSpec, _spawn

    port = free_port()
    store = torch.distributed.TCPStore("127.0.0.1", port, None, True, timedelta(seconds=60), wait_for_workers=False)
    spec = WorkerSpec("127.0.0.1", port, 0, 2, "gloo", False, 1 << 20, 0.5, 60.0)
    figures = _spawn(spec, 2)
    del store
    assert [f["local"] for f in figures] == [0, 1]
    for f in figures:
        assert "error" not in f, f
        assert f["sum_ok"]
        assert f["busbw_gb_s"] > 0
