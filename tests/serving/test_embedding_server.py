"""The example embedding service (examples/embedding_service/server.py) as gpufleet runs a replica: the
inference venv's python (scripts/services/inference.sh), GPUFLEET_MODEL_PATH at the real
all-MiniLM-L6-v2 model that venv bundles, a port of its own. Where the venv is missing these tests skip
with the reason (a failure under GPUFLEET_REQUIRE_SERVICES=1)."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, need

# One worker runs the whole module: its module-scoped cluster is then started once, not on each worker.
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("test_embedding_server")]

SERVER = ROOT / "examples" / "embedding_service" / "server.py"
DIM = 384
READY_S = 120  # loading torch and the model takes seconds, more on a cold disk


@dataclass(frozen=True)
class Inference:
    python: str
    model: str


@dataclass(frozen=True)
class Replica:
    url: str
    process: subprocess.Popen[bytes]


@pytest.fixture(scope="module")
def inference() -> Inference:
    result = subprocess.run(
        ["bash", str(ROOT / "scripts" / "services" / "inference.sh"), "path"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or len(lines) != 2:
        reason = result.stderr.strip().splitlines() or [f"inference.sh path exited {result.returncode}"]
        need("the inference venv", reason[-1])
    return Inference(python=lines[0], model=lines[1])


def service_env(**values: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
    return env | values


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def call(url: str, body: bytes | None = None) -> tuple[int, dict[str, Any]]:
    headers = {"Content-Type": "application/json"}
    request = urllib.request.Request(url, data=body, headers=headers)  # noqa: S310 - our own http:// URL
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:  # noqa: S310
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def embed(replica: Replica, payload: Any) -> tuple[int, dict[str, Any]]:
    return call(f"{replica.url}/embed", json.dumps(payload).encode())


@pytest.fixture(scope="module")
def replica(inference: Inference, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replica]:
    port = free_port()
    log = tmp_path_factory.mktemp("embedding") / "server.log"
    env = service_env(
        GPUFLEET_MODEL_PATH=inference.model, GPUFLEET_SERVICE_PORT=str(port), GPUFLEET_SERVICE_HOST="127.0.0.1"
    )
    with log.open("wb") as out:
        process = subprocess.Popen([inference.python, str(SERVER)], env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + READY_S
        while True:
            if process.poll() is not None:
                pytest.fail(f"the server exited {process.returncode}:\n{log.read_text()}")
            try:
                if call(f"{url}/health")[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"the server was not healthy after {READY_S} s:\n{log.read_text()}")
            time.sleep(0.25)
        yield Replica(url=url, process=process)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def dot(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def test_health_says_ready_with_the_dimension(replica: Replica) -> None:
    status, body = call(f"{replica.url}/health")
    assert status == 200
    assert body["status"] == "ok"
    assert body["dim"] == DIM
    assert body["model"]


def test_two_texts_give_two_normalized_384_dim_embeddings(replica: Replica) -> None:
    status, body = embed(replica, {"texts": ["Hello, world.", "GPUs are busy today."]})
    assert status == 200
    assert body["dim"] == DIM
    assert len(body["embeddings"]) == 2
    assert all(len(vector) == DIM for vector in body["embeddings"])
    assert all(dot(v, v) == pytest.approx(1.0, abs=1e-4) for v in body["embeddings"])


def test_one_text_gives_one_embedding(replica: Replica) -> None:
    status, body = embed(replica, {"text": "A single sentence."})
    assert status == 200
    assert len(body["embeddings"]) == 1
    assert len(body["embeddings"][0]) == DIM


def test_similar_sentences_are_closer_than_unrelated_ones(replica: Replica) -> None:
    status, body = embed(
        replica,
        {
            "texts": [
                "A man is eating food.",
                "A man is eating a piece of bread.",
                "The stock market fell sharply today.",
            ]
        },
    )
    assert status == 200
    food, bread, stocks = body["embeddings"]
    similar, unrelated = dot(food, bread), dot(food, stocks)
    assert similar > unrelated + 0.3, (similar, unrelated)


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"{not json", "not JSON"),
        (b"[1, 2]", "JSON object"),
        (b"{}", "texts"),
        (b'{"texts": []}', "non-empty"),
        (b'{"texts": "one string"}', "list"),
        (b'{"texts": ["ok", 3]}', "texts[1]"),
        (json.dumps({"texts": ["x"] * 257}).encode(), "too many"),
        (json.dumps({"texts": ["word " * 5000]}).encode(), "too long"),
    ],
    ids=["bad-json", "not-object", "no-texts", "empty", "string", "not-string", "too-many", "too-long"],
)
def test_bad_input_is_a_400_and_the_replica_stays_up(replica: Replica, body: bytes, says: str) -> None:
    status, answer = call(f"{replica.url}/embed", body)
    assert status == 400
    assert says in answer["error"]
    assert call(f"{replica.url}/health")[0] == 200
    assert replica.process.poll() is None


def test_unknown_path_is_a_404(replica: Replica) -> None:
    assert call(f"{replica.url}/nowhere")[0] == 404
    assert call(f"{replica.url}/nowhere", b"{}")[0] == 404


def test_a_post_to_an_unknown_path_does_not_spoil_the_connection(replica: Replica) -> None:
    """Its unread body would be read as the next request on a kept-alive connection (the head's proxy
    shares its connections between callers): the replica closes the connection instead, and says so."""
    host, port = replica.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("POST", "/nowhere", body=b'{"texts": ["a"]}', headers={"Content-Type": "application/json"})
        answer = conn.getresponse()
        answer.read()
        assert answer.status == 404
        assert answer.getheader("Connection") == "close"
        conn.request("GET", "/health")  # http.client reconnects, as the closed connection asks
        again = conn.getresponse()
        assert again.status == 200
        assert json.loads(again.read())["status"] == "ok"
    finally:
        conn.close()


def test_missing_model_path_exits_2_saying_so(inference: Inference) -> None:
    result = subprocess.run(
        [inference.python, str(SERVER)],
        env=service_env(GPUFLEET_SERVICE_PORT=str(free_port())),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "GPUFLEET_MODEL_PATH is not set" in result.stderr


def test_model_path_that_is_no_model_exits_2_saying_so(inference: Inference, tmp_path: Path) -> None:
    result = subprocess.run(
        [inference.python, str(SERVER)],
        env=service_env(GPUFLEET_MODEL_PATH=str(tmp_path / "absent"), GPUFLEET_SERVICE_PORT=str(free_port())),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "is not a sentence-transformers model directory" in result.stderr
