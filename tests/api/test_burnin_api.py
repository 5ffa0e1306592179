"""Burn-in through the REST API and the CLI: start, node show, list, cancel, resume rules, profiles, and
bad requests refused whole."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from gpufleet.cli.app import app as cli_app
from gpufleet.cli.state import CliState
from gpufleet.core.db import transaction
from gpufleet.lifecycle.models import BurnIn
from tests.api.dashboard_helpers import up_node
from tests.conftest import cli_through


def _cli(*args: str, code: int = 0) -> str:
    result = CliRunner().invoke(cli_app, list(args), obj=CliState(), catch_exceptions=False)
    assert result.exit_code == code, result.output
    return result.stdout


def _advance(client: TestClient) -> None:
    ctx = client.app.state.ctx  # type: ignore[attr-defined]
    from gpufleet.lifecycle import burnin

    with transaction(ctx.sessions) as s:
        burnin.advance(s, ctx.clock, ctx.monitoring.judge.workload, "root")


def test_burn_in_from_the_cli_holds_the_node_and_shows_in_node_show(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    cli_through(client, monkeypatch)
    up_node(client, "n1", gpus=2)
    up_node(client, "n2", gpus=2)
    out = _cli("node", "burn-in", "n[1-2]", "--profile", "quick", "-o", "json")
    runs = json.loads(out)
    assert [(r["node"], r["state"], r["profile"]) for r in runs] == [
        ("n1", "queued", "quick"),
        ("n2", "queued", "quick"),
    ]
    assert len({r["batch"] for r in runs}) == 1
    assert [s["name"] for s in runs[0]["steps"]][:2] == ["gemm", "gpu-memory"]

    _advance(client)  # the first step's job is placed on each node
    shown = client.get("/api/v1/nodes/n1").json()
    assert shown["hold"] == "burn-in"
    assert shown["drain_reason"].startswith("gpufleet: burn-in")
    assert shown["burn_in"]["state"] == "running"
    assert shown["burn_in"]["steps"][0]["threshold"] == 600.0  # the H200 threshold of quick's gemm
    text = _cli("node", "show", "n1")
    assert "Held out of service: burn-in" in text
    assert "Burn-in " in text
    assert "≥ 600" in text

    # A node in burn-in is not resumed by hand: the run would go on under a job's feet.
    answer = client.post("/api/v1/nodes/n1/resume")
    assert answer.status_code == 409
    assert "held by burn-in" in answer.json()["detail"]

    listed = json.loads(_cli("burn-in", "list", "--node", "n1", "-o", "json"))
    assert [r["id"] for r in listed] == [runs[0]["id"]]
    cancelled = _cli("burn-in", "cancel", str(runs[0]["id"]))
    assert "cancelled; the node stays drained" in cancelled
    after = client.get("/api/v1/nodes/n1").json()
    assert after["hold"] is None
    assert client.post("/api/v1/nodes/n1/resume").status_code == 200
    again = client.post(f"/api/v1/burn-ins/{runs[0]['id']}/cancel")
    assert again.status_code == 409


def test_bad_burn_in_requests_start_nothing(client: TestClient) -> None:
    up_node(client, "n1", gpus=1)
    unknown_profile = client.post("/api/v1/burn-ins", json={"nodes": ["n1"], "profile": "nope"})
    assert unknown_profile.status_code == 400
    assert "no burn-in profile 'nope'; there are: cpu, full, quick" in unknown_profile.json()["detail"]
    unknown_node = client.post("/api/v1/burn-ins", json={"nodes": ["n[1-3]"], "profile": "quick"})
    assert unknown_node.status_code == 404
    assert "n2, n3" in unknown_node.json()["detail"]
    assert client.post("/api/v1/burn-ins", json={"nodes": ["n1"], "profile": "Bad Name"}).status_code == 422
    assert client.post("/api/v1/burn-ins", json={"nodes": [], "profile": "quick"}).status_code == 422
    assert client.get("/api/v1/burn-ins/99").status_code == 404
    ctx = client.app.state.ctx  # type: ignore[attr-defined]
    with transaction(ctx.sessions, readonly=True) as s:
        assert s.query(BurnIn).count() == 0
    assert client.get("/api/v1/nodes/n1").json()["hold"] is None

    assert client.post("/api/v1/burn-ins", json={"nodes": ["n1"], "profile": "cpu"}).status_code == 201
    twice = client.post("/api/v1/burn-ins", json={"nodes": ["n1"], "profile": "cpu"})
    assert twice.status_code == 409


def test_profiles_are_listed_with_admin_files_and_their_problems(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    cli_through(client, monkeypatch)
    ctx = client.app.state.ctx  # type: ignore[attr-defined]
    mine = ctx.settings.data_dir / "burnin-profiles"
    mine.mkdir()
    (mine / "mine.toml").write_text(
        'name = "mine"\ndescription = "disk only"\n[[steps]]\nkind = "disk"\nthreshold = { default = 100 }\n'
    )
    (mine / "broken.toml").write_text("name = ")
    found = client.get("/api/v1/burn-in-profiles").json()
    by_name = {p["name"]: p for p in found["profiles"]}
    assert by_name["quick"]["origin"] == "built-in"
    assert by_name["mine"]["origin"].endswith("mine.toml")
    assert by_name["quick"]["steps"][0]["threshold"]["h200"] == 600.0
    assert any("broken.toml: not valid TOML" in p for p in found["problems"])
    text = CliRunner().invoke(cli_app, ["burn-in", "profiles"], obj=CliState(), catch_exceptions=False)
    assert "disk only" in text.stdout
    assert "h200: 600" in text.stdout
