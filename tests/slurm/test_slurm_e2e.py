"""Issue 7's must-show with real processes: a head with `workload_manager = "slurm"`, a simulated node named
as the real Slurm's node (sim001), and Slurm 22.05 itself. An injected GPU fault drains the node in Slurm
within 2 s with a `gpufleet:` reason, and a job submitted meanwhile does not land there; once the GPU is
healed gpufleet resumes its own drain and the job runs. A drain set in Slurm by hand shows in `gpufleet node
list`, is refused by `gpufleet node resume`, survives a fault and heal, and is never lifted by gpufleet."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufleet.jobs.slurm.commands import SlurmCommands
from tests.e2e.conftest import Head, cli_json, run_cli, start_sim, stop, wait_for
from tests.slurm.conftest import SlurmCluster, sinfo_node

pytestmark = [pytest.mark.slurm, pytest.mark.e2e]
FAST = {"GPUFLEET_METRICS_INTERVAL_S": "0.5", "GPUFLEET_RESUME_AFTER_HEALTHY_SAMPLES": "3"}
DRAIN_GOAL_S = 2.0


@pytest.fixture
def slurm_head(tmp_path: Path, slurm_cluster: SlurmCluster, slurm_node: str) -> Iterator[tuple[Head, SlurmCommands]]:
    commands = SlurmCommands(slurm_cluster.conf, timeout_s=30)
    env = FAST | {
        "GPUFLEET_WORKLOAD_MANAGER": "slurm",
        "GPUFLEET_SLURM_CONF": slurm_cluster.conf,
        "GPUFLEET_SLURM_POLL_INTERVAL_S": "0.5",
        "GPUFLEET_SLURM_OUTPUT_DIR": str(slurm_cluster.jobout),
    }
    head = Head(tmp_path, env=env).start()
    sim = start_sim(tmp_path, head.url, head.join_token(1), 1, env=FAST)
    try:
        yield head, commands
    finally:
        stop(sim)
        head.kill(signal.SIGTERM)


def _state(commands: SlurmCommands, node: str) -> str:
    """sinfo's state word and the reason: "idle|none", "drained|gpufleet: GPU 1: ..."."""
    return sinfo_node(commands, node, "%T|%E")


def _node(head: Head, name: str) -> dict[str, Any]:
    """The node as `node list` has it; {} until it has joined."""
    return next((n for n in head.nodes() if n["name"] == name), {})


def _job(head: Head, job_id: int) -> dict[str, Any]:
    found: dict[str, Any] = head.api("GET", f"/api/v1/jobs/{job_id}")
    return found


def test_a_gpu_fault_drains_the_node_in_slurm_and_jobs_wait_until_it_heals(
    slurm_head: tuple[Head, SlurmCommands], slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    head, commands = slurm_head
    name = slurm_cluster.node
    head.api("POST", "/api/v1/users", json={"username": "nobody"})
    wait_for(lambda: _node(head, name).get("health") == "healthy" and _node(head, name)["wlm_state"] == "idle", 60)

    sent = time.monotonic()
    head.api("POST", f"/api/v1/nodes/{name}/faults", json={"action": "inject", "kind": "xid79", "gpu": 1})
    while not _state(commands, name).startswith(("drained|gpufleet: GPU 1", "draining|gpufleet: GPU 1")):
        assert time.monotonic() - sent < 30, _state(commands, name)
        time.sleep(0.02)
    took = time.monotonic() - sent
    assert took <= DRAIN_GOAL_S, f"drained in Slurm {took:.2f} s after the fault"

    wait_for(lambda: _node(head, name)["wlm_state"] in ("drained", "draining"), 5)
    (listed,) = cli_json(tmp_path, head.url, "node", "list")
    assert (listed["health"], listed["drained_by"]) == ("failed", "gpufleet")
    assert listed["drain_reason"].startswith("gpufleet: GPU 1")
    submitted = run_cli(
        tmp_path,
        "job",
        "submit",
        "--user",
        "nobody",
        "--gpus-per-node",
        "1",
        "--workdir",
        "/tmp",
        "-o",
        "json",
        "--",
        "sh",
        "-c",
        "echo ran on $SLURMD_NODENAME with GPU $CUDA_VISIBLE_DEVICES",
        server=head.url,
    )
    assert submitted.returncode == 0, submitted.stderr
    job_id = json.loads(submitted.stdout)["id"]
    wait_for(lambda: _job(head, job_id)["external_id"] is not None, 10)
    time.sleep(2)  # four Slurm passes: the job must still wait, on no node
    waiting = _job(head, job_id)
    assert waiting["state"] == "pending", waiting
    assert waiting["reason"].startswith("Slurm: "), waiting
    assert waiting["started_at"] is None
    (queued,) = cli_json(tmp_path, head.url, "job", "list")
    assert (queued["id"], queued["backend"], queued["external_id"]) == (job_id, "slurm", waiting["external_id"])

    head.api("POST", f"/api/v1/nodes/{name}/faults", json={"action": "heal"})
    done = wait_for(lambda: _job(head, job_id)["state"] == "completed", 60)
    assert done > 0
    ended = _job(head, job_id)
    assert ended["allocation"] == {name: [0]} or list(ended["allocation"]) == [name]
    assert _state(commands, name).split("|")[0] in ("idle", "mixed", "completing")
    logs = run_cli(tmp_path, "job", "logs", str(job_id), server=head.url)
    assert logs.returncode == 0, logs.stderr
    assert logs.stdout == f"ran on {name} with GPU 0\n"


def test_a_drain_set_in_slurm_by_hand_is_never_lifted_by_gpufleet(
    slurm_head: tuple[Head, SlurmCommands], slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    head, commands = slurm_head
    name = slurm_cluster.node
    wait_for(lambda: _node(head, name).get("health") == "healthy" and _node(head, name)["wlm_state"] == "idle", 60)
    commands.run(["scontrol", "update", f"nodename={name}", "state=drain", "reason=reseating a cable"])
    wait_for(lambda: _node(head, name)["drain_reason"] == "reseating a cable", 10)
    assert _node(head, name)["drained_by"] == "slurm:root"

    refused = run_cli(tmp_path, "node", "resume", name, server=head.url)
    assert refused.returncode != 0
    assert "never resumes" in refused.stderr
    assert "Traceback" not in refused.stderr

    head.api("POST", f"/api/v1/nodes/{name}/faults", json={"action": "inject", "kind": "xid79", "gpu": 2})
    wait_for(lambda: _node(head, name)["health"] == "failed", 10)
    head.api("POST", f"/api/v1/nodes/{name}/faults", json={"action": "heal"})
    wait_for(lambda: _node(head, name)["health"] == "healthy", 20)
    time.sleep(3)  # more than resume_after_healthy_samples samples and several Slurm passes
    assert _state(commands, name) == "drained|reseating a cable"
    assert _node(head, name)["drain_reason"] == "reseating a cable"
