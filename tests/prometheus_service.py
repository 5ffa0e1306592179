"""Debian's Prometheus and promtool for the tests, through scripts/services/prometheus.sh.

Where they are missing and cannot be installed (not root, no network), the tests that need them
skip with the reason, or fail under GPUFLEET_REQUIRE_SERVICES=1 (CI), like PostgreSQL's.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from filelock import FileLock

from tests.services import install_tools

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "services" / "prometheus.sh"


def promtool() -> str:
    """The path of promtool, installing Debian's prometheus package first if need be (and allowed)."""
    with FileLock("/tmp/gpufleet-test-prometheus-install.lock"):
        return install_tools(("prometheus", "promtool"), "prometheus.sh")["promtool"]


def run_promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


@contextmanager
def prometheus_server(config: Path, state: Path, port: int) -> Iterator[str]:
    """A Prometheus server with `config` on 127.0.0.1:`port`, its data under `state`; yields its URL."""
    promtool()
    env = {**os.environ, "GPUFLEET_PROM_STATE": str(state), "GPUFLEET_PROM_PORT": str(port)}
    started = subprocess.run(
        ["bash", str(SCRIPT), "start", str(config)], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert started.returncode == 0, started.stderr
    try:
        yield started.stdout.strip().splitlines()[-1]
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop"], env=env, capture_output=True, timeout=60, check=False)


def query(url: str, promql: str) -> list[dict[str, Any]]:
    """An instant query's result vector: [{"metric": {labels}, "value": [ts, "value"]}, ...]."""
    response = httpx.get(f"{url}/api/v1/query", params={"query": promql}, timeout=10)
    response.raise_for_status()
    result: list[dict[str, Any]] = response.json()["data"]["result"]
    return result
