"""Issue 6's must-show on the real executor: `gpufleet agent` on this machine runs a job's processes
with the job's own environment, as the submitting user when the agent is root, keeps its output, and
kills the whole process tree on cancel and on the time limit."""

import json
import os
import pwd
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from gpufleet.core.hostlist import expand
from tests.e2e.conftest import GPUFLEET, Head, base_env, run_cli, stop, wait_for

# One worker runs the whole module: its module-scoped cluster is then started once, not on each worker.
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("test_jobs_agent")]
NODE = "realnode"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Head, Path]]:
    tmp = tmp_path_factory.mktemp("realjobs")
    head = Head(tmp).start()
    env = base_env(tmp) | {
        "GPUFLEET_SERVER": head.url,
        "GPUFLEET_AGENT_STATE_DIR": str(tmp / "agent"),
        "GPUFLEET_JOB_SPOOL_DIR": str(tmp / "spool"),
        "GPUFLEET_JOB_KILL_GRACE_S": "1",
        "GPUFLEET_SECRET_FROM_THE_AGENT": "must-not-leak",
    }
    log = (tmp / "agent.log").open("ab")
    agent = subprocess.Popen(
        [*GPUFLEET, "agent", "--join-token", head.join_token(1), "--name", NODE],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for(lambda: any(n["state"] == "up" for n in head.nodes()), 60)
        head.api("POST", "/api/v1/users", json={"username": RUN_AS})
        yield head, tmp
    finally:
        stop(agent)
        head.kill(signal.SIGTERM)


# A root agent runs the job as its user (nobody here); an agent that is not root runs only its own user's.
RUN_AS = "nobody" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name


def _submit(head: Head, tmp: Path, *args: str) -> int:
    result = run_cli(
        tmp, "job", "submit", "--user", RUN_AS, "--gpus-per-node", "0", "-o", "json", *args, server=head.url
    )
    assert result.returncode == 0, result.stderr
    job_id: int = json.loads(result.stdout)["id"]
    return job_id


def _job(head: Head, job_id: int) -> dict[str, Any]:
    found: dict[str, Any] = head.api("GET", f"/api/v1/jobs/{job_id}")
    return found


def _pids(pidfile: Path) -> list[int]:
    return [int(p) for p in pidfile.read_text().split()] if pidfile.exists() else []


def test_a_job_runs_with_its_own_environment_and_its_output_is_kept(node: tuple[Head, Path]) -> None:
    head, tmp = node
    script = (
        'echo "user=$(id -un) job=$GPUFLEET_JOB_ID rank=$NODE_RANK world=$WORLD_SIZE mine=$MINE"; '
        'echo "leak=${GPUFLEET_SECRET_FROM_THE_AGENT:-none} cuda=[$CUDA_VISIBLE_DEVICES]"; echo oops >&2; exit 3'
    )
    job_id = _submit(head, tmp, "--export", "MINE=yes", "--workdir", "/tmp", "--", "/bin/sh", "-c", script)
    wait_for(lambda: _job(head, job_id)["state"] in ("completed", "failed"), 30, interval=0.2)
    done = _job(head, job_id)
    assert done["state"] == "failed"
    assert done["exit_code"] == 3
    assert expand(list(done["allocation"])) == [NODE]
    logs = run_cli(tmp, "job", "logs", "--follow", str(job_id), server=head.url)  # ends: the job has
    assert f"user={RUN_AS} job={job_id} rank=0 world=1 mine=yes" in logs.stdout
    assert "leak=none cuda=[]" in logs.stdout
    assert "oops" in logs.stderr
    spooled = list((tmp / "spool").rglob("*"))
    assert any(p.is_file() and "oops" in p.read_text(errors="replace") for p in spooled)


@pytest.mark.parametrize("how", ["cancel", "time limit"])
def test_cancel_and_the_time_limit_kill_the_whole_tree(node: tuple[Head, Path], how: str) -> None:
    head, tmp = node
    shared = Path(tempfile.mkdtemp(prefix="gpufleet-pids-"))  # where the job's user may write
    shared.chmod(0o777)
    pidfile = shared / "pids"
    # A child that ignores SIGTERM, and one that left the process group with setsid.
    script = (
        f"echo $$ >> {pidfile}; "
        f"sh -c 'trap \"\" TERM; echo $$ >> {pidfile}; exec sleep 300' & "
        f"setsid sh -c 'echo $$ >> {pidfile}; exec sleep 300' & "
        "echo started; wait"
    )
    extra = ["--time", "0:05"] if how == "time limit" else []
    job_id = _submit(head, tmp, *extra, "--", "/bin/sh", "-c", script)
    wait_for(lambda: len(_pids(pidfile)) >= 3, 30, interval=0.2)
    pids = _pids(pidfile)
    assert all(psutil.pid_exists(p) for p in pids)
    if how == "cancel":
        cancelled = run_cli(tmp, "job", "cancel", str(job_id), server=head.url)
        assert cancelled.returncode == 0, cancelled.stderr
        assert _job(head, job_id)["state"] == "cancelled"
    wait_for(lambda: _job(head, job_id)["ranks"][0]["state"] == "exited", 30, interval=0.2)
    time.sleep(0.2)
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert alive == []
    done = _job(head, job_id)
    assert done["state"] == ("cancelled" if how == "cancel" else "timeout")
    assert done["ranks"][0]["outcome"] == ("cancelled" if how == "cancel" else "timeout")
