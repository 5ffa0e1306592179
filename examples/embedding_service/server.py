"""A sentence-embedding service that gpufleet runs as an inference service replica.

gpufleet's agent stages the model directory to the node's cache, then starts this program with the
inference venv's python (bash scripts/services/inference.sh install; it never imports gpufleet) and:
  GPUFLEET_MODEL_PATH    the staged sentence-transformers model directory (required)
  GPUFLEET_SERVICE_PORT  the port to listen on (required)
  GPUFLEET_SERVICE_HOST  the address to listen on (default 0.0.0.0)
  GPUFLEET_SERVICE_THREADS  torch threads per replica (default 1, so replicas on one node do not fight)
The model is loaded before the port opens, so a 200 from /health means ready:
  GET  /health  -> {"status": "ok", "model": NAME, "dim": 384}
  POST /embed   {"texts": ["...", ...]} or {"text": "..."} -> {"embeddings": [[...], ...], "dim": 384}
Embeddings are normalized: a dot product is the cosine. Bad input answers 400 {"error": ...}.
A missing model or port exits 2 before anything loads. Nothing is downloaded: the hub is set offline.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

MAX_TEXTS = 256
MAX_TEXT_CHARS = 10_000
MAX_BODY_BYTES = 4 * 1024 * 1024


def log(message: str) -> None:
    print(f"embedding-service: {message}", file=sys.stderr, flush=True)


def fail(message: str) -> None:
    log(message)
    sys.exit(2)


class BadRequest(Exception):
    pass


def parse_texts(body: bytes) -> list[str]:
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"body is not JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise BadRequest('body must be a JSON object: {"texts": [...]} or {"text": "..."}')
    texts = payload.get("texts", [payload["text"]] if "text" in payload else None)
    if not isinstance(texts, list) or not texts:
        raise BadRequest('"texts" must be a non-empty list of strings (or give one "text")')
    if len(texts) > MAX_TEXTS:
        raise BadRequest(f"too many texts: {len(texts)} (at most {MAX_TEXTS})")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise BadRequest(f"texts[{i}] is not a string")
        if len(text) > MAX_TEXT_CHARS:
            raise BadRequest(f"texts[{i}] is too long: {len(text)} characters (at most {MAX_TEXT_CHARS})")
    return texts


def main() -> None:
    model_path = os.environ.get("GPUFLEET_MODEL_PATH", "")
    if not model_path:
        fail("GPUFLEET_MODEL_PATH is not set (the model directory gpufleet staged to the node)")
    if not (Path(model_path) / "modules.json").is_file():
        fail(f"GPUFLEET_MODEL_PATH={model_path} is not a sentence-transformers model directory (no modules.json)")
    port_text = os.environ.get("GPUFLEET_SERVICE_PORT", "")
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        fail(f"GPUFLEET_SERVICE_PORT must be a port number, got {port_text!r}")
    host = os.environ.get("GPUFLEET_SERVICE_HOST", "0.0.0.0")  # noqa: S104 - a replica serves the cluster
    threads_text = os.environ.get("GPUFLEET_SERVICE_THREADS", "1")
    if not threads_text.isdigit() or int(threads_text) < 1:
        fail(f"GPUFLEET_SERVICE_THREADS must be a positive number, got {threads_text!r}")
    threads = int(threads_text)

    # Before torch is imported: its thread pools and the hub read these at import time.
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    started = time.monotonic()
    model = SentenceTransformer(model_path, device=device)
    dim = (getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension)()
    name = os.environ.get("GPUFLEET_MODEL_NAME") or Path(model_path).name
    lock = threading.Lock()  # one encode at a time: the fast tokenizer is not safe across threads

    def embed(texts: list[str]) -> list[list[float]]:
        with lock:
            vectors = model.encode(texts, normalize_embeddings=True, convert_to_numpy=True)
        return [[float(x) for x in row] for row in vectors]

    embed(["warm up"])

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def answer(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if self.close_connection:  # tell the client, so it does not send its next request here
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if urlsplit(self.path).path == "/health":
                self.answer(200, {"status": "ok", "model": name, "dim": dim})
            else:
                self.answer(404, {"error": f"no such path: {self.path}"})

        def do_POST(self) -> None:
            if urlsplit(self.path).path != "/embed":
                # The body is left unread: the connection must close, or its bytes would be read as the
                # next request on it (the head's proxy reuses connections for every caller).
                self.close_connection = True
                self.answer(404, {"error": f"no such path: {self.path}"})
                return
            try:
                length = int(self.headers.get("Content-Length", "0"))
            except ValueError:
                length = -1
            if not 0 <= length <= MAX_BODY_BYTES:
                self.close_connection = True
                self.answer(400, {"error": f"Content-Length must be 0 to {MAX_BODY_BYTES} bytes"})
                return
            try:
                texts = parse_texts(self.rfile.read(length))
            except BadRequest as exc:
                self.answer(400, {"error": str(exc)})
                return
            try:
                embeddings = embed(texts)
            except Exception as exc:  # the replica stays up; the caller learns why
                log(f"encode failed: {exc!r}")
                self.answer(500, {"error": f"encode failed: {exc}"})
                return
            self.answer(200, {"embeddings": embeddings, "dim": dim})

        def log_message(self, format: str, *args: Any) -> None:
            pass  # one line per start, not one per request

    server = ThreadingHTTPServer((host, int(port_text)), Handler)
    server.daemon_threads = True
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    log(
        f"serving {name} ({dim}-dim, {device}, {threads} thread(s), loaded in {time.monotonic() - started:.1f}s)"
        f" on http://{host}:{server.server_address[1]} pid {os.getpid()}"
    )
    with server:
        server.serve_forever()


if __name__ == "__main__":
    main()
