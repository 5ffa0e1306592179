"""A hostlist with a number of thousands of digits is a 400 on every route and CLI command that reads
one, never a 500 (core.hostlist bounds the digits; see tests/core/test_hostlist.py)."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from gpufleet.cli.app import app as cli_app
from gpufleet.cli.state import CliState
from gpufleet.core.errors import InvalidInput
from tests.api.dashboard_helpers import logged_in

# Pages, forms and input parsing: HTTP translation, the same on both databases (the domain tests run both).
pytestmark = pytest.mark.one_database

HUGE = "n[1-" + "9" * 4000 + "]"  # under the routes' 4,096-character limits, over Python's 4,300 digits
HUGE_NAME = "n" + "9" * 5000  # where a route takes a longer string


@pytest.mark.parametrize(
    ("method", "path", "kwargs"),
    [
        ("GET", "/api/v1/nodes", {"params": {"names": HUGE_NAME}}),
        ("GET", "/api/v1/gpus", {"params": {"nodes": HUGE_NAME}}),
        ("GET", "/api/v1/health", {"params": {"names": HUGE_NAME}}),
        ("DELETE", "/api/v1/nodes", {"params": {"names": HUGE_NAME}}),
        ("POST", "/api/v1/nodes", {"json": {"names": [HUGE]}}),
        ("POST", "/api/v1/nodes/n1/clone", {"json": {"names": [HUGE]}}),
        ("GET", "/api/v1/power", {"params": {"nodes": HUGE}}),
        ("POST", "/api/v1/power/plans", {"json": {"action": "on", "nodes": HUGE}}),
        ("POST", "/api/v1/power/status", {"json": {"nodes": HUGE}}),
        ("POST", "/api/v1/sync", {"json": {"nodes": HUGE, "dry_run": True}}),
    ],
)
def test_api_answers_400(client: TestClient, method: str, path: str, kwargs: dict[str, Any]) -> None:
    assert client.post("/api/v1/nodes", json={"names": ["n1"]}).status_code == 201  # a node to clone
    answer = client.request(method, path, **kwargs)
    assert answer.status_code == 400, (path, answer.status_code, answer.text[:200])
    assert "more than 63 digits" in answer.json()["detail"]


def test_the_dashboards_node_search_says_so(client: TestClient) -> None:
    page = logged_in(client).get("/nodes", params={"q": HUGE})
    assert page.status_code == 400
    assert "more than 63 digits" in page.text


def test_the_cli_says_so(client: TestClient) -> None:
    runner = CliRunner()
    with pytest.raises(InvalidInput, match="more than 63 digits"):  # gpufleet's main prints it, exit 2
        runner.invoke(cli_app, ["node", "add", "--dry-run", HUGE], obj=CliState(), catch_exceptions=False)
