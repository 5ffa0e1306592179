"""GET /api/v1/logs: the lines agents sent over the channel, stored by the flush, searched by filter."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.api.app import create_app
from gpufleet.core.clock import FakeClock
from gpufleet.core.config import load_settings
from gpufleet.core.errors import ConfigError
from gpufleet.protocol.logs import LogLine
from tests.api.test_channel import _credential

XID79 = "NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."


def test_lines_sent_on_the_channel_are_stored_and_searchable(client: TestClient) -> None:
    monitoring = client.app.state.ctx.monitoring  # type: ignore[attr-defined]
    credential = _credential(client, "n1")
    lines = [
        LogLine(ts=1_800_000_000.0, source="/dev/kmsg", line="IPv6: ADDRCONF(NETDEV_CHANGE): eth0: link becomes ready"),
        LogLine(
            ts=1_800_000_001.0,
            source="/dev/kmsg",
            line=XID79,
            kind="xid",
            code=79,
            severity="critical",
            action="reboot",
            pci_bus="0000:91:00",
            gpu=3,
        ),
    ]
    with client.websocket_connect("/api/v1/agent/channel", headers={"Authorization": f"Bearer {credential}"}) as ws:
        ws.send_text(json.dumps({"type": "hello", "heartbeat_interval_s": 1.0}))
        ws.receive_json()
        ws.send_text(json.dumps({"type": "logs", "lines": [line.model_dump() for line in lines]}))
        ws.send_text(json.dumps({"type": "heartbeat", "seq": 1}))  # read after the lines: they are in
    deadline = time.monotonic() + 5
    stored = 0
    while stored < 2 and time.monotonic() < deadline:  # the server thread buffers the lines asynchronously
        stored += monitoring.flush_log_lines_once()
        time.sleep(0.01)
    assert stored == 2

    every = client.get("/api/v1/logs").json()
    assert [(r["node"], r["kind"], r["at"]) for r in every] == [
        ("n1", "xid", "2027-01-15T08:00:01Z"),
        ("n1", None, "2027-01-15T08:00:00Z"),
    ]
    events = client.get("/api/v1/logs", params={"events": True, "severity": "warning"}).json()
    assert [(e["code"], e["gpu"], e["pci_bus"], e["line"]) for e in events] == [(79, 3, "0000:91:00", XID79)]
    assert [r["kind"] for r in client.get("/api/v1/logs", params={"q": "fallen bus"}).json()] == ["xid"]
    assert client.get("/api/v1/logs", params={"node": "n2"}).json() == []
    assert client.get("/api/v1/logs", params={"severity": "loud"}).status_code == 422
    assert client.get("/api/v1/logs", params={"limit": 0}).status_code == 422

    # The leader mines them: both are templates its first day learns (no new-template events yet).
    client.app.state.ctx.loops.lead_once()  # type: ignore[attr-defined]
    assert monitoring.mine_templates_once() == 2
    templates = client.get("/api/v1/logs/templates").json()
    assert sorted((t["category"], t["count"], t["first_node"], t["learned"]) for t in templates) == [
        ("", 1, "n1", True),
        ("", 1, "n1", True),
    ]
    assert any("<PCI>" in t["template"] for t in templates)
    assert client.get("/api/v1/logs/templates", params={"new": True}).json() == []
    assert client.get("/api/v1/logs/templates", params={"category": "h200"}).json() == []


def test_a_malformed_logs_message_closes_the_channel_and_stores_nothing(client: TestClient) -> None:
    monitoring = client.app.state.ctx.monitoring  # type: ignore[attr-defined]
    credential = _credential(client, "n1")
    with client.websocket_connect("/api/v1/agent/channel", headers={"Authorization": f"Bearer {credential}"}) as ws:
        ws.send_text(json.dumps({"type": "hello", "heartbeat_interval_s": 1.0}))
        ws.receive_json()
        ws.send_text(json.dumps({"type": "logs", "lines": [{"ts": 1.0, "source": "x", "line": "y" * 5000}]}))
        closed = ws.receive()
    assert closed["type"] == "websocket.close"
    assert monitoring.flush_log_lines_once() == 0


def test_a_bad_forwarding_target_stops_the_head_with_its_reason(
    sessions: sessionmaker[Session], clock: FakeClock, tmp_path: Path
) -> None:
    settings = load_settings(client_file=tmp_path / "none.toml", data_dir=tmp_path, log_forward_url="udp://x:1")
    with pytest.raises(ConfigError, match="log_forward_url must start with tcp://, http:// or https://"):
        create_app(settings, sessions, clock, run_loops=False)
