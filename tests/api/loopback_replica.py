"""An inference service replica on loopback for the proxy's tests: it answers every call with what it
received (method, path, headers, body) as JSON, status 201, or 500 for the path /fail."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class EchoReplica(BaseHTTPRequestHandler):
    def _answer(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        seen = {"method": self.command, "path": self.path, "headers": dict(self.headers), "body": body.decode()}
        data = json.dumps(seen).encode()
        self.send_response(500 if self.path == "/fail" else 201)
        self.send_header("content-type", "application/json")
        self.send_header("x-replica", str(self.server.server_address[1]))
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = _answer

    def log_message(self, *_args: Any) -> None:
        pass


@contextmanager
def echo_replica() -> Iterator[str]:
    """A running EchoReplica; yields its address, host:port."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), EchoReplica)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
