"""Issue 27's must-show on the simulator, with real processes (a head and `gpufleet sim`): a category of four
H200 nodes gets `all-1g.18gb` through the agents; 28 one-slice jobs run at once, each on its own MIG device
(the simulated node refuses a UUID it does not have, so a completed job proves its UUID was real); a
whole-GPU job goes to the node without MIG, or waits when held to the category; a layout change is refused
while jobs run and applied once they end; a job of the new profile then runs."""

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Head, run_cli, start_sim, stop, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("test_mig_sim")]
FAST = {"GPUFLEET_METRICS_INTERVAL_S": "1"}
NODES = 5  # one H200 each: four for the MIG category, one left whole
SLICED = 4


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Head, Path, list[str]]]:
    tmp = tmp_path_factory.mktemp("mig")
    head = Head(tmp, env=FAST).start()
    sim = start_sim(tmp, head.url, head.join_token(NODES), NODES, "--gpus-per-node", "1", env=FAST)
    try:
        wait_for(lambda: sum(n["state"] == "up" for n in head.nodes()) == NODES, 60)
        names = sorted(n["name"] for n in head.nodes())
        for name in names[:SLICED]:
            head.api("PATCH", f"/api/v1/nodes/{name}/settings", json={"category": "slices"})
        head.api("PATCH", f"/api/v1/nodes/{names[SLICED]}/settings", json={"category": "notebooks"})
        head.api("POST", "/api/v1/users", json={"username": "alice"})
        yield head, tmp, names
    finally:
        stop(sim)
        head.kill(signal.SIGTERM)


def _submit(head: Head, **spec: Any) -> int:
    job_id: int = head.api("POST", "/api/v1/jobs", json={"user": "alice", **spec})["id"]
    return job_id


def _job(head: Head, job_id: int) -> dict[str, Any]:
    found: dict[str, Any] = head.api("GET", f"/api/v1/jobs/{job_id}")
    return found


def _in_sync(head: Head) -> bool:
    return all(n["in_sync"] for n in head.api("GET", "/api/v1/mig", params={"category": "slices"}))


def _actual(head: Head) -> set[str]:
    return {g["actual"] for n in head.api("GET", "/api/v1/mig", params={"category": "slices"}) for g in n["gpus"]}


def test_a_category_sliced_runs_28_jobs_each_on_its_own_instance_then_changes_layout_once_idle(
    cluster: tuple[Head, Path, list[str]],
) -> None:
    head, tmp, names = cluster
    declared = run_cli(tmp, "mig", "set", "all-1g.18gb", "--category", "slices", server=head.url)
    assert declared.returncode == 0, declared.stderr
    wait_for(lambda: _in_sync(head), 60, interval=0.5)
    assert _actual(head) == {"7x1g.18gb"}

    # 28 one-slice jobs: all run at once, each with a MIG device of its own; a 29th waits.
    slices = [_submit(head, argv=["sleep", "20"], gpu_profile="1g.18gb", gpus_per_node=1) for _ in range(28)]
    extra = _submit(head, argv=["sleep", "1"], gpu_profile="1g.18gb", gpus_per_node=1)
    wait_for(lambda: all(_job(head, j)["state"] == "running" for j in slices), 30, interval=0.25)
    running = [_job(head, j) for j in slices]
    uuids = [u for job in running for rank in job["ranks"] for u in rank["gpu_uuids"]]
    assert len(uuids) == 28
    assert len(set(uuids)) == 28
    assert all(u.startswith("MIG-") for u in uuids)
    assert {job["ranks"][0]["node"] for job in running} == set(names[:SLICED])
    assert _job(head, extra)["state"] == "pending"

    # A whole-GPU job goes to the node left whole; held to the sliced category, it waits.
    whole = _submit(head, argv=["sleep", "1"])
    held = _submit(head, argv=["sleep", "1"], category="slices")
    wait_for(lambda: _job(head, whole)["state"] in ("running", "completed"), 30, interval=0.25)
    assert _job(head, whole)["ranks"][0]["node"] == names[SLICED]
    wait_for(lambda: _job(head, held)["reason"].startswith("unschedulable"), 10, interval=0.25)
    assert _job(head, held)["state"] == "pending"

    # A layout change while the jobs run: refused outright with --now, nothing declared.
    refused = run_cli(tmp, "mig", "set", "3g.71gb+4g.71gb", "--category", "slices", "--now", server=head.url)
    assert refused.returncode != 0
    assert "running jobs hold GPUs it would change" in refused.stderr
    assert _in_sync(head)

    # Declared to wait: no GPU changes while its jobs run, and no new job lands on it meanwhile.
    waiting = run_cli(tmp, "mig", "set", "3g.71gb+4g.71gb", "--category", "slices", server=head.url)
    assert waiting.returncode == 0, waiting.stderr
    time.sleep(1.5)  # three dispatch rounds: a change would have gone out
    assert all(_job(head, j)["state"] == "running" for j in slices)
    assert _actual(head) == {"7x1g.18gb"}
    assert _job(head, extra)["state"] == "pending"

    # Once the jobs end (completed: each found its MIG device on its node), every GPU gets the new layout.
    wait_for(lambda: all(_job(head, j)["state"] == "completed" for j in slices), 60, interval=0.5)
    wait_for(lambda: _in_sync(head), 60, interval=0.5)
    assert _actual(head) == {"3g.71gb+4g.71gb"}
    big = _submit(head, argv=["sleep", "1"], gpu_profile="3g.71gb", gpus_per_node=1)
    wait_for(lambda: _job(head, big)["state"] == "completed", 30, interval=0.25)
    assert _job(head, big)["ranks"][0]["gpu_uuids"][0].startswith("MIG-")


def test_a_node_time_sliced_four_ways_runs_four_replica_jobs_on_its_one_gpu(
    cluster: tuple[Head, Path, list[str]],
) -> None:
    head, _, names = cluster
    whole = names[SLICED]
    settings = f"/api/v1/nodes/{whole}/settings"
    head.api("PATCH", settings, json={"set": {"gpu_sharing": "time-slicing:4"}})
    try:
        gpu = head.api("GET", f"/api/v1/nodes/{whole}")["gpus"][0]["uuid"]
        mine = {"gpu_profile": "shared", "gpus_per_node": 1, "category": "notebooks"}
        shared = [_submit(head, argv=["sleep", "4"], **mine) for _ in range(4)]
        fifth = _submit(head, argv=["sleep", "1"], **mine)
        exclusive = _submit(head, argv=["sleep", "1"], category="notebooks")  # its one GPU is not whole now
        wait_for(lambda: all(_job(head, j)["state"] == "running" for j in shared), 30, interval=0.25)

        ranks = [_job(head, j)["ranks"][0] for j in shared]
        assert {r["node"] for r in ranks} == {whole}
        assert len({u for r in ranks for u in r["gpu_uuids"]}) == 4  # four replicas, never one twice
        assert all(u.startswith(f"{gpu}@time-slicing:") for r in ranks for u in r["gpu_uuids"])
        assert _job(head, fifth)["state"] == "pending"
        assert _job(head, exclusive)["state"] == "pending"

        # The jobs completed on the simulated node: each was sent the GPU's own UUID, which it has.
        wait_for(lambda: all(_job(head, j)["state"] == "completed" for j in [*shared, fifth]), 60, interval=0.5)
        assert _job(head, exclusive)["state"] == "pending"
    finally:  # the other test of the module wants the node whole, whichever runs first
        head.api("PATCH", settings, json={"unset": ["gpu_sharing"]})
