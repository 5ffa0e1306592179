"""The head's reverse proxy to inference services: `/services/NAME/PATH` goes to a healthy replica's
`PATH`, so clients need one address and a gpufleet token, never a node's name or a replica's port.

- Who may call: a token with `services:use` whose user runs the service or is a member of its project,
  or a job admin (`inference.may_call`). The caller's token and cookies are not passed on: a replica
  never sees a credential to the cluster.
- Which replica: round robin over those whose last health check passed, read from the database at
  most once a second per service (`REFRESH_S`). A replica that refuses the connection is skipped for
  this request and the next one is tried: nothing reached it, so even a POST is safe to send again.
- What it measures: each call's latency and status, kept for `WINDOW_S` in this head process, for the
  service's request rate and latency percentiles (`stats`).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
from fastapi import Request, Response

from gpufleet.core.errors import BadGateway, Forbidden, Unavailable

REFRESH_S = 1.0
MAX_ANSWER_BYTES = 64 * 1024 * 1024  # a replica's answer is held in the head's memory: bounded
# Replicas answer from the head's own origin: a sandboxed page runs no script there, so an answer cannot
# read the dashboard or act with a logged-in browser's session.
_ANSWER_HEADERS = {"content-security-policy": "sandbox", "x-content-type-options": "nosniff"}
WINDOW_S = 60.0
MAX_SAMPLES = 100_000  # per service, within the window
# Headers that belong to one connection (RFC 9110 section 7.6.1) or carry the caller's credentials.
_DROP_REQUEST = frozenset(
    {"host", "connection", "keep-alive", "proxy-authorization", "te", "trailer", "transfer-encoding", "upgrade"}
    | {"authorization", "cookie", "x-csrf-token", "content-length"}
)
_DROP_RESPONSE = frozenset(
    {"connection", "keep-alive", "te", "trailer", "transfer-encoding", "upgrade", "content-length", "set-cookie"}
    | {"content-encoding"}  # httpx hands over the body decoded
)


@dataclass(frozen=True)
class Route:
    """What the proxy needs to know of a service, as of `read_at`."""

    may_call: bool
    addresses: tuple[str, ...]
    wanted: int
    read_at: float


@dataclass
class ServiceStats:
    """Calls of one service; added on the event loop, summarised on request threads: hence the lock."""

    samples: deque[tuple[float, float, int]] = field(default_factory=lambda: deque(maxlen=MAX_SAMPLES))
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, at: float, seconds: float, status: int) -> None:
        with self.lock:
            self.samples.append((at, seconds, status))

    def summary(self, now: float) -> dict[str, float | None]:
        """Requests a second over the window, latency percentiles in ms, and the share of 5xx answers."""
        with self.lock:
            while self.samples and self.samples[0][0] < now - WINDOW_S:
                self.samples.popleft()
            recent = list(self.samples)
        if not recent:
            return {"requests_per_s": 0.0, "p50_ms": None, "p99_ms": None, "errors": 0.0}
        latencies = sorted(s[1] for s in recent)
        count = len(latencies)
        return {
            "requests_per_s": round(count / WINDOW_S, 2),
            "p50_ms": round(1000 * latencies[(count - 1) // 2], 1),
            "p99_ms": round(1000 * latencies[min(count - 1, int(0.99 * count))], 1),
            "errors": round(sum(1 for s in recent if s[2] >= 500) / count, 3),
        }


class ServiceProxy:
    def __init__(self, lookup: Callable[[str, str | None, bool], Route], timeout_s: float) -> None:
        """`lookup(name, user, admin)` reads the service from the database (on a worker thread); NotFound
        for an unknown one."""
        self.lookup = lookup
        self.timeout_s = timeout_s
        self._routes: dict[tuple[str, str | None, bool], Route] = {}
        self._turn = itertools.count()
        self._stats: dict[str, ServiceStats] = {}
        self._http: httpx.AsyncClient | None = None

    def stats(self, name: str) -> dict[str, float | None]:
        return self._stats.get(name, ServiceStats()).summary(time.time())

    async def route(self, name: str, user: str | None, admin: bool) -> Route:
        from anyio import to_thread

        key = (name, user, admin)
        found = self._routes.get(key)
        if found is None or time.monotonic() - found.read_at > REFRESH_S:
            found = await to_thread.run_sync(self.lookup, name, user, admin)
            if len(self._routes) > 10_000:  # many users and services: start over rather than grow
                self._routes.clear()
            self._routes[key] = found
        return found

    async def forward(self, request: Request, name: str, path: str, user: str | None, admin: bool) -> Response:
        route = await self.route(name, user, admin)
        if not route.may_call:
            raise Forbidden(f"service {name} is for its user and its project's members")
        if not route.addresses:
            raise Unavailable(f"service {name} has no healthy replica now (0 of {route.wanted} ready)")
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=self.timeout_s, follow_redirects=False)
        http = self._http
        body = await request.body()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROP_REQUEST}
        headers["x-forwarded-for"] = request.client.host if request.client else ""
        first = next(self._turn)
        started = time.monotonic()
        for attempt in range(len(route.addresses)):
            address = route.addresses[(first + attempt) % len(route.addresses)]
            url = f"http://{address}/{path}"
            try:
                status, answer_headers, content = await self._send(http, request.method, url, request, body, headers)
            except httpx.ConnectError:
                continue  # nothing reached this replica: the next one gets the call
            except httpx.TimeoutException:
                self._record(name, started, 504)
                raise BadGateway(f"service {name}: the replica did not answer within {self.timeout_s:.0f} s") from None
            except httpx.HTTPError as exc:
                self._record(name, started, 502)
                raise BadGateway(f"service {name}: the replica failed the call: {exc}") from None
            except BadGateway:
                self._record(name, started, 502)
                raise
            self._record(name, started, status)
            kept = {k: v for k, v in answer_headers.items() if k.lower() not in _DROP_RESPONSE} | _ANSWER_HEADERS
            return Response(content=content, status_code=status, headers=kept)
        self._routes.pop((name, user, admin), None)  # read the replicas again next time
        self._record(name, started, 503)
        raise Unavailable(f"service {name}: no replica accepted the connection")

    @staticmethod
    async def _send(
        http: httpx.AsyncClient, method: str, url: str, request: Request, body: bytes, headers: dict[str, str]
    ) -> tuple[int, httpx.Headers, bytes]:
        """One call to one replica; its answer read up to MAX_ANSWER_BYTES (BadGateway past that)."""
        query = request.query_params
        async with http.stream(method, url, params=query, content=body, headers=headers) as answer:
            content = bytearray()
            async for chunk in answer.aiter_bytes():
                content += chunk
                if len(content) > MAX_ANSWER_BYTES:
                    raise BadGateway(f"the replica's answer is over {MAX_ANSWER_BYTES} bytes")
            return answer.status_code, answer.headers, bytes(content)

    def _record(self, name: str, started: float, status: int) -> None:
        self._stats.setdefault(name, ServiceStats()).add(time.time(), time.monotonic() - started, status)

    async def close(self) -> None:
        if self._http is not None:
            await self._http.aclose()
