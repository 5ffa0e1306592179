"""`gpufleet demo` (what `make demo` runs): a head and simulated nodes in one process, with sample
projects and jobs that keep the cluster busy, one of them waiting on its project's quota."""

import signal
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import GPUFLEET, base_env, free_port, stop, wait_for

pytestmark = pytest.mark.e2e


def test_the_demo_runs_sample_jobs(tmp_path: Path) -> None:
    port = free_port()
    data = tmp_path / "demo"
    log = (tmp_path / "demo.log").open("wb")
    proc = subprocess.Popen(
        [*GPUFLEET, "demo", "--data-dir", str(data), "--listen", f"127.0.0.1:{port}", "--nodes", "4"],
        env={k: v for k, v in base_env(tmp_path).items() if k != "GPUFLEET_LOG_LEVEL"},  # INFO, as `make demo`
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"

    def jobs() -> list[dict[str, Any]]:
        token = (data / "admin-token").read_text().strip()
        response = httpx.get(url + "/api/v1/jobs", headers={"Authorization": f"Bearer {token}"}, timeout=5)
        response.raise_for_status()
        found: list[dict[str, Any]] = response.json()
        return found

    def busy() -> bool:
        try:
            listed = jobs()
        except (httpx.HTTPError, OSError):
            return False
        return sum(j["state"] == "running" for j in listed) >= 5

    try:
        wait_for(busy, 90, interval=0.5)
        # The demo may still be submitting its last jobs when five run.
        wait_for(lambda: {"llm-pretrain", "notebook", "sweep-0"} <= {j["name"] for j in jobs()}, 30, interval=0.5)
        listed = jobs()
        gang = next(j for j in listed if j["name"] == "llm-pretrain")
        assert gang["state"] == "running"
        assert len(gang["allocation"]) == 2
        wait_for(lambda: any(j["reason"].startswith("quota") for j in jobs()), 30, interval=0.5)
    finally:
        stop(proc, signal.SIGINT)
    terminal = (tmp_path / "demo.log").read_text()
    assert "gpufleet demo is running" in terminal
    assert "gpufleet demo stopped" in terminal
    # The terminal shows the banner and the head's events; a line per agent channel goes to the access log.
    for access_line in ("WebSocket /api/v1/agent/channel", "connection open", "HTTP/1.1"):
        assert access_line not in terminal
        assert access_line in (data / "access.log").read_text()
    assert "node sim001 is up" in terminal
