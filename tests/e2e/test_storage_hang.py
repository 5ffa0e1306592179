"""Issue 26's must-show for storage, with real processes: a head, three simulated nodes that each require the
shared NFS mount /shared (the agent's real storage collector and checks over a simulated server), and the
CLI. The mount hangs on one node: that node's required-mount check fails within two check intervals, the
node is failed and drained, its agent keeps heartbeating all along, the fleet view says "hung on 1 of 3
nodes", and StorageMountHung fires; healed, the node is back in service."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Head, cli_json, run_cli, start_sim, stop, wait_for

pytestmark = pytest.mark.e2e
CHECKS_S = 2.0
FAST = {
    "GPUFLEET_METRICS_INTERVAL_S": "0.5",
    "GPUFLEET_CHECKS_INTERVAL_S": str(CHECKS_S),
    "GPUFLEET_RESUME_AFTER_HEALTHY_SAMPLES": "3",
}


@pytest.fixture
def fast_head(tmp_path: Path) -> Iterator[Head]:
    head = Head(tmp_path, env=FAST).start()
    yield head
    head.kill(signal.SIGTERM)


def test_a_hung_required_mount_fails_its_node_within_two_check_intervals(fast_head: Head, tmp_path: Path) -> None:
    head = fast_head
    sim = start_sim(tmp_path, head.url, head.join_token(3), 3, "--shared-mount", "/shared", env=FAST)
    try:

        def nodes() -> dict[str, dict[str, Any]]:
            return {row["name"]: row for row in head.nodes()}

        def storage() -> list[dict[str, Any]]:
            result: list[dict[str, Any]] = head.api("GET", "/api/v1/storage")
            return result

        wait_for(lambda: len(nodes()) == 3 and all(n["health"] == "healthy" for n in nodes().values()), 60)
        wait_for(lambda: len(storage()) == 1 and storage()[0]["nodes_total"] == 3, 30)
        assert storage()[0]["verdict"] == "ok on all 3 node(s)"

        injected = run_cli(tmp_path, "sim", "fault", "sim001", "--kind", "mount-hang", server=head.url)
        assert injected.returncode == 0, injected.stderr
        assert "/shared (storage01:/export/shared) does not answer" in injected.stdout
        seen_before = datetime.fromisoformat(nodes()["sim001"]["last_seen"])
        # The functional deadline: the node's verdict changes within two check intervals.
        wait_for(lambda: nodes()["sim001"]["health"] != "healthy", 2 * CHECKS_S)
        node = nodes()["sim001"]
        assert node["health"] == "failed"
        assert "mount:shared: /shared: no answer within 5 s (hung NFS server?)" in node["health_reasons"]
        wait_for(lambda: nodes()["sim001"]["drain_reason"] is not None, 10)
        assert nodes()["sim001"]["drain_reason"].startswith("gpufleet: mount:shared")
        # The agent's loop never blocked: it goes on beating, and the node stays up.
        wait_for(lambda: datetime.fromisoformat(nodes()["sim001"]["last_seen"]) > seen_before, 10)
        assert nodes()["sim001"]["state"] == "up"
        assert {nodes()[n]["health"] for n in ("sim002", "sim003")} == {"healthy"}

        wait_for(lambda: storage()[0]["status"] == "degraded", 10)
        assert storage()[0]["verdict"].startswith("hung on 1 of 3 nodes (sim001), fine on the others")
        listed = run_cli(tmp_path, "storage", "list", "-o", "json", server=head.url)
        assert listed.returncode == 1  # a degraded file system: scripts can test the exit code
        assert json.loads(listed.stdout)[0]["nodes_ok"] == 2
        shown = run_cli(tmp_path, "storage", "list", "--nodes", server=head.url)
        assert "storage01:/export/shared" in shown.stdout
        assert "hung" in shown.stdout
        firing = cli_json(tmp_path, head.url, "alert", "list", "--status", "firing")
        assert ("StorageMountHung", "sim001") in {(a["rule"], a["node_name"]) for a in firing}

        healed = run_cli(tmp_path, "sim", "heal", "sim001", server=head.url)
        assert healed.returncode == 0, healed.stderr
        wait_for(lambda: nodes()["sim001"]["health"] == "healthy" and not nodes()["sim001"]["drain_reason"], 30)
        wait_for(lambda: storage()[0]["status"] == "ok", 10)
        assert run_cli(tmp_path, "storage", "list", server=head.url).returncode == 0
    finally:
        stop(sim, signal.SIGINT)
