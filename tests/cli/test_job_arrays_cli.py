"""gpufleet job submit --array, list (collapsed as squeue shows arrays, and -r), show, and cancel of a
whole array, one task (1234_7) or a plain job, through the real client against the app."""

import json

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from gpufleet.cli.app import app as cli_app
from gpufleet.cli.jobs import job_label, parse_job_ref
from gpufleet.cli.state import CliState
from gpufleet.core.errors import InvalidInput, NotFound
from gpufleet.jobs.tick import run_tick
from tests.api.dashboard_helpers import up_node
from tests.conftest import cli_through
from tests.jobs.helpers import TICK


def _cli(*args: str) -> str:
    result = CliRunner().invoke(cli_app, list(args), obj=CliState(), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.stdout


def test_the_array_life_cycle_from_the_cli(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    cli_through(client, monkeypatch)
    up_node(client, "n1", gpus=2)
    client.post("/api/v1/users", json={"username": "alice"})
    out = _cli("job", "submit", "--user", "alice", "--array", "0-9%2", "--", "train", "--lr", "0.1")
    array = int(out.split()[3])
    assert out == f"submitted job array {array} (10 tasks; pending: submitted: waiting for the scheduler)\n"
    plain = json.loads(_cli("job", "submit", "--user", "alice", "-o", "json", "--gpus-per-node", "2", "--", "x"))
    assert plain["array_job_id"] is None
    ctx = client.app.state.ctx  # type: ignore[attr-defined]
    run_tick(ctx.sessions, ctx.clock, TICK)

    listed = _cli("job", "list")
    assert f"{array}_[2-9%2]" in listed
    assert f"{array}_0 " in listed
    assert f"{array}_1 " in listed
    assert "11 jobs: 2 running, 9 pending" in listed
    expanded = _cli("job", "list", "-r")
    assert all(f"{array}_{task} " in expanded for task in range(10))
    rows = json.loads(_cli("job", "list", "-o", "json"))
    assert [r["array_pending"] for r in rows] == [None, None, None, "2-9"]
    assert len(json.loads(_cli("job", "list", "--expand", "-o", "json"))) == 11

    shown = _cli("job", "show", f"{array}_3")
    assert f"{array}_3 of 10 tasks, at most 2 at once" in shown
    assert "Array task" not in _cli("job", "show", str(plain["id"]))

    assert _cli("job", "cancel", f"{array}_3").startswith(f"job {array}_3: cancelled (cancelled by ")
    assert _cli("job", "cancel", str(array)) == f"job array {array}: 9 of its 10 tasks cancelled\n"
    cancelled = json.loads(_cli("job", "cancel", str(plain["id"]), "-o", "json"))
    assert [(c["id"], c["state"]) for c in cancelled] == [(plain["id"], "cancelled")]
    with pytest.raises(NotFound, match=f"job array {array} has no task 42"):
        CliRunner().invoke(cli_app, ["job", "cancel", f"{array}_42"], obj=CliState(), catch_exceptions=False)


def test_job_references_and_labels() -> None:
    assert parse_job_ref("1234") == (1234, None)
    assert parse_job_ref(" 1234_7 ") == (1234, 7)
    for bad in ["", "x", "12_", "_3", "1_2_3", "-4"]:
        with pytest.raises(InvalidInput, match="invalid job id"):
            parse_job_ref(bad)
    assert job_label({"id": 9, "array_job_id": None}) == "9"
    task = {"id": 1240, "array_job_id": 1234, "array_task_id": 6, "array_pending": None}
    assert job_label(task) == "1234_6"
    collapsed = task | {"array_pending": "5-999", "array_throttle": 50}
    assert job_label(collapsed) == "1234_[5-999%50]"
    assert job_label(collapsed | {"array_throttle": None}) == "1234_[5-999]"
