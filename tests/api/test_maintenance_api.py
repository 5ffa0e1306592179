"""Maintenance campaigns over HTTP and through the CLI: create (and its dry run), list, show, pause,
resume, cancel; every refusal with its status and reason, recording nothing; the permissions each action
needs; the audit records; a campaign carried to its end by the leader's pass on the app's task runner."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from typer.testing import CliRunner

from gpufleet.cli.app import app as cli_app
from gpufleet.core.db import transaction
from gpufleet.core.errors import Conflict, InvalidInput
from gpufleet.inventory import categories
from gpufleet.inventory.models import Node
from gpufleet.tasks.runner import TaskRunner
from gpufleet.workers.campaign_loops import CampaignLoops
from tests.conftest import cli_through
from tests.jobs import helpers
from tests.provisioning.images_helpers import make_tree, tarball

# HTTP translation and the CLI: one backend (the campaign's logic runs on both in tests/lifecycle).
pytestmark = [
    pytest.mark.one_database,
    pytest.mark.rsync,
    pytest.mark.requires_tool("rsync"),
]
CAMPAIGNS = "/api/v1/maintenance/campaigns"


@pytest.fixture
def fleet(client: TestClient, tmp_path: Path) -> CampaignLoops:
    """Nodes n1-n4 up in category gpu, whose image `base` is synced into tmp_path/nodes/NODE; the
    leader's maintenance pass on the app's own task runner."""
    ctx = client.app.state.ctx  # type: ignore[attr-defined]
    ctx.settings = ctx.settings.model_copy(update={"image_sync_local_root": tmp_path / "nodes"})
    tar = tarball(make_tree(tmp_path / "tree"), tmp_path / "base.tar")
    made = client.post("/api/v1/images", json={"name": "base", "tarball": str(tar)})
    assert made.status_code == 202, made.text
    ctx.tasks.wait(made.json()["id"], 60)
    helpers.cluster(ctx.sessions, ctx.clock, nodes=4)
    with transaction(ctx.sessions) as s:
        settings = {"software_image": "base", "sync_target": f"{tmp_path}/nodes/{{node}}"}
        categories.create_category(s, ctx.clock, "gpu", settings=settings)
        for node in s.scalars(select(Node)):
            node.category = "gpu"
    return CampaignLoops(
        settings=ctx.settings,
        sessions=ctx.sessions,
        clock=ctx.clock,
        workload=ctx.monitoring.judge.workload,
        tasks=ctx.tasks,
        is_leader=lambda: True,
    )


def drive(loops: CampaignLoops, runner: TaskRunner, passes: int = 20) -> None:
    for _ in range(passes):
        loops.advance_once()
        for task_id in runner.running():
            runner.wait(task_id, 60)


def body(**spec: Any) -> dict[str, Any]:
    return {"name": "r1", "nodes": "n[1-4]", "actions": ["sync-image:base"], "max_unavailable": "2"} | spec


def test_a_campaign_over_http_from_plan_to_its_end(client: TestClient, fleet: CampaignLoops, tmp_path: Path) -> None:
    plan = client.post("/api/v1/maintenance/plans", json=body(max_unavailable="50%"))
    assert plan.status_code == 200, plan.text
    assert plan.json() | {"policy": None} == {
        "name": "r1",
        "nodes": ["n1", "n2", "n3", "n4"],
        "hostlist": "n[1-4]",
        "canary": "n1",
        "max_unavailable": 2,
        "actions": ["sync-image:base"],
        "policy": None,
    }
    assert client.get(CAMPAIGNS).json() == []  # a dry run records nothing

    made = client.post(CAMPAIGNS, json=body())
    assert made.status_code == 201, made.text
    created = made.json()
    assert (created["state"], created["total"], created["phases"], created["unavailable"]) == (
        "running",
        4,
        {"pending": 4},
        0,
    )
    assert [(n["node"], n["canary"], n["phase"]) for n in created["nodes"]][:2] == [
        ("n1", True, "pending"),
        ("n2", False, "pending"),
    ]
    drive(fleet, client.app.state.ctx.tasks)  # type: ignore[attr-defined]
    done = client.get(f"{CAMPAIGNS}/r1").json()
    assert done["state"] == "completed", done
    assert done["actions"] == ["sync-image:base@1"]
    assert [n["phase"] for n in done["nodes"]] == ["done"] * 4
    assert all(n["serving"] for n in done["nodes"])
    assert (tmp_path / "nodes" / "n4" / "etc" / "os-release").exists()
    listed = client.get(CAMPAIGNS).json()
    assert [(c["name"], c["state"], c["phases"]) for c in listed] == [("r1", "completed", {"done": 4})]
    tasks = client.get("/api/v1/tasks", params={"kind": "image.sync"}).json()
    assert sorted(t["targets"][0]["target"] for t in tasks) == ["n1", "n2", "n3", "n4"]
    assert {t["params"]["campaign"] for t in tasks} == {"r1"}

    for verb in ("pause", "resume", "cancel"):
        answer = client.post(f"{CAMPAIGNS}/r1/{verb}")
        assert answer.status_code == 409, (verb, answer.text)
    assert client.post(f"{CAMPAIGNS}/nosuch/pause").status_code == 404
    assert client.get(f"{CAMPAIGNS}/nosuch").status_code == 404

    audit = client.get("/api/v1/audit", params={"limit": 200}).json()
    created_record = next(r for r in audit if r["action"] == "maintenance.create_campaign")
    assert (created_record["target"], created_record["result"]) == ("campaign r1 on nodes n[1-4]: sync-image:base", 201)
    steps = [r for r in audit if r["actor"] == "campaign:r1"]
    assert {r["action"] for r in steps} >= {"maintenance.take", "maintenance.action", "maintenance.return"}
    assert any(r["action"] == "maintenance.complete" for r in steps)


def test_bad_campaigns_are_refused_with_a_reason_and_record_nothing(client: TestClient, fleet: CampaignLoops) -> None:
    del fleet
    refused = [
        (body(nodes="n[1-9]"), 404, "no such node: n[5-9]"),
        (body(nodes=None, category="nosuch"), 404, "nosuch"),
        (body(nodes=None), 400, "name the nodes (a hostlist) or a category"),
        (body(actions=["upgrade-everything"]), 400, "unknown action 'upgrade-everything': use one of sync-image"),
        (body(actions=["sync-image:nosuch"]), 404, "nosuch"),
        (body(actions=["sync-image:base@7"]), 400, "image base is at revision 1"),
        (body(max_unavailable="150%"), 400, "a percentage is 1% to 100%"),
        (body(max_unavailable="two"), 400, "a number of nodes (1 or more) or a percentage such as 25%"),
        (body(actions=["reboot"]), 409, "no BMC set for n[1-4]"),
        (body(name="Bad Name"), 422, "name"),
        (body(actions=[]), 422, "actions"),
    ]
    for spec, status, reason in refused:
        answer = client.post(CAMPAIGNS, json=spec)
        assert answer.status_code == status, (spec, answer.text)
        assert reason in json.dumps(answer.json()), (spec, answer.text)
        dry = client.post("/api/v1/maintenance/plans", json=spec)
        assert dry.status_code == status, (spec, dry.text)  # the dry run refuses exactly as the real one
    assert client.get(CAMPAIGNS).json() == []
    assert client.post(CAMPAIGNS, json=body()).status_code == 201
    taken = client.post(CAMPAIGNS, json=body(name="r2", nodes="n4"))
    assert (taken.status_code, "n4 (r1)" in taken.json()["detail"]) == (409, True)
    assert client.post(CAMPAIGNS, json=body()).status_code == 409  # the name


def test_each_action_needs_its_own_permission_too(client: TestClient, fleet: CampaignLoops) -> None:
    del fleet
    for role in ("operator", "viewer"):
        client.post("/api/v1/users", json={"username": role, "role": role})
    token = {
        role: client.post("/api/v1/tokens/user", json={"user": role}).json()["token"] for role in ("operator", "viewer")
    }
    as_operator = {"Authorization": f"Bearer {token['operator']}"}
    as_viewer = {"Authorization": f"Bearer {token['viewer']}"}
    playbook = {"site.yml": "- hosts: all\n  tasks: []\n"}
    ansible = client.post(CAMPAIGNS, json=body(actions=["ansible:site.yml"], playbooks=playbook), headers=as_operator)
    assert (ansible.status_code, "ansible:run" in ansible.json()["detail"]) == (403, True)
    packages = client.post(CAMPAIGNS, json=body(actions=["packages:install:htop"]), headers=as_operator)
    assert packages.status_code == 403
    assert client.post(CAMPAIGNS, json=body(), headers=as_viewer).status_code == 403
    assert client.post(CAMPAIGNS, json=body(), headers=as_operator).status_code == 201  # images:write: theirs
    assert client.get(f"{CAMPAIGNS}/r1", headers=as_viewer).status_code == 200  # nodes:read
    assert client.post(f"{CAMPAIGNS}/r1/pause", headers=as_viewer).status_code == 403
    paused = client.post(f"{CAMPAIGNS}/r1/pause", headers=as_operator)
    assert (paused.status_code, paused.json()["state"]) == (200, "paused")


def test_the_cli_creates_follows_and_steers_a_campaign(
    client: TestClient, fleet: CampaignLoops, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    cli_through(client, monkeypatch)
    runner = CliRunner()

    def cli(*args: str) -> Any:
        result = runner.invoke(cli_app, list(args))
        assert result.exit_code == 0, result.output
        return result

    common = ["--nodes", "n[1-4]", "--action", "sync-image:base", "--max-unavailable", "25%", "--wait-jobs", "10m"]
    dry = cli("maintenance", "create", "r1", *common, "--dry-run")
    assert "campaign r1 would take n[1-4] (4 nodes):" in dry.output
    assert "canary: n1; at most 1 out of service at once" in dry.output
    assert "1. sync-image:base" in dry.output
    made = json.loads(cli("maintenance", "create", "r1", *common, "--keep", "1", "-o", "json").output)
    assert made["policy"] == {
        "max_unavailable": "25%",
        "wait_jobs_s": 600.0,
        "overdue": "wait",
        "keep": 1,
        "failure_budget": 1,
        "canary": True,
        "boot_timeout_s": 1800.0,
    }
    assert "paused" in cli("maintenance", "pause", "r1").output
    assert "running" in cli("maintenance", "resume", "r1").output
    drive(fleet, client.app.state.ctx.tasks)  # type: ignore[attr-defined]
    shown = cli("maintenance", "show", "r1", "--follow").output
    assert "completed" in shown
    assert "done: back in service" in shown
    listed = cli("maintenance", "list").output
    assert "r1" in listed
    assert "4/4" in listed

    for args, message in (
        (["--wait-jobs", "soon"], "--wait-jobs: invalid duration 'soon'"),
        (["--overdue", "kill"], "--overdue is wait or fail"),
        (["--action", "ansible:" + str(tmp_path / "missing.yml")], "cannot read the playbook"),
    ):
        result = runner.invoke(cli_app, ["maintenance", "create", "r2", "--nodes", "n1", *args])
        assert isinstance(result.exception, InvalidInput)
        assert message in str(result.exception)
    cancelled = runner.invoke(cli_app, ["maintenance", "cancel", "r1"])
    assert isinstance(cancelled.exception, Conflict)
    assert "already ended (completed)" in str(cancelled.exception)
