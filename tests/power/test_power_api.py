"""The power API, CLI and dashboard page over HTTP with fake BMCs: BMC passwords go in and never come
out, actions start tasks with per-node results and one audit record each, running jobs refuse a power
off unless forced, and permissions hold."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import delete, text
from typer.testing import CliRunner

from gpufleet.auth import service as auth
from gpufleet.auth.policy import Role
from gpufleet.cli import tasks as cli_tasks
from gpufleet.cli.app import app as cli_app
from gpufleet.cli.state import CliState
from gpufleet.core.clock import to_datetime
from gpufleet.core.db import make_engine, make_session_factory, transaction
from gpufleet.core.errors import GpufleetError
from gpufleet.inventory import service as inventory
from gpufleet.jobs.models import Job, JobState
from gpufleet.migrations import upgrade
from tests.api.dashboard_helpers import logged_in
from tests.conftest import cli_through
from tests.power.conftest import FakeFleet, make_head

SECRET = "Sup3r-secret-BMC-pw"


def _wait(client: TestClient, task: dict[str, object]) -> dict[str, object]:
    client.app.state.ctx.tasks.wait(int(task["id"]), 30)  # type: ignore[attr-defined, call-overload]
    answer: dict[str, object] = client.get(f"/api/v1/tasks/{task['id']}").json()
    return answer


@pytest.fixture(scope="module")
def shared_head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    """One head for the module (building one costs seconds); each test brings and removes its nodes."""
    data_dir = tmp_path_factory.mktemp("power-api")
    engine = make_engine(f"sqlite:///{data_dir / 'gpufleet.db'}")
    upgrade(engine)
    with make_head(make_session_factory(engine), data_dir) as client:
        yield client
    engine.dispose()


def _since(client: TestClient) -> str:
    return str(client.app.state.test_started)  # type: ignore[attr-defined]


def power_audit(client: TestClient) -> list[dict[str, Any]]:
    """This test's audit records of power actions, newest first."""
    records = client.get("/api/v1/audit", params={"since": _since(client)}).json()
    return [r for r in records if r["action"] == "power.power_action"]


@pytest.fixture
def faked(shared_head: TestClient, fleet: FakeFleet) -> Iterator[TestClient]:
    """Nodes gpu[01-04] with IPMI BMCs answered by fakes (off; an action shows at the next read)."""
    head = shared_head
    head.app.state.power_connect = fleet.connect  # type: ignore[attr-defined]
    head.app.state.test_started = datetime.now(UTC).isoformat()  # type: ignore[attr-defined]
    assert head.post("/api/v1/nodes", json={"names": ["gpu[01-04]"]}).status_code == 201
    for i in range(1, 5):
        fleet.add(f"10.140.0.{i}", lag=0)
        body = {"protocol": "ipmi", "address": f"10.140.0.{i}", "username": "admin", "password": f"{SECRET}{i}"}
        answer = head.put(f"/api/v1/nodes/gpu0{i}/bmc", json=body)
        assert answer.status_code == 200, answer.text
    yield head
    ctx = head.app.state.ctx  # type: ignore[attr-defined]
    with transaction(ctx.sessions) as s:
        s.execute(delete(Job))
        inventory.remove_nodes(s, [n.name for n in inventory.list_nodes(s)])  # their BMCs go with them


def test_the_password_goes_in_and_never_comes_out_and_permissions_hold(faked: TestClient) -> None:
    shown = faked.get("/api/v1/nodes/gpu01/bmc")
    assert shown.status_code == 200
    assert shown.json()["password_set"] is True
    assert shown.json()["username"] == "admin"
    everything = [shown.text, faked.get("/api/v1/power").text, faked.get("/api/v1/audit").text]
    assert not any(SECRET in page for page in everything)
    with transaction(faked.app.state.ctx.sessions, readonly=True) as s:  # type: ignore[attr-defined]
        column = s.execute(text("SELECT password_sealed FROM bmcs")).scalars().all()
    assert len(column) == 4
    assert not any(SECRET in value for value in column)
    # Another head with another key file cannot open them: the key is not in the database.
    key = faked.app.state.ctx.settings.data_dir / "bmc.key"  # type: ignore[attr-defined]
    assert key.stat().st_mode & 0o777 == 0o600
    ctx = faked.app.state.ctx  # type: ignore[attr-defined]
    with transaction(ctx.sessions) as s:
        viewer = auth.create_api_token(s, ctx.clock, "viewer", Role.VIEWER, None)
        operator = auth.create_api_token(s, ctx.clock, "operator", Role.OPERATOR, None)
    as_viewer = {"Authorization": f"Bearer {viewer}"}
    assert faked.get("/api/v1/power", headers=as_viewer).status_code == 403
    assert faked.post("/api/v1/power/on", json={"nodes": "gpu01"}, headers=as_viewer).status_code == 403
    as_operator = {"Authorization": f"Bearer {operator}"}
    status = faked.post("/api/v1/power/status", json={"nodes": "gpu01"}, headers=as_operator)
    assert status.status_code == 202
    assert _wait(faked, status.json())["targets"][0]["detail"] == "off"  # type: ignore[index]
    assert faked.post("/api/v1/power/explode", json={"nodes": "gpu01"}).status_code == 400
    assert faked.post("/api/v1/power/on", json={"nodes": "gpu[01-09]"}).status_code == 404
    bad = {"protocol": "ipmi", "address": "https://x", "username": "u", "password": "p"}
    assert faked.put("/api/v1/nodes/gpu01/bmc", json=bad).status_code == 400
    assert faked.delete("/api/v1/nodes/gpu04/bmc").status_code == 204
    assert faked.get("/api/v1/nodes/gpu04/bmc").status_code == 404
    assert faked.post("/api/v1/power/on", json={"nodes": "gpu04"}).status_code == 409


def test_a_bad_bmc_request_never_echoes_its_password(faked: TestClient) -> None:
    # A body the API cannot validate: FastAPI's own 422 would return it whole, password and all.
    for body in [
        {"protocol": "ipmi", "address": "10.140.0.9", "password": SECRET},  # no username
        {"protocol": "snmp", "address": "10.140.0.9", "username": "admin", "password": SECRET},
        {"protocol": "ipmi", "address": "10.140.0.9", "username": "admin", "password": SECRET, "pasword": SECRET},
    ]:
        answer = faked.put("/api/v1/nodes/gpu01/bmc", json=body)
        assert answer.status_code == 422, answer.text
        assert SECRET not in answer.text
        errors = answer.json()["detail"]
        assert errors
        assert all(set(error) == {"loc", "msg", "type"} for error in errors)
        assert errors[0]["loc"][0] == "body"
    # Credentials in the address: refused (they would be stored and shown in the clear), and neither the
    # answer nor the audit record repeats them.
    for protocol, address in [
        ("redfish", f"https://admin:{SECRET}@10.140.0.9"),
        ("ipmi", f"admin:{SECRET}@10.140.0.9"),
    ]:
        body = {"protocol": protocol, "address": address, "username": "admin", "password": "pw"}
        answer = faked.put("/api/v1/nodes/gpu01/bmc", json=body)
        assert answer.status_code == 400, answer.text
        assert "--password-stdin" in answer.json()["detail"]
        assert SECRET not in answer.text
    records = faked.get("/api/v1/audit", params={"since": _since(faked)}).json()
    refused = [r["target"] for r in records if r["action"] == "power.set_bmc" and r["result"] == 400]
    assert sorted(refused) == ["gpu01: ipmi ***@10.140.0.9", "gpu01: redfish https://***@10.140.0.9"]
    assert SECRET not in json.dumps(records)
    assert faked.get("/api/v1/nodes/gpu01/bmc").json()["address"] == "10.140.0.1"  # unchanged


def test_bulk_power_is_a_task_with_per_node_results_and_one_audit_record_and_jobs_refuse_it(
    faked: TestClient, fleet: FakeFleet
) -> None:
    fleet.bmcs["10.140.0.3"].fail = "10.140.0.3:623: Unable to establish IPMI v2 / RMCP+ session"
    answer = faked.post("/api/v1/power/on", json={"nodes": "gpu[01-04]", "limit": 2})
    assert answer.status_code == 202, answer.text
    started = answer.json()
    assert (started["kind"], started["total"]) == ("power.on", 4)
    assert started["params"]["nodes"] == "gpu[01-04]"
    assert SECRET not in answer.text
    task = _wait(faked, started)
    results = {t["target"]: (t["state"], t["data"]) for t in task["targets"]}  # type: ignore[attr-defined]
    assert results["gpu03"] == ("failed", None)
    assert results["gpu01"] == ("ok", {"power_state": "on", "seconds": 0.0})
    assert (task["state"], task["done"], task["failed"]) == ("failed", 4, 1)
    states = {r["node"]: r for r in faked.get("/api/v1/power", params={"nodes": "gpu[01-04]"}).json()}
    assert [states[n]["power_state"] for n in ("gpu01", "gpu02", "gpu04")] == ["on", "on", "on"]
    assert "RMCP+" in states["gpu03"]["last_error"]
    # The inventory shows it too: node list and node show.
    listed = {n["name"]: n["power_state"] for n in faked.get("/api/v1/nodes", params={"names": "gpu[01-04]"}).json()}
    assert listed == {"gpu01": "on", "gpu02": "on", "gpu03": states["gpu03"]["power_state"], "gpu04": "on"}
    assert faked.get("/api/v1/nodes/gpu02").json()["power_state"] == "on"
    audit = power_audit(faked)
    assert len(audit) == 1
    assert audit[0]["target"] == f"task {started['id']}: power on gpu[01-04]"
    assert audit[0]["result"] == 202

    # Off, cycle and reset are refused, all or nothing, for nodes that run jobs, unless forced.
    ctx = faked.app.state.ctx  # type: ignore[attr-defined]
    fleet.bmcs["10.140.0.3"].fail = None
    with transaction(ctx.sessions) as s:
        job = Job(
            user="alice",
            submitted_by="user:alice",
            state=JobState.RUNNING,
            time_limit_s=60,
            submitted_at=to_datetime(ctx.clock.now()),
            allocation={"gpu02": [0, 1]},
        )
        s.add(job)
        s.flush()
        job_id = job.id
    refused = faked.post("/api/v1/power/off", json={"nodes": "gpu[01-02]"})
    assert refused.status_code == 409
    assert refused.json()["detail"].startswith(f"gpu02 run jobs ({job_id})")
    assert fleet.bmcs["10.140.0.1"].actions() == ["power_on"]  # all or nothing: gpu01 was not touched either
    plan = faked.post("/api/v1/power/plans", json={"action": "off", "nodes": "gpu[01-02]", "force": True})
    assert plan.status_code == 200
    assert plan.json()["forced"] == {"gpu02": [job_id]}
    assert fleet.bmcs["10.140.0.1"].actions() == ["power_on"]  # a plan sends nothing
    forced = faked.post("/api/v1/power/off", json={"nodes": "gpu[01-02]", "force": True})
    assert forced.status_code == 202
    assert _wait(faked, forced.json())["state"] == "succeeded"
    assert fleet.bmcs["10.140.0.2"].actions() == ["power_on", "power_off"]
    targets = [r["target"] for r in power_audit(faked)]
    assert targets[0].endswith("power off gpu[01-02] (forced over jobs on gpu02)")
    assert targets[1] == "/api/v1/power/off"
    assert len(targets) == 3


def test_the_cli_follows_a_power_task_and_never_takes_a_password_argument(
    faked: TestClient, fleet: FakeFleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    cli_through(faked, monkeypatch)
    monkeypatch.setattr(cli_tasks, "POLL_S", 0.02)
    runner = CliRunner()

    def cli(*args: str, stdin: str | None = None) -> tuple[int, str]:
        result = runner.invoke(cli_app, list(args), obj=CliState(), input=stdin)
        if isinstance(result.exception, GpufleetError):  # gpufleet's main() prints it, exits with its code
            return result.exception.exit_code, str(result.exception)
        return result.exit_code, result.output

    monkeypatch.setenv("GF_BMC_PW", "from-the-env")
    code, out = cli(
        "bmc",
        "set",
        "gpu01",
        "--protocol",
        "ipmi",
        "--address",
        "bmc1",
        "--username",
        "root",
        "--password-env",
        "GF_BMC_PW",
    )
    assert code == 0, out
    fleet.add("bmc1", lag=0)
    code, out = cli(
        "bmc",
        "set",
        "gpu02",
        "--protocol",
        "redfish",
        "--address",
        "https://bmc2",
        "--username",
        "root",
        "--password-stdin",
        stdin="from-stdin\n",
    )
    assert code == 0, out
    code, out = cli("bmc", "set", "gpu03", "--protocol", "ipmi", "--address", "h", "--username", "u")
    assert (code, out) == (2, "give the BMC password with exactly one of --password-stdin and --password-env VAR")
    code, out = cli("bmc", "show", "gpu01", "-o", "json")
    assert json.loads(out)["address"] == "bmc1"
    assert "from-the-env" not in out
    code, out = cli("power", "on", "gpu01", "--dry-run")
    assert code == 0
    assert "ipmitool -I lanplus -H bmc1 -p 623 -U root -E -C 3" in out
    assert "from-the-env" not in out
    assert fleet.bmcs["bmc1"].actions() == []
    code, out = cli("power", "on", "gpu01", "-o", "json")
    assert code == 0, out
    assert json.loads(out)["targets"][0]["data"]["power_state"] == "on"
    assert fleet.seen[-1].password == "from-the-env"
    fleet.bmcs["10.140.0.3"].fail = "10.140.0.3:623: no answer within 5 s"
    code, out = cli("power", "status", "gpu[01,03]")
    assert code == 1  # gpu03's BMC failed, so the task did: the CLI exits 1 after the per-node table
    assert "no answer within 5 s" in out
    assert "gpu01" in out
    code, out = cli("power", "status", "--cached", "gpu01", "-o", "json")
    assert json.loads(out)[0]["power_state"] == "on"


def test_the_power_page_shows_each_node_bmc_and_state(faked: TestClient, fleet: FakeFleet) -> None:
    for bmc in fleet.bmcs.values():
        bmc.lag = 0
    task = faked.post("/api/v1/power/on", json={"nodes": "gpu[01-02]"}).json()
    _wait(faked, task)
    assert faked.post("/api/v1/nodes", json={"names": ["cpu01"]}).status_code == 201
    operator = logged_in(faked, "operator", "olga")
    page = operator.get("/power")
    assert page.status_code == 200
    assert 'href="/power"' in page.text.split('aria-label="Main"', 1)[1].split("</nav>", 1)[0]
    assert '<tr id="gpu01" data-node="gpu01" data-power="on">' in page.text
    assert '<tr id="gpu03" data-node="gpu03" data-power="">' in page.text
    assert '<span data-power="on">2 on</span>' in page.text
    assert '<span data-power="not read">2 not read</span>' in page.text
    assert '<span data-power="no BMC">1 no BMC</span>' in page.text
    assert f'<tr data-task="{task["id"]}" data-state="succeeded">' in page.text
    only_on = operator.get("/power?power=on", headers={"HX-Request": "true"})
    assert only_on.text.startswith('<section id="live"')
    assert "gpu01" in only_on.text
    assert 'id="gpu03"' not in only_on.text
    viewer = logged_in(faked, "viewer", "vera")
    assert viewer.get("/power").status_code == 403
    assert 'href="/power"' not in viewer.get("/nodes").text
