"""Issue 8's must-show, with real processes: a simulated straggler GPU in a running multi-node job is
flagged within a minute, naming the job and the GPU; healed, the alert resolves."""

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Head, start_sim, stop, wait_for

pytestmark = pytest.mark.e2e
FAST = {"GPUFLEET_METRICS_INTERVAL_S": "0.5"}


@pytest.fixture
def cluster(heavy: None, tmp_path: Path) -> Iterator[Head]:
    head = Head(tmp_path, env=FAST).start()
    sim = start_sim(tmp_path, head.url, head.join_token(2), 2, env=FAST)
    try:
        wait_for(lambda: sum(n["state"] == "up" for n in head.nodes()) == 2, 60)
        head.api("POST", "/api/v1/users", json={"username": "alice"})
        yield head
    finally:
        stop(sim)
        head.kill(signal.SIGTERM)


def _stragglers(head: Head, status: str = "firing") -> list[dict[str, Any]]:
    return [a for a in head.api("GET", "/api/v1/alerts", params={"status": status}) if a["rule"] == "GpuStraggler"]


def test_a_slow_gpu_in_a_two_node_job_is_flagged_within_a_minute(cluster: Head) -> None:
    head = cluster
    spec = {"user": "alice", "nodes": 2, "gpus_per_node": 4, "argv": ["sleep", "600"]}
    job_id = head.api("POST", "/api/v1/jobs", json=spec)["id"]
    wait_for(lambda: head.api("GET", f"/api/v1/jobs/{job_id}")["state"] == "running", 30)
    ranks = head.api("GET", f"/api/v1/jobs/{job_id}")["ranks"]
    on_sim002 = next(r for r in ranks if r["node"] == "sim002")
    slow_gpu = on_sim002["gpu_indexes"][1]
    time.sleep(25)  # running a while with every GPU busy: no straggler is raised
    assert _stragglers(head) == []

    injected = time.monotonic()
    head.api("POST", "/api/v1/nodes/sim002/faults", json={"kind": "gpu-slow", "gpu": slow_gpu})
    wait_for(lambda: _stragglers(head), 60)
    flagged_after = time.monotonic() - injected
    print(f"straggler flagged {flagged_after:.1f} s after the fault")
    [alert] = _stragglers(head)
    assert (alert["node_name"], alert["gpu"]) == ("sim002", slow_gpu)
    assert f"GPU {slow_gpu} of job {job_id}" in alert["summary"]
    assert flagged_after < 60

    head.api("POST", "/api/v1/nodes/sim002/faults", json={"action": "heal"})
    wait_for(lambda: not _stragglers(head), 60)
    assert [a["gpu"] for a in _stragglers(head, "resolved")] == [slow_gpu]
    head.api("POST", f"/api/v1/jobs/{job_id}/cancel")
