"""Forwarding events as JSON lines: targets, the record a collector gets, TCP and HTTP delivery,
retries while the collector is down, and a bounded queue."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest

from gpufleet.logs import forward
from gpufleet.logs.forward import EventForwarder, Target, event_json, parse_target

XID = {
    "source": "/dev/kmsg",
    "line": "NVRM: Xid (PCI:0000:91:00): 79, ...",
    "kind": "xid",
    "code": 79,
    "severity": "critical",
    "action": "reboot",
    "pci_bus": "0000:91:00",
    "gpu": 3,
    "device": None,
}


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("udp://collector:5170", "must start with tcp://, http:// or https://"),
        ("collector:5170", "must start with tcp://"),
        ("tcp://collector", "needs a port"),
        ("tcp://:5170", "names no host"),
        ("http://collector:99999/", "bad port"),
    ],
)
def test_a_bad_target_is_refused_with_its_reason(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_target(url)


def test_targets_read_their_transport_and_port() -> None:
    assert parse_target("tcp://fluent-bit:5170") == Target("tcp", "tcp://fluent-bit:5170", "fluent-bit", 5170)
    assert parse_target("https://logs.example/ingest").port == 443


def test_a_collector_gets_time_node_and_classification() -> None:
    assert event_json("gpu017", 1_800_000_000.25, XID, "GPU-0b11d014-1685-04bd-26ed-5fc0bc1c44ae") == {
        "time": "2027-01-15T08:00:00.250000Z",
        "node": "gpu017",
        "kind": "xid",
        "code": 79,
        "severity": "critical",
        "action": "reboot",
        "pci_bus": "0000:91:00",
        "device": None,
        "gpu": 3,
        "source": "/dev/kmsg",
        "line": XID["line"],
        "gpu_uuid": "GPU-0b11d014-1685-04bd-26ed-5fc0bc1c44ae",
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def tcp_collector(port: int, received: list[dict[str, Any]]) -> asyncio.Server:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while line := await reader.readline():
            received.append(json.loads(line))
        writer.close()

    return await asyncio.start_server(serve, "127.0.0.1", port)


async def until(condition: Any) -> None:
    async with asyncio.timeout(10):
        while not condition():  # noqa: ASYNC110 (the condition is another thread's or server's)
            await asyncio.sleep(0.02)


def test_events_reach_a_tcp_collector_as_json_lines_in_order() -> None:
    async def scenario() -> list[dict[str, Any]]:
        port, received = free_port(), []
        server = await tcp_collector(port, received)
        sender = EventForwarder(parse_target(f"tcp://127.0.0.1:{port}"))
        sender.bind(asyncio.get_running_loop())
        sender.submit([event_json(f"n{i}", 1_800_000_000.0 + i, XID) for i in range(3)])
        await until(lambda: len(received) == 3)
        await sender.close()
        server.close()
        return received

    received = asyncio.run(scenario())
    assert [r["node"] for r in received] == ["n0", "n1", "n2"]


def test_a_collector_that_is_down_gets_the_events_once_it_is_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(forward, "BACKOFF_S", (0.1,))

    async def scenario() -> tuple[list[dict[str, Any]], int]:
        port, received = free_port(), []
        sender = EventForwarder(parse_target(f"tcp://127.0.0.1:{port}"))
        sender.bind(asyncio.get_running_loop())
        sender.submit([event_json("n1", 1_800_000_000.0, XID)])
        await asyncio.sleep(0.5)  # refused a few times meanwhile
        server = await tcp_collector(port, received)
        await until(lambda: len(received) == 1)
        sent = sender.sent
        await sender.close()
        server.close()
        return received, sent

    received, sent = asyncio.run(scenario())
    assert [r["node"] for r in received] == ["n1"]
    assert sent == 1


def test_past_the_queue_limit_the_oldest_events_are_dropped_and_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(forward, "QUEUE_LIMIT", 5)
    monkeypatch.setattr(forward, "BACKOFF_S", (60.0,))

    async def scenario() -> tuple[int, list[str]]:
        sender = EventForwarder(parse_target(f"tcp://127.0.0.1:{free_port()}"))  # nobody listens
        sender.bind(asyncio.get_running_loop())
        sender.submit([event_json(f"n{i}", 1_800_000_000.0, XID) for i in range(8)])
        await asyncio.sleep(0.1)
        waiting = [json.loads(line)["node"] for line in sender._pending]
        await sender.close(flush_s=0)
        return sender.dropped, waiting

    dropped, waiting = asyncio.run(scenario())
    assert dropped == 3
    assert waiting == ["n3", "n4", "n5", "n6", "n7"]


class _Collector(BaseHTTPRequestHandler):
    bodies: ClassVar[list[tuple[str, bytes]]] = []
    answer: ClassVar[int] = 204

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        _Collector.bodies.append((self.headers["Content-Type"], body))
        self.send_response(_Collector.answer)
        self.end_headers()

    def log_message(self, *_args: object) -> None:
        pass


def test_events_reach_an_http_collector_as_ndjson_and_a_refusal_is_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(forward, "BACKOFF_S", (0.1,))
    _Collector.bodies, _Collector.answer = [], 503
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    async def scenario() -> None:
        sender = EventForwarder(parse_target(f"http://127.0.0.1:{server.server_port}/ingest"))
        sender.bind(asyncio.get_running_loop())
        sender.submit([event_json("n1", 1_800_000_000.0, XID), event_json("n2", 1_800_000_000.0, XID)])
        await until(lambda: len(_Collector.bodies) >= 2)
        _Collector.answer = 204  # the collector recovers: the same batch goes again
        await until(lambda: sender.sent == 2)
        await sender.close()

    try:
        asyncio.run(scenario())
    finally:
        server.shutdown()
    content_type, body = _Collector.bodies[-1]
    assert content_type == "application/x-ndjson"
    assert [json.loads(line)["node"] for line in body.decode().splitlines()] == ["n1", "n2"]
