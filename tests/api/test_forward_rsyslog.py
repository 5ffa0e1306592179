"""Forwarding to a real collector: Debian's rsyslog receiving JSON lines on its imtcp input (as
fluent-bit's tcp input or Vector's socket source would). The head gets an Xid line and an ordinary
one over an agent channel; the Xid event, and the leader's new-template event for the other line,
arrive in rsyslog's output file, one JSON object per line; the ordinary line itself does not."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.api.app import create_app
from gpufleet.core.clock import FakeClock
from gpufleet.core.config import load_settings
from tests.api.test_channel import _credential
from tests.services import install_tools

pytestmark = pytest.mark.rsyslog
XID79 = "NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
PEERMEM = "nvidia-peermem: module verification failed: signature and/or required key missing - tainting kernel"


def rsyslogd() -> str:
    return install_tools(("rsyslogd",), "rsyslog.sh")["rsyslogd"]


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """rsyslogd as a plain process: imtcp on a free port, every message's raw text to a file."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    out = tmp_path / "collected.jsonl"
    config = tmp_path / "rsyslog.conf"
    config.write_text(
        f'global(workDirectory="{tmp_path}")\n'
        'module(load="imtcp")\n'
        'template(name="raw" type="string" string="%rawmsg%\\n")\n'
        f'ruleset(name="collect") {{ action(type="omfile" file="{out}" template="raw") }}\n'
        f'input(type="imtcp" address="127.0.0.1" port="{port}" ruleset="collect")\n'
    )
    process = subprocess.Popen(
        [rsyslogd(), "-n", "-f", str(config), "-i", str(tmp_path / "rsyslogd.pid")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            if process.poll() is not None:
                pytest.fail(f"rsyslogd exited: {process.stdout.read().decode() if process.stdout else ''}")
            time.sleep(0.05)
    yield port, out
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=10)


def collected(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []


def wait_for(condition: Any, what: str) -> None:
    deadline = time.monotonic() + 15
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_events_reach_rsyslog_as_json_lines(
    collector: tuple[int, Path], sessions: sessionmaker[Session], clock: FakeClock, tmp_path: Path, admin_token: str
) -> None:
    port, out = collector
    settings = load_settings(
        client_file=tmp_path / "none.toml",
        data_dir=tmp_path,
        log_forward_url=f"tcp://127.0.0.1:{port}",
        log_template_learning_s=0,
    )
    app = create_app(settings, sessions, clock, run_loops=False)
    with TestClient(app, headers={"Authorization": f"Bearer {admin_token}"}) as client:
        ctx = client.app.state.ctx  # type: ignore[attr-defined]
        credential = _credential(client, "gpu017")
        lines = [
            {"ts": 1_800_000_000.0, "source": "/dev/kmsg", "line": PEERMEM},
            {
                "ts": 1_800_000_001.0,
                "source": "/dev/kmsg",
                "line": XID79,
                "kind": "xid",
                "code": 79,
                "severity": "critical",
                "action": "reboot",
                "pci_bus": "0000:91:00",
                "gpu": 3,
            },
        ]
        headers = {"Authorization": f"Bearer {credential}"}
        with client.websocket_connect("/api/v1/agent/channel", headers=headers) as ws:
            ws.send_text(json.dumps({"type": "hello", "heartbeat_interval_s": 1.0}))
            ws.receive_json()
            ws.send_text(json.dumps({"type": "logs", "lines": lines}))
            ws.send_text(json.dumps({"type": "heartbeat", "seq": 1}))
        wait_for(lambda: ctx.monitoring.flush_log_lines_once() == 2, "both lines stored")
        wait_for(lambda: len(collected(out)) == 1, "the Xid event at rsyslog")
        ctx.loops.lead_once()
        assert ctx.monitoring.mine_templates_once() == 2
        wait_for(lambda: len(collected(out)) == 2, "the new-template event at rsyslog")
    xid, template = collected(out)
    assert (xid["node"], xid["kind"], xid["code"], xid["gpu"], xid["line"]) == ("gpu017", "xid", 79, 3, XID79)
    assert xid["time"] == "2027-01-15T08:00:01.000000Z"
    assert (template["node"], template["kind"], template["severity"], template["line"]) == (
        "gpu017",
        "log_template",
        "info",
        PEERMEM,
    )
