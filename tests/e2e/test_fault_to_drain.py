"""Issue 4's must-show, with real processes: a simulated Xid 79 fails the node (naming the GPU),
drains it, fires an alert a webhook receives, and after `sim heal` the node returns to service on its
own; a node drained by a person stays drained."""

import json
import signal
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import Head, cli_json, run_cli, start_sim, wait_for

pytestmark = pytest.mark.e2e
FAST = {"GPUFLEET_METRICS_INTERVAL_S": "0.5", "GPUFLEET_RESUME_AFTER_HEALTHY_SAMPLES": "3"}


class Receiver:
    """A webhook receiver: records every JSON body POSTed to it."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        received = self.bodies

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                received.append(json.loads(self.rfile.read(length)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *_: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def alerts(self) -> list[tuple[str, str, str]]:
        return [(a["labels"]["alertname"], a["status"], a["labels"]["node"]) for b in self.bodies for a in b["alerts"]]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.server.shutdown()


@pytest.fixture
def fast_head(tmp_path: Path) -> Iterator[Head]:
    head = Head(tmp_path, env=FAST).start()
    yield head
    head.kill(signal.SIGTERM)


def test_xid79_drains_alerts_and_heals_while_a_manual_drain_stays(
    fast_head: Head, receiver: Receiver, tmp_path: Path
) -> None:
    head = fast_head
    added = run_cli(tmp_path, "alert", "receiver", "add-webhook", "ops", "--url", receiver.url, server=head.url)
    assert added.returncode == 0, added.stderr
    sim = start_sim(tmp_path, head.url, head.join_token(2), 2, env=FAST)
    try:

        def health() -> dict[str, dict[str, Any]]:
            return {row["node"]: row for row in head.api("GET", "/api/v1/health")}

        wait_for(lambda: len(health()) == 2 and all(r["health"] == "healthy" for r in health().values()), 60)
        assert (
            run_cli(tmp_path, "node", "drain", "sim002", "--reason", "reseating a cable", server=head.url).returncode
            == 0
        )

        injected = run_cli(tmp_path, "sim", "fault", "sim001", "--kind", "xid79", "--gpu", "3", server=head.url)
        assert injected.returncode == 0, injected.stderr
        wait_for(lambda: health()["sim001"]["drained"], 10)
        node = health()["sim001"]
        assert node["health"] == "failed"
        assert "GPU 3: Xid 79 (GPU has fallen off the bus)" in node["reasons"]
        # Named after the Xid, or after the lost GPU when the agent's sample saw the GPU gone first.
        assert node["drain_reason"].startswith("gpufleet: GPU 3")

        shown = run_cli(tmp_path, "health", "sim001", server=head.url)
        assert shown.returncode == 1  # a failed node: scripts can test the exit code
        assert "Xid 79" in shown.stdout
        firing = cli_json(tmp_path, head.url, "alert", "list", "--status", "firing")
        assert [(a["rule"], a["node_name"]) for a in firing] == [("NodeFailed", "sim001")]
        wait_for(lambda: ("NodeFailed", "firing", "sim001") in receiver.alerts(), 15)

        healed = run_cli(tmp_path, "sim", "heal", "sim001", server=head.url)
        assert healed.returncode == 0, healed.stderr
        wait_for(lambda: not health()["sim001"]["drained"], 20)  # back in service on its own
        assert health()["sim001"]["health"] == "healthy"
        wait_for(lambda: ("NodeFailed", "resolved", "sim001") in receiver.alerts(), 15)

        manual = health()["sim002"]
        assert (manual["health"], manual["drained"], manual["drain_reason"]) == ("healthy", True, "reseating a cable")
    finally:
        sim.send_signal(signal.SIGINT)
        sim.wait(timeout=30)
