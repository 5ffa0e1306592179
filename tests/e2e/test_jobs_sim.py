"""Issue 6's must-show on the simulator, with real processes (a head and `gpufleet sim`): a 2-node x
8-GPU job and many 1-GPU jobs complete; a project at its quota waits with reason `quota`; a higher
priority job is placed first; a node crash during a job gives node_fail, or a requeue elsewhere; the
GPUs a job holds are busy in its metrics; its output is kept."""

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Head, run_cli, start_sim, stop, wait_for

# One worker runs the whole module: its module-scoped cluster is then started once, not on each worker.
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("test_jobs_sim")]
FAST = {"GPUFLEET_METRICS_INTERVAL_S": "0.5"}
NODES = 4


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Head, Path]]:
    tmp = tmp_path_factory.mktemp("jobs")
    head = Head(tmp, env=FAST).start()
    sim = start_sim(tmp, head.url, head.join_token(NODES), NODES, env=FAST)
    try:
        wait_for(lambda: sum(n["state"] == "up" for n in head.nodes()) == NODES, 60)
        for user in ("alice", "bob"):
            head.api("POST", "/api/v1/users", json={"username": user})
        head.api("POST", "/api/v1/projects", json={"name": "vision"})
        head.api("POST", "/api/v1/projects/vision/members", json={"user": "alice"})
        head.api("POST", "/api/v1/projects", json={"name": "tiny"})
        head.api("POST", "/api/v1/projects/tiny/members", json={"user": "bob"})
        head.api("PUT", "/api/v1/projects/tiny/quota", json={"max_gpus": 2, "gpu_hours_budget": None})
        yield head, tmp
    finally:
        stop(sim)
        head.kill(signal.SIGTERM)


def _submit(head: Head, **spec: Any) -> int:
    spec.setdefault("user", "alice")
    job_id: int = head.api("POST", "/api/v1/jobs", json=spec)["id"]
    return job_id


def _job(head: Head, job_id: int) -> dict[str, Any]:
    found: dict[str, Any] = head.api("GET", f"/api/v1/jobs/{job_id}")
    return found


def _until(head: Head, job_id: int, *states: str, timeout: float = 60) -> dict[str, Any]:
    wait_for(lambda: _job(head, job_id)["state"] in states, timeout, interval=0.25)
    return _job(head, job_id)


def test_a_gang_and_many_small_jobs_complete(cluster: tuple[Head, Path]) -> None:
    head, tmp = cluster
    submitted = run_cli(
        tmp,
        "job",
        "submit",
        "--user",
        "alice",
        "--nodes",
        "2",
        "--gpus-per-node",
        "8",
        "-o",
        "json",
        "--",
        "sleep",
        "3",
        server=head.url,
    )
    assert submitted.returncode == 0, submitted.stderr
    gang = json.loads(submitted.stdout)["id"]
    small = [_submit(head, argv=["sleep", "1"]) for _ in range(24)]
    for job_id in [gang, *small]:
        assert _until(head, job_id, "completed", "failed", "node_fail", timeout=90)["state"] == "completed"
    done = _job(head, gang)
    assert len(done["allocation"]) == 2
    assert all(len(gpus) == 8 for gpus in done["allocation"].values())
    assert done["project"] == "vision"
    logs = run_cli(tmp, "job", "logs", str(gang), server=head.url)
    assert logs.returncode == 0
    assert "simulated job" in logs.stdout


def test_a_project_at_its_quota_waits_with_reason_quota(cluster: tuple[Head, Path]) -> None:
    head, tmp = cluster
    jobs = [_submit(head, user="bob", project="tiny", argv=["sleep", "30"]) for _ in range(3)]
    wait_for(lambda: [_job(head, j)["state"] for j in jobs].count("running") == 2, 30, interval=0.25)
    waiting = next(_job(head, j) for j in jobs if _job(head, j)["state"] == "pending")
    assert waiting["reason"].startswith("quota")
    listed = run_cli(tmp, "job", "list", "--user", "bob", server=head.url)
    assert "quota" in listed.stdout
    cancelled = run_cli(tmp, "job", "cancel", *map(str, jobs), server=head.url)
    assert cancelled.returncode == 0, cancelled.stderr
    assert all(_job(head, j)["state"] == "cancelled" for j in jobs)


def test_the_higher_priority_job_is_placed_first(cluster: tuple[Head, Path]) -> None:
    head, _ = cluster
    blocker = _submit(head, nodes=NODES, gpus_per_node=8, argv=["sleep", "4"])
    _until(head, blocker, "running")
    low = _submit(head, nodes=NODES, gpus_per_node=8, argv=["sleep", "1"])
    high = _submit(head, nodes=NODES, gpus_per_node=8, argv=["sleep", "1"], priority=10)
    assert _job(head, low)["state"] == "pending"
    _until(head, high, "completed")
    first, second = _until(head, high, "completed"), _until(head, low, "completed")
    assert first["started_at"] < second["started_at"]


def test_a_node_crash_gives_node_fail_or_a_requeue(cluster: tuple[Head, Path]) -> None:
    head, tmp = cluster
    plain = _submit(head, gpus_per_node=8, argv=["sleep", "120"])
    again = _submit(head, gpus_per_node=8, argv=["sleep", "120"], requeue=True)
    first = _until(head, plain, "running")
    moved = _until(head, again, "running")
    # The simulated GPUs of a running job are busy, and the head attributes that to the job.
    wait_for(lambda: (_job(head, plain)["mean_gpu_util"] or 0) > 50, 40, interval=0.5)
    crashed = [next(iter(first["allocation"])), next(iter(moved["allocation"]))]
    for node in set(crashed):
        result = run_cli(tmp, "sim", "fault", node, "--kind", "node-crash", server=head.url)
        assert result.returncode == 0, result.stderr
    try:
        ended = _until(head, plain, "node_fail", timeout=30)
        assert f"node {crashed[0]} is down" in ended["reason"]
        requeued = _until(head, again, "running", timeout=30)
        wait_for(lambda: _job(head, again)["run"] == 2, 30, interval=0.25)
        requeued = _job(head, again)
        assert requeued["state"] == "running"
        assert set(requeued["allocation"]).isdisjoint(crashed)
    finally:
        for node in set(crashed):
            run_cli(tmp, "sim", "heal", node, server=head.url)
    head.api("POST", f"/api/v1/jobs/{again}/cancel")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpus-per-node", "9", "--", "train"], "largest has 8"),
        (["--nodes", "5", "--", "train"], "4 node(s)"),
        (["--project", "nope", "--", "train"], "no such project: nope"),
        (["--project", "tiny", "--gpus-per-node", "4", "--", "train"], "quota of 2"),
        (["--time", "soon", "--", "train"], "invalid duration"),
        ([], "either a command"),
        (["--export", "1X=2", "--", "train"], "env"),
        (["--env", "nope", "--", "train"], "no environment nope"),
    ],
)
def test_bad_submissions_get_one_line_and_queue_nothing(
    cluster: tuple[Head, Path], args: list[str], message: str
) -> None:
    head, tmp = cluster
    before = len(head.api("GET", "/api/v1/jobs", params={"state": ["pending", "running"]}))
    result = run_cli(tmp, "job", "submit", "--user", "bob", *args, server=head.url)
    assert result.returncode != 0
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert len(head.api("GET", "/api/v1/jobs", params={"state": ["pending", "running"]})) == before
