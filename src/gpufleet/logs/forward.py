"""Forwarding log events to an external collector as JSON lines (setting `log_forward_url`).

Sites that already run fluent-bit, Vector, Loki, OpenSearch or an rsyslog relay want gpufleet's events
there too, next to everything else they collect. Every collector reads newline-delimited JSON, over
one of two transports:

- `tcp://HOST:PORT`: one JSON object per line on a kept-open connection (fluent-bit's `tcp` input
  with `format json`, Vector's `socket` source, rsyslog's `imtcp`, Logstash's `json_lines` codec);
- `http://...` or `https://...`: batches POSTed as `application/x-ndjson` (fluent-bit's `http` input,
  Vector's `http_server` source, an OpenSearch ingest pipeline behind a small relay).

Events are what the classifier or the template miner named (a line with a kind), never every line.
Each replica forwards the events of the agents connected to it and the leader its new-template
events, so each event is sent once. Sending runs on the head's event loop, off the paths that found
the events; a collector that is down holds up nothing but its own queue: events wait (at most
`QUEUE_LIMIT`, the oldest dropped first and counted) and are retried with a growing pause.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import httpx

log = logging.getLogger(__name__)
QUEUE_LIMIT = 50_000
BATCH = 500
TIMEOUT_S = 10.0
BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0)
FIELDS = ("kind", "code", "severity", "action", "pci_bus", "device", "gpu", "source", "line")


@dataclass(frozen=True)
class Target:
    scheme: str  # tcp | http | https
    url: str
    host: str
    port: int


def parse_target(url: str) -> Target:
    """Raises ValueError naming what is wrong with a `log_forward_url`."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("tcp", "http", "https"):
        raise ValueError(f"log_forward_url must start with tcp://, http:// or https://, not {url!r}")
    if not parts.hostname:
        raise ValueError(f"log_forward_url {url!r} names no host")
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"log_forward_url {url!r} has a bad port") from None
    if parts.scheme == "tcp" and port is None:
        raise ValueError(f"log_forward_url {url!r} needs a port: tcp://HOST:PORT")
    default = 443 if parts.scheme == "https" else 80
    return Target(parts.scheme, url.strip(), parts.hostname, port or default)


def event_json(node: str, ts: float, record: dict[str, Any], gpu_uuid: str | None = None) -> dict[str, Any]:
    """What a collector gets for one event: its time (ISO 8601, UTC), node, classification and the
    GPU's UUID (from the inventory) when it names a GPU."""
    at = datetime.fromtimestamp(ts, UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")
    return {"time": at, "node": node} | {k: record.get(k) for k in FIELDS} | {"gpu_uuid": gpu_uuid}


class EventForwarder:
    def __init__(self, target: Target) -> None:
        self.target = target
        self.sent = 0
        self.dropped = 0
        self._pending: deque[str] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._idle: asyncio.Event | None = None  # set while nothing waits to be sent
        self._worker: asyncio.Task[None] | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._http: httpx.AsyncClient | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._wake, self._idle = asyncio.Event(), asyncio.Event()
        if self.target.scheme != "tcp":
            self._http = httpx.AsyncClient(timeout=TIMEOUT_S)
        self._worker = loop.create_task(self._run(self._wake, self._idle))

    def submit(self, events: Iterable[dict[str, Any]]) -> None:
        """From any thread: queue events (see `event_json`) to be sent."""
        lines = [json.dumps(e, separators=(",", ":")) for e in events]
        if lines and self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._enqueue, lines)

    def _enqueue(self, lines: list[str]) -> None:
        self._pending.extend(lines)
        excess = len(self._pending) - QUEUE_LIMIT
        for _ in range(max(excess, 0)):
            self._pending.popleft()
        if excess > 0:
            self.dropped += excess
            log.warning("log forwarding to %s is behind: %d events dropped", self.target.url, excess)
        if self._wake is not None and self._idle is not None:
            self._idle.clear()
            self._wake.set()

    async def _run(self, wake: asyncio.Event, idle: asyncio.Event) -> None:
        failures = 0
        while True:
            if not self._pending:
                idle.set()
                wake.clear()
                await wake.wait()
            batch = [self._pending[i] for i in range(min(BATCH, len(self._pending)))]
            try:
                await self._send(batch)
            except (OSError, httpx.HTTPError, RuntimeError) as exc:
                pause = BACKOFF_S[min(failures, len(BACKOFF_S) - 1)]
                if failures == 0:
                    log.warning("log forwarding to %s failed (%s); retrying", self.target.url, exc)
                failures += 1
                await self._close_connection()
                await asyncio.sleep(pause)
                continue
            if failures:
                log.info("log forwarding to %s works again", self.target.url)
            failures = 0
            for _ in batch:  # sent: only now do they leave the queue
                self._pending.popleft()
            self.sent += len(batch)

    async def _send(self, batch: list[str]) -> None:
        body = ("\n".join(batch) + "\n").encode()
        if self._http is not None:
            answer = await self._http.post(
                self.target.url, content=body, headers={"Content-Type": "application/x-ndjson"}
            )
            if answer.status_code >= 300:
                raise RuntimeError(f"HTTP {answer.status_code}")
            return
        writer = await self._connection()
        writer.write(body)
        await asyncio.wait_for(writer.drain(), TIMEOUT_S)

    async def _connection(self) -> asyncio.StreamWriter:
        if self._writer is None or self._writer.is_closing():
            opened = await asyncio.wait_for(asyncio.open_connection(self.target.host, self.target.port), TIMEOUT_S)
            self._writer = opened[1]
        return self._writer

    async def _close_connection(self) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(OSError):
                await self._writer.wait_closed()
            self._writer = None

    async def close(self, flush_s: float = 2.0) -> None:
        """Give the queue `flush_s` to drain, then stop."""
        if self._idle is not None and self._pending:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), flush_s)
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
        await self._close_connection()
        if self._http is not None:
            await self._http.aclose()
