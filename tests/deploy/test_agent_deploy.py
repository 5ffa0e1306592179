"""The agent rollout's plan, refusals, files and task, in process over the API (the real run over SSH is
tests/e2e/test_deploy_agent.py): what each node would get, a dry run that mints nothing, every refusal
before anything is recorded, the join token minted a use per node and kept out of the task and off the
head's disk, and the reasons a failed host's result gives."""

from __future__ import annotations

import json
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker
from typer.testing import CliRunner

from gpufleet.cli.app import app as cli_app
from gpufleet.cli.state import CliState
from gpufleet.core.clock import FakeClock
from gpufleet.core.db import transaction
from gpufleet.deploy import units
from gpufleet.provisioning import agent_deploy, ansible, ansible_recap
from gpufleet.tasks.runner import TaskContext
from tests.conftest import cli_through
from tests.services import require_tool

pytestmark = pytest.mark.one_database  # the rollout's logic over the API: one backend is enough
PLANS = "/api/v1/agent-deploys/plans"
HEAD = "https://head.cluster:8443"


@pytest.fixture
def zipapp(tmp_path: Path) -> Path:
    """A zip where the head looks for the agent's zipapp (its data directory is tmp_path)."""
    path = agent_deploy.default_zipapp(tmp_path)
    path.parent.mkdir()
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("__main__.py", "print('agent')\n")
    return path


@pytest.fixture
def nodes(client: TestClient) -> list[str]:
    for name in ("n1", "n2"):
        assert client.post("/api/v1/nodes", json={"names": [name], "labels": {}}).status_code == 201
    return ["n1", "n2"]


def _body(**changes: Any) -> dict[str, Any]:
    return {"nodes": "n[1-2]", "server": HEAD} | changes


def _nothing_recorded(client: TestClient) -> None:
    assert client.get("/api/v1/tasks").json() == []
    assert [t for t in client.get("/api/v1/tokens").json() if t["kind"] == "join"] == []


def test_a_dry_run_shows_each_nodes_unit_and_mints_nothing(
    client: TestClient, zipapp: Path, nodes: list[str], tmp_path: Path
) -> None:
    answer = client.post(PLANS, json=_body(start="detached", root="/srv/nodes/{node}"))
    assert answer.status_code == 200, answer.text
    plan = answer.json()
    assert plan["hosts"] == nodes
    assert plan["zipapp"] == str(zipapp)
    assert plan["argv"][-1] == "deploy-agent.yml"
    lib = "/srv/nodes/n1/usr/local/lib/gpufleet"
    state = "/srv/nodes/n1/var/lib/gpufleet-agent"
    unit = plan["unit"]
    assert f"ExecStart=/usr/bin/python3 {lib}/{zipapp.name} agent --state-dir {state} --name n1\n" in unit
    assert "EnvironmentFile=-/srv/nodes/n1/etc/gpufleet/agent.env\n" in unit
    assert f"Environment=SHIV_ROOT={state}/shiv\n" in unit
    # under a root, what the agent writes stays there too
    assert "Environment=GPUFLEET_JOB_SPOOL_DIR=/srv/nodes/n1/var/lib/gpufleet-agent/jobs\n" in unit
    assert "RestartPreventExitStatus=2 5 8\n" in unit
    assert plan["spec"] == {
        "manager": "detached",
        "unit": "gpufleet-agent",
        "argv": ["/usr/bin/python3", f"{lib}/{zipapp.name}", "agent", "--state-dir", state, "--name", "n1"],
        "env_file": "/srv/nodes/n1/etc/gpufleet/agent.env",
        "environment": {
            "SHIV_ROOT": f"{state}/shiv",
            "GPUFLEET_ARTIFACT_CACHE_DIR": "/srv/nodes/n1/var/cache/gpufleet/artifacts",
            "GPUFLEET_CHECKS_DIR": "/srv/nodes/n1/etc/gpufleet/checks.d",
            "GPUFLEET_JOB_SPOOL_DIR": f"{state}/jobs",
            "GPUFLEET_SLURM_JOB_MAP_DIR": "/srv/nodes/n1/run/gpufleet/slurm-jobs",
        },
        "state_dir": state,
        "pid_file": "/srv/nodes/n1/run/gpufleet-agent.pid",
        "log_file": "/srv/nodes/n1/var/log/gpufleet-agent.log",
    }
    _nothing_recorded(client)
    audit = client.get("/api/v1/audit").json()
    assert any(r["action"] == "agent_deploy.plan_deploy" and "dry run: agent" in r["target"] for r in audit)


def test_the_rollouts_unit_verifies(client: TestClient, zipapp: Path, nodes: list[str], tmp_path: Path) -> None:
    """The unit a rollout writes under systemd is the install-unit one, and systemd accepts it."""
    unit = client.post(PLANS, json=_body()).json()["unit"]
    assert "StateDirectory=gpufleet-agent\n" in unit  # no root: systemd makes /var/lib/gpufleet-agent
    path = tmp_path / units.AGENT_UNIT
    path.write_text(unit)
    analyze = require_tool("systemd-analyze")
    done = subprocess.run([analyze, "verify", "--man=no", str(path)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert path.name not in done.stdout + done.stderr


@pytest.mark.parametrize(
    ("changes", "status", "message"),
    [
        ({"nodes": "n[1-3]"}, 404, "no such node: n3"),
        ({"root": "/srv/{node}"}, 400, "--root writes under a directory systemd does not read"),
        ({"root": "srv/{node}", "start": "detached"}, 400, "--root must be an absolute path"),
        ({"root": "/srv/a b/{node}", "start": "detached"}, 400, "--root"),
        ({"zipapp": "/nowhere/gpufleet-agent-0.1.0.pyz"}, 400, "there is no agent zipapp at /nowhere"),
        ({"zipapp": "/etc/passwd"}, 400, "must end in .pyz"),
        ({"ssh_user": "Root!"}, 400, "is not a user name"),
        ({"server": "http://head.cluster:8080"}, 400, "the agents would refuse it"),
        ({"server": "ftp://head"}, 400, "must start with http:// or https://"),
        ({"server": "https://head/$x"}, 400, "GPUFLEET_SERVER"),
        ({"join_token": "gfj_x:sha256:zz"}, 400, "CA fingerprint"),
        ({"python": "python3"}, 400, "--python"),
        ({"start": "sometimes"}, 422, "start"),
    ],
)
def test_refusals_record_nothing(
    client: TestClient, zipapp: Path, nodes: list[str], changes: dict[str, Any], status: int, message: str
) -> None:
    for path in (PLANS, "/api/v1/agent-deploys"):
        answer = client.post(path, json=_body(**changes))
        assert answer.status_code == status, answer.text
        assert message in answer.text
    _nothing_recorded(client)


def test_the_zipapp_must_be_on_the_head(client: TestClient, nodes: list[str], tmp_path: Path) -> None:
    answer = client.post(PLANS, json=_body())
    assert answer.status_code == 400
    assert f"there is no agent zipapp at {tmp_path}/agent/gpufleet-agent-" in answer.json()["detail"]
    assert "make dist" in answer.json()["detail"]


def test_the_token_is_minted_per_node_and_never_kept(
    sessions: sessionmaker[Session], clock: FakeClock, zipapp: Path, nodes: list[str], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    with transaction(sessions, readonly=True) as s:
        deploy = agent_deploy.plan(s, agent_deploy.DeployRequest("n[1-2]", HEAD + "/"), zipapp)
        for start, wait_s in ((agent_deploy.Start.none, 60.0), (agent_deploy.Start.detached, 0.0)):
            request = agent_deploy.DeployRequest("n1", HEAD, start=start, wait_s=wait_s)
            # not started, or not waited for: the join token stays in agent.env for the agent's first start
            assert agent_deploy.plan(s, request, zipapp).run.request.extra_vars["gpufleet_wait"] is False
    assert deploy.run.request.extra_vars["gpufleet_wait"] is True
    with transaction(sessions) as s:
        task, token = agent_deploy.create(s, clock, deploy, "token:admin#1", "sha256:" + "ab" * 32)
        task_id, params = task.id, dict(task.params)
    assert token.startswith("gfj_")
    assert token.endswith(":sha256:" + "ab" * 32)  # pinned to the head's CA
    assert params["join_token"].endswith("(minted: 2 uses, 3600 s)")
    assert token.split(":")[0] not in json.dumps(params)
    assert params["server"] == HEAD  # as the agents get it, without the trailing slash

    files = deploy.files(token)
    assert sorted(files) == sorted(
        ["files/gpufleet-agent-ctl.py"]
        + [f"files/{n}/{f}" for n in nodes for f in ("agent-ctl.json", units.AGENT_UNIT, "agent.env")]
    )
    assert f"GPUFLEET_SERVER={HEAD}\nGPUFLEET_JOIN_TOKEN={token}\n" in files["files/n2/agent.env"]
    assert "--name n2" in files[f"files/n2/{units.AGENT_UNIT}"]
    assert json.loads(files["files/n2/agent-ctl.json"])["manager"] == "systemd"

    # The run gets the files (0600 in its private directory); the ones holding the token go when it ends.
    seen: dict[str, int] = {}

    def fake_work(plan: ansible.RunPlan, settings: ansible.RunnerSettings) -> Any:
        def run(ctx: TaskContext) -> str:
            project = settings.runs_dir / f"task-{ctx.task_id}" / "project"
            for relative, text in plan.request.files.items():
                ansible._write_private(project, relative, text)
                seen[relative] = (project / relative).stat().st_mode & 0o777
            assert plan.request.extra_vars["gpufleet_deploy"]["n1"]["env_file"] == "/etc/gpufleet/agent.env"
            return "done"

        return run

    monkeypatch.setattr(ansible, "work", fake_work)  # agent_deploy calls it as ansible.work
    runner = ansible.RunnerSettings(tmp_path / "ansible", 60, 60, 5)
    ctx = TaskContext(task_id, params, sessions, clock)
    assert agent_deploy.work(deploy, token, runner)(ctx) == "done"
    assert set(seen.values()) == {0o600}
    project = tmp_path / "ansible" / f"task-{task_id}" / "project"
    assert not list(project.glob("files/*/agent.env"))
    assert (project / "files" / "n1" / units.AGENT_UNIT).exists()


def test_a_file_outside_the_runs_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="lies outside its directory"):
        ansible._write_private(tmp_path / "project", "../escape", "x")
    assert not (tmp_path / "escape").exists()


def test_a_failed_hosts_reason_is_its_own_words() -> None:
    """A loop's first failed item and a command's stderr say why; 'One or more items failed' and
    'non-zero return code' do not."""
    loop = {
        "event": "runner_on_unreachable",
        "event_data": {
            "host": "n3",
            "task": "dirs",
            "res": {
                "msg": "All items completed",
                "results": [
                    {"msg": "Failed to connect to the host via ssh: Connection refused", "unreachable": True},
                ],
            },
        },
    }
    refused = "unreachable: Failed to connect to the host via ssh: Connection refused"
    assert ansible_recap.failure_of(loop) == ("n3", refused)
    command = {
        "event": "runner_on_failed",
        "event_data": {
            "host": "n1",
            "task": "wait until the agent has joined",
            "res": {"msg": "non-zero return code", "rc": 1, "stderr": "gpufleet-agent-ctl: the agent is not running\n"},
        },
    }
    assert ansible_recap.failure_of(command) == (
        "n1",
        "task 'wait until the agent has joined' failed: gpufleet-agent-ctl: the agent is not running",
    )


def test_the_cli_dry_run(client: TestClient, zipapp: Path, nodes: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    cli_through(client, monkeypatch)
    result = CliRunner().invoke(
        cli_app,
        [
            "node",
            "deploy-agent",
            "n1",
            "n2",
            "--head-url",
            HEAD,
            "--start",
            "none",
            "--ssh-user",
            "ubuntu",
            "--dry-run",
        ],
        obj=CliState(),
    )
    assert result.exit_code == 0, result.output
    assert "hosts: n[1-2] (2)" in result.stdout
    assert "command: ansible-playbook -i PRIVATE_DATA_DIR/inventory/hosts.json" in result.stdout
    assert "--name n1" in result.stdout
    assert "dry run: nothing was started, no join token was made" in result.stdout
    _nothing_recorded(client)
