"""Real receivers on loopback for the notifier tests: an HTTP server and an SMTP server (aiosmtpd).

Each records what it got and answers from a script, so a test can make it fail a few times first.
"""

from __future__ import annotations

import json
import socket
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session

from gpufleet.monitoring.notifiers import AlertNotice

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
T1 = datetime(2026, 3, 1, 12, 7, 30, 250000, tzinfo=UTC)


def xid(node: str = "gpu001", gpu: int = 3, *, resolved: bool = False) -> AlertNotice:
    """A GPU alert of the kind gpufleet raises (an Xid 79 from the kernel log)."""
    return AlertNotice(
        fingerprint=f"xid-{node}-{gpu}",
        alertname="GpuXid",
        status="resolved" if resolved else "firing",
        severity="critical",
        labels={"node": node, "gpu": str(gpu)},
        annotations={
            "summary": "Xid 79: GPU has fallen off the bus",
            "description": f"{node} GPU {gpu} reported Xid 79",
        },
        starts_at=T0,
        ends_at=T1 if resolved else None,
        generator_url=f"https://head.example/alerts?node={node}",
    )


def node_down(node: str = "gpu002") -> AlertNotice:
    return AlertNotice(
        fingerprint=f"down-{node}",
        alertname="NodeDown",
        status="firing",
        severity="warning",
        labels={"node": node},
        annotations={"summary": "no heartbeat for 2m"},
        starts_at=T0,
    )


def unused_port() -> int:
    """A loopback port nothing listens on (bound, then released), so connecting to it is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Received:
    path: str
    headers: dict[str, str]  # names in lower case
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class HttpReceiver:
    """Records every request; answers each from `script` (status, headers, body) while it lasts, then 200."""

    url: str
    received: list[Received] = field(default_factory=list)
    script: list[tuple[int, dict[str, str], bytes]] = field(default_factory=list)

    def fail_with(self, status: int, times: int = 1, headers: dict[str, str] | None = None, body: bytes = b"") -> None:
        self.script.extend([(status, headers or {}, body)] * times)


@contextmanager
def http_receiver(tls: ssl.SSLContext | None = None) -> Iterator[HttpReceiver]:
    """A threaded HTTP server on a free loopback port; HTTPS when given a server-side `tls` context."""
    lock = threading.Lock()
    receiver: HttpReceiver

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            with lock:
                receiver.received.append(Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                status, headers, answer = receiver.script.pop(0) if receiver.script else (200, {}, b"ok")
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:  # quiet test output
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    scheme = "https" if tls else "http"
    receiver = HttpReceiver(url=f"{scheme}://127.0.0.1:{server.server_address[1]}")
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@dataclass
class SmtpRecorder:
    """An aiosmtpd handler: keeps each accepted message; `data_replies` answers DATA while it lasts,
    `refuse` answers RCPT for the listed addresses."""

    messages: list[Envelope] = field(default_factory=list)
    sessions: list[Session] = field(default_factory=list)
    data_replies: list[str] = field(default_factory=list)
    refuse: dict[str, str] = field(default_factory=dict)

    async def handle_RCPT(
        self, server: SMTP, session: Session, envelope: Envelope, address: str, rcpt_options: list[str]
    ) -> str:
        if address in self.refuse:
            return self.refuse[address]
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        if self.data_replies:
            return self.data_replies.pop(0)
        self.messages.append(envelope)
        self.sessions.append(session)
        return "250 Message accepted for delivery"


@dataclass
class Mailbox:
    host: str
    port: int
    recorder: SmtpRecorder


def password_check(user: bytes, password: bytes) -> Any:
    def authenticator(server: SMTP, session: Session, envelope: Envelope, mechanism: str, data: Any) -> AuthResult:
        ok = isinstance(data, LoginPassword) and data.login == user and data.password == password
        return AuthResult(success=ok, handled=False)

    return authenticator


@contextmanager
def smtp_server(**server_kwargs: Any) -> Iterator[Mailbox]:
    """aiosmtpd on a free loopback port; `server_kwargs` go to aiosmtpd's SMTP (tls_context, authenticator ...)."""
    recorder = SmtpRecorder()
    port = unused_port()
    controller = Controller(recorder, hostname="127.0.0.1", port=port, server_hostname="localhost", **server_kwargs)
    controller.start()
    try:
        yield Mailbox("127.0.0.1", port, recorder)
    finally:
        controller.stop()
