"""Issue 24's must-show for burn-in admission, with real processes (a head, `gpufleet sim`, the CLI):
16 simulated H200 nodes join a head that requires the `quick` profile before a node takes work (here an
admin's copy of it whose all-reduce runs over groups of 4, `group = 4`); two of them have a weak GPU (one
slow, one computing wrong results) and one a weak link. Exactly those three stay out, each with its
failing step and value named; the other 13 pass and become schedulable. The weak link is told from the
healthy nodes of its group by bisection: its group falls short, its half falls short, and it fails alone
with a known-good partner, while the rest of its group pass.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Head, cli_json, run_cli, start_sim, stop, wait_for

pytestmark = pytest.mark.e2e
NODES = 16
FAULTS = {"sim003": "weak-gpu-slow:2", "sim011": "weak-gpu-wrong:6", "sim014": "weak-link"}


GROUP = 4
QUICK = Path(__file__).resolve().parents[2] / "src" / "gpufleet" / "lifecycle" / "profile_files" / "quick.toml"


@pytest.fixture
def admission_head(heavy: None, tmp_path: Path) -> Iterator[Head]:
    """Under the heavy lock: a head and 16 simulated nodes running step jobs would starve the Slurm tests'
    slurmctld and the 200-node join storm beside them. The admission profile is the built-in `quick`, its
    all-reduce over groups, as an admin's file replacing it."""
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    grouped = QUICK.read_text().replace('kind = "allreduce"\n', f'kind = "allreduce"\ngroup = {GROUP}\n', 1)
    assert f"group = {GROUP}" in grouped
    (profiles / "quick.toml").write_text(grouped)
    env = {"GPUFLEET_BURNIN_ADMISSION": "quick", "GPUFLEET_BURNIN_PROFILES_DIR": str(profiles)}
    head = Head(tmp_path, env=env).start()
    yield head
    head.kill(signal.SIGTERM)


def test_admission_keeps_exactly_the_weak_nodes_out(admission_head: Head, tmp_path: Path) -> None:
    head = admission_head
    faults = [arg for node, fault in FAULTS.items() for arg in ("--fault", f"{node}:{fault}")]
    sim = start_sim(tmp_path, head.url, head.join_token(NODES), NODES, *faults)
    try:

        def runs() -> dict[str, dict[str, Any]]:
            return {r["node"]: r for r in head.api("GET", "/api/v1/burn-ins", params={"limit": 100})}

        wait_for(lambda: len(runs()) == NODES, 60)
        # Held from the first join: none of them may take work before it passed.
        assert all(n["drain_reason"].startswith("gpufleet: burn-in") for n in head.nodes())
        wait_for(lambda: all(r["state"] in ("passed", "failed") for r in runs().values()), 180, interval=0.5)

        ended = runs()
        failed = {name for name, r in ended.items() if r["state"] == "failed"}
        assert failed == set(FAULTS), {n: r["reason"] for n, r in ended.items()}
        assert ended["sim003"]["reason"].startswith("gemm: ")
        assert "under threshold 600 (GPU 2)" in ended["sim003"]["reason"]  # the slow GPU, with its value
        assert ended["sim011"]["reason"].startswith("gemm: GPU 6: checksum mismatch")  # wrong, whatever its speed
        assert ended["sim014"]["reason"].startswith("allreduce: ")
        assert "a node that passed this step" in ended["sim014"]["reason"]
        # Measured in groups (the 14 nodes that reached the step, in groups of 4, a remainder placed), the
        # weak link's group bisected down to it: the group, a half of it, then alone with a known-good node.
        shown = {name: head.api("GET", f"/api/v1/burn-ins/{r['id']}") for name, r in ended.items()}
        allreduce = {name: next(s for s in r["steps"] if s["name"] == "allreduce") for name, r in shown.items()}
        assert {s["group_size"] for s in allreduce.values()} == {GROUP}
        first = [len(s["evidence"]["attempts"][0]["with"]) + 1 for s in allreduce.values() if s["evidence"]]
        assert max(first) >= 3, first
        weak = allreduce["sim014"]["evidence"]["attempts"]
        assert len(weak) >= 2
        assert len(weak[-1]["with"]) == 1
        healthy = [n for n, s in allreduce.items() if n not in FAULTS and s["state"] == "passed"]
        assert len(healthy) == NODES - len(FAULTS)

        nodes = {n["name"]: n for n in head.nodes()}
        for name, node in nodes.items():
            if name in FAULTS:
                assert node["drain_reason"].startswith(f"gpufleet: burn-in failed: {ended[name]['reason'][:40]}")
            else:
                assert node["drain_reason"] is None, name
                assert node["state"] == "up"

        # The step, the value and the threshold are in `node show`, and the fleet view names the outliers.
        shown = cli_json(tmp_path, head.url, "node", "show", "sim003")
        assert shown["hold"] == "burn-in-failed"
        gemm = shown["burn_in"]["steps"][0]
        assert (gemm["name"], gemm["state"], gemm["threshold"]) == ("gemm", "failed", 600.0)
        assert gemm["value"] < 600.0
        assert gemm["evidence"]["per_gpu"]["2"] == gemm["value"]
        text = run_cli(tmp_path, "burn-in", "fleet", "--step", "gemm", server=head.url)
        assert text.returncode == 0, text.stderr
        assert "sim003" in text.stdout

        # The 13 take work: a 13-node job of whole nodes starts on exactly them.
        head.api("POST", "/api/v1/users", json={"username": "alice"})
        job = head.api(
            "POST",
            "/api/v1/jobs",
            json={"user": "alice", "nodes": 13, "gpus_per_node": 8, "argv": ["sleep", "1"]},
        )
        wait_for(lambda: head.api("GET", f"/api/v1/jobs/{job['id']}")["state"] != "pending", 30)
        placed = head.api("GET", f"/api/v1/jobs/{job['id']}")
        assert set(placed["allocation"]) == {n for n in nodes if n not in FAULTS}
    finally:
        stop(sim, signal.SIGINT)
