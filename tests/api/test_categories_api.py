"""Categories and node settings over HTTP and through the CLI: CRUD, settings with their origin in the
node's detail (health policy included), refusals that change nothing, audit records, the Slurm
partition from the `partition` setting, the dashboard's Categories page and node page."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from gpufleet.cli.app import app as cli_app
from gpufleet.cli.state import CliState
from gpufleet.core.errors import Conflict, InvalidInput
from tests.api.dashboard_helpers import logged_in, up_node
from tests.conftest import cli_through


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    """SQLite only: the same service calls run on both backends in tests/inventory/test_categories.py."""
    return f"sqlite:///{tmp_path / 'gpufleet.db'}"


def _settings(detail: dict[str, object]) -> dict[str, tuple[object, object]]:
    settings = detail["settings"]
    assert isinstance(settings, dict)
    return {k: (v["value"], v["origin"]) for k, v in settings.items()}


def test_categories_and_node_settings_over_the_api(client: TestClient) -> None:
    made = client.post(
        "/api/v1/categories",
        json={"name": "h200", "description": "HGX H200", "settings": {"partition": "gpu", "expected_gpus": "8"}},
    )
    assert made.status_code == 201, made.text
    assert made.json()["settings"] == {"partition": "gpu", "expected_gpus": 8}
    assert client.post("/api/v1/categories", json={"name": "h200"}).status_code == 409
    assert client.post("/api/v1/nodes", json={"names": ["gpu[001-002]"], "category": "h200"}).status_code == 201
    assert client.post("/api/v1/nodes", json={"names": ["cpu01"], "category": "cpu"}).status_code == 201  # made
    client.put("/api/v1/health-policies/h200", json={"gpu_temp_c": 85})

    changed = client.patch("/api/v1/nodes/gpu001/settings", json={"set": {"kernel_params": "quiet"}})
    assert changed.status_code == 200, changed.text
    assert _settings(changed.json())["kernel_params"] == ("quiet", "node")
    detail = client.get("/api/v1/nodes/gpu001").json()
    assert _settings(detail) == {
        "software_image": (None, "default"),
        "sync_target": ("root@{address}:/", "default"),
        "partition": ("gpu", "category"),
        "kernel_params": ("quiet", "node"),
        "expected_gpus": (8, "category"),
        "gpu_model": (None, "default"),
        "mig_layout": (None, "default"),
        "gpu_sharing": ("exclusive", "default"),
        "health_policy": ({"gpu_temp_c": 85.0}, "category"),
    }
    assert _settings(client.get("/api/v1/nodes/cpu01").json())["health_policy"] == ({}, "default")

    # Refusals change nothing: an unknown key beside a good one, a bad value, a non-empty category.
    bad = client.patch("/api/v1/categories/h200", json={"set": {"partition": "x", "colour": "red"}})
    assert (bad.status_code, "unknown setting 'colour'" in bad.json()["detail"]) == (400, True)
    bad = client.patch("/api/v1/nodes/gpu001/settings", json={"set": {"expected_gpus": -1}, "category": "other"})
    assert bad.status_code == 400
    assert client.delete("/api/v1/categories/h200").status_code == 409
    shown = client.get("/api/v1/categories/h200").json()
    assert (shown["settings"], shown["nodes"], shown["node_names"]) == (
        {"partition": "gpu", "expected_gpus": 8},
        2,
        ["gpu001", "gpu002"],
    )
    assert shown["resolved"]["partition"] == {"value": "gpu", "origin": "category"}
    assert client.get("/api/v1/nodes/gpu001").json()["category"] == "h200"
    assert [(c["name"], c["nodes"]) for c in client.get("/api/v1/categories").json()] == [("cpu", 1), ("h200", 2)]

    # Moving the last node out lets the category go; every change is on the audit log.
    assert client.patch("/api/v1/nodes/cpu01/settings", json={"category": ""}).json()["category"] is None
    assert client.delete("/api/v1/categories/cpu").status_code == 204
    assert client.get("/api/v1/categories/cpu").status_code == 404
    audit = client.get("/api/v1/audit", params={"limit": 50}).json()
    records = [(r["action"], r["target"], r["result"]) for r in audit]
    assert ("categories.update_category", "category h200: partition=x colour=red", 400) in records
    assert ("categories.update_node_settings", "node gpu001: kernel_params=quiet", 200) in records
    assert ("categories.remove_category", "category cpu", 204) in records


def test_the_slurm_partition_the_categories_page_and_the_node_pages_settings(client: TestClient) -> None:
    client.post("/api/v1/categories", json={"name": "h200", "settings": {"gpu_model": "H200"}})
    up_node(client, "gpu001", category="h200")
    up_node(client, "gpu002", category="h200")
    client.patch("/api/v1/nodes/gpu001/settings", json={"set": {"partition": "debug"}})
    # The `partition` setting, where set, names the node's Slurm partition; else its category does.
    conf = client.get("/api/v1/slurm/config").json()["slurm_conf"]
    assert "PartitionName=h200 Nodes=gpu002 State=UP" in conf
    assert "PartitionName=debug Nodes=gpu001 State=UP" in conf
    browser = logged_in(client)  # a viewer
    page = browser.get("/categories")
    assert page.status_code == 200
    assert 'href="/categories" aria-current="page"' in page.text
    row = page.text.split('id="category-h200"', 1)[1].split("</tr>", 1)[0]
    assert re.findall(r"<td>(\d+)</td>", row) == ["2"]
    assert 'data-setting="gpu_model">gpu_model=H200<' in row
    node_page = browser.get("/nodes/gpu001").text
    assert 'data-setting="partition" data-origin="node"' in node_page
    assert 'data-setting="gpu_model" data-origin="category"' in node_page
    assert 'data-setting="kernel_params" data-origin="default"' in node_page
    assert browser.get("/categories", headers={"HX-Request": "true"}).text.startswith('<section id="live"')


def test_the_cli_sets_and_shows_settings_with_their_origin(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    cli_through(client, monkeypatch)

    def cli(*args: str) -> str:
        result = CliRunner().invoke(cli_app, list(args), obj=CliState(), catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return result.stdout

    assert cli("category", "create", "h200", "--set", "partition=gpu", "--set", "expected_gpus=8") == (
        "created category h200: partition=gpu, expected_gpus=8\n"
    )
    cli("node", "add", "gpu[001-002]", "--category", "h200")
    assert cli("node", "set", "gpu001", "kernel_params=quiet", "partition=") == (
        "node gpu001: kernel_params=quiet, partition=none\n"
    )
    dry = cli("node", "set", "gpu001", "gpu_model=H200", "--dry-run")
    assert "gpu_model: - (default) -> H200" in dry
    shown = cli("node", "show", "gpu001")
    rows = {line.split("│")[1].strip(): line for line in shown.splitlines() if line.count("│") == 4}
    assert re.search(r"quiet\s+│ node", rows["kernel_params"])
    assert re.search(r"-\s+│ node", rows["partition"])  # "none", set on the node over its category's
    assert re.search(r"8\s+│ category", rows["expected_gpus"])
    assert re.search(r"\(built in\)\s+│ default", rows["health_policy"])
    assert json.loads(cli("node", "unset", "gpu001", "partition", "-o", "json"))["settings"]["partition"] == {
        "value": "gpu",
        "origin": "category",
    }
    listed = json.loads(cli("category", "list", "-o", "json"))
    assert [(c["name"], c["nodes"], c["settings"]) for c in listed] == [
        ("h200", 2, {"partition": "gpu", "expected_gpus": 8})
    ]
    assert "gpu001, gpu002" in cli("category", "show", "h200")
    cli("category", "unset", "h200", "expected_gpus")
    with pytest.raises(InvalidInput, match="unknown setting 'colour'"):
        CliRunner().invoke(cli_app, ["category", "set", "h200", "colour=red"], obj=CliState(), catch_exceptions=False)
    with pytest.raises(Conflict, match="still has 2 node"):
        CliRunner().invoke(cli_app, ["category", "remove", "h200"], obj=CliState(), catch_exceptions=False)
    assert json.loads(cli("category", "show", "h200", "-o", "json"))["settings"] == {"partition": "gpu"}
