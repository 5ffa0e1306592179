"""Issue 11's first must-show, with real processes: a head, two simulators (two nodes left on driver
535.183.01, two on the probed H200's 580.159.04) and the CLI. An environment whose CUDA 12.4 needs driver
550.54.14 runs only on the newer two; `gpufleet env check` says why the others cannot; a job no node can
run waits with a reason that names the driver."""

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Head, cli_json, run_cli, start_sim, stop, wait_for

# One worker runs the whole module: its module-scoped cluster is then started once, not on each worker.
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("test_environments")]
OLD_DRIVER = "535.183.01"  # runs CUDA up to 12.2


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Head, Path]]:
    tmp = tmp_path_factory.mktemp("envs")
    head = Head(tmp).start()
    new = start_sim(tmp, head.url, head.join_token(2), 2, "--prefix", "new", "--state-dir", str(tmp / "sim-new"))
    old_args = ("--prefix", "old", "--state-dir", str(tmp / "sim-old"), "--driver-version", OLD_DRIVER)
    old = start_sim(tmp, head.url, head.join_token(2), 2, *old_args)
    try:
        # Up, and with the GPU inventory (drivers) of all four.
        wait_for(lambda: sum(n["state"] == "up" and n["gpu_count"] == 8 for n in head.nodes()) == 4, 60)
        head.api("POST", "/api/v1/users", json={"username": "alice"})
        yield head, tmp
    finally:
        stop(new)
        stop(old)
        head.kill(signal.SIGTERM)


def _add(head: Head, tmp: Path, *args: str) -> dict[str, Any]:
    result = run_cli(tmp, "env", "add", *args, "-o", "json", server=head.url)
    assert result.returncode == 0, result.stderr
    found: dict[str, Any] = json.loads(result.stdout)
    return found


def test_jobs_in_an_environment_land_only_where_the_driver_runs_its_cuda(cluster: tuple[Head, Path]) -> None:
    head, tmp = cluster
    env = _add(
        head, tmp, "pytorch:24.05", "--image", "nvcr.io/nvidia/pytorch:24.05-py3", "--cuda", "12.4",
        "--pytorch", "2.4.0a0", "--nccl", "2.21.5",
    )  # fmt: skip
    assert (env["min_driver"], env["compatible_nodes"]) == ("550.54.14", 2)

    checked = cli_json(tmp, head.url, "env", "check", "pytorch")
    fits = {n["node"]: n for n in checked["nodes"]}
    assert {name for name, fit in fits.items() if fit["ok"]} == {"new001", "new002"}
    for name in ("old001", "old002"):
        assert fits[name]["driver"] == OLD_DRIVER
        assert "runs CUDA up to 12.2" in fits[name]["reason"]
        assert "CUDA 12.4 needs 550.54.14" in fits[name]["reason"]
    table = run_cli(tmp, "env", "check", "pytorch:24.05", server=head.url)
    assert table.returncode == 0, table.stderr
    assert "old001" in table.stdout
    assert "535.183.01" in table.stdout

    # Four 8-GPU jobs, two nodes that can run them: two run, on the new nodes, two wait for them.
    spec = ("--user", "alice", "--gpus-per-node", "8", "--env", "pytorch", "-o", "json", "--", "sleep", "30")
    jobs = [json.loads(run_cli(tmp, "job", "submit", *spec, server=head.url).stdout)["id"] for _ in range(4)]
    try:
        wait_for(lambda: [_job(head, j)["state"] for j in jobs].count("running") == 2, 30, interval=0.25)
        shown = [_job(head, j) for j in jobs]
        running = [j for j in shown if j["state"] == "running"]
        assert {node for j in running for node in j["allocation"]} == {"new001", "new002"}
        assert all(j["container"] == "nvcr.io/nvidia/pytorch:24.05-py3" for j in shown)
        assert all(j["environment"] == "pytorch:24.05" for j in shown)
        assert all(j["reason"].startswith("resources") for j in shown if j["state"] == "pending")
    finally:
        run_cli(tmp, "job", "cancel", *map(str, jobs), server=head.url)


def test_a_job_no_node_can_run_waits_with_the_driver_named(cluster: tuple[Head, Path]) -> None:
    head, tmp = cluster
    _add(head, tmp, "future:1", "--python", "/opt/envs/future", "--cuda", "13.0")  # needs 580.65.06
    _add(head, tmp, "beyond:1", "--python", "/opt/envs/beyond", "--cuda", "13.0", "--min-driver", "590.10")
    none = run_cli(tmp, "env", "check", "beyond:1", server=head.url)
    assert none.returncode == 1
    spec = ("--user", "alice", "--env", "beyond", "-o", "json", "--", "python", "train.py")
    job = json.loads(run_cli(tmp, "job", "submit", *spec, server=head.url).stdout)
    try:
        wait_for(lambda: _job(head, job["id"])["reason"].startswith("unschedulable"), 15, interval=0.25)
        assert "NVIDIA driver 590.10 or newer" in _job(head, job["id"])["reason"]
        # A Python environment: the job runs with its prefix first on the PATH.
        assert job["env"]["VIRTUAL_ENV"] == "/opt/envs/beyond"
        assert job["env"]["PATH"].startswith("/opt/envs/beyond/bin:")
    finally:
        run_cli(tmp, "job", "cancel", str(job["id"]), server=head.url)


def _job(head: Head, job_id: int) -> dict[str, Any]:
    found: dict[str, Any] = head.api("GET", f"/api/v1/jobs/{job_id}")
    return found


def test_a_template_job_is_submitted_with_its_params_and_admins_add_their_own(cluster: tuple[Head, Path]) -> None:
    """Issue 11 part 2 through the CLI and the head: `job submit --template torchrun-ddp --set nodes=2`; an
    admin's template file is offered at once, and a broken one is reported, not hidden."""
    head, tmp = cluster
    admin = tmp / "head" / "job-templates"
    admin.mkdir(exist_ok=True)
    (admin / "smoke.toml").write_text(
        'name = "smoke"\ndescription = "a GPU smoke test"\n[params.seconds]\ntype = "int"\ndefault = 5\n'
        '[job]\nargv = ["sleep", "{seconds}"]\n'
    )
    (admin / "broken.toml").write_text('name = "broken"\ndescription = "x"\n[job]\nargv = ["{nope}"]\n')
    listed = cli_json(tmp, head.url, "template", "list")
    names = {t["name"]: t["origin"] for t in listed["templates"]}
    assert names["torchrun-ddp"] == "built-in"
    assert names["smoke"] == "admin"
    assert "broken" not in names
    assert any("broken.toml" in p and "nope" in p for p in listed["problems"])

    spec = ("--user", "alice", "--template", "torchrun-ddp", "--set", "nodes=2", "--set", "script=train.py")
    job = json.loads(
        run_cli(tmp, "job", "submit", *spec, "--set", "args=--epochs 3", "-o", "json", server=head.url).stdout
    )
    try:
        assert (job["nodes"], job["gpus_per_node"], job["name"]) == (2, 8, "torchrun-ddp")
        assert "torchrun" in job["script"]
        assert "train.py --epochs 3" in job["script"]
    finally:
        run_cli(tmp, "job", "cancel", str(job["id"]), server=head.url)
    # Options given on the command line win; those a template computes from (torchrun's processes per node
    # are its gpus_per_node) go to it as params, so the command and the resources agree.
    spec = ("--user", "alice", "--template", "torchrun-ddp", "--set", "script=train.py", "-o", "json")
    given = ("--gpus-per-node", "4", "--nodes", "1", "--time", "2h", "--export", "NCCL_DEBUG=INFO", "--priority", "0")
    job = json.loads(run_cli(tmp, "job", "submit", *spec, *given, server=head.url).stdout)
    try:
        assert (job["nodes"], job["gpus_per_node"], job["time_limit_s"]) == (1, 4, 7200)
        assert "--nproc-per-node=4" in job["script"]
        assert job["env"]["NCCL_DEBUG"] == "INFO"
    finally:
        run_cli(tmp, "job", "cancel", str(job["id"]), server=head.url)
    twice = run_cli(tmp, "job", "submit", *spec, "--set", "gpus_per_node=2", "--gpus-per-node", "4", server=head.url)
    assert twice.returncode != 0
    assert "give gpus_per_node once" in twice.stderr
    old_flag = run_cli(tmp, "job", "submit", "--user", "alice", "--env", "FOO=bar", "--", "true", server=head.url)
    assert old_flag.returncode != 0
    assert "--export NAME=VALUE" in old_flag.stderr
    wrong = run_cli(
        tmp, "job", "submit", "--user", "alice", "--template", "torchrun-ddp", "--set", "nodes=two", server=head.url
    )
    assert wrong.returncode != 0
    assert "nodes" in wrong.stderr
    assert "Traceback" not in wrong.stderr
