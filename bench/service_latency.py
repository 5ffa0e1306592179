"""Inference service: latency and requests/s through the head's proxy versus calling the replica directly.

Brings up what tests/e2e/test_inference_service.py does, with real processes: `gpufleet server`
(SQLite, fresh temp dir), a real `gpufleet agent` on this machine, a project with a member and her
token, all-MiniLM-L6-v2 from the inference venv registered in the model registry (`bash
scripts/services/inference.sh install`), and the service `embed` with `--replicas` replicas of
examples/embedding_service/server.py. Once every replica is ready it reads the first replica's address
from GET /api/v1/services/embed and loads two targets, one after the other:

* direct: POST http://ADDRESS/embed, no credentials;
* proxy:  POST HEAD/services/embed/embed with the member's bearer token (what a client of the service
  does: the head checks the token, looks the replicas up, cached for 1 s, and forwards the call).

Each target gets a sequential run (one client: pure latency) and a closed-loop run with
`--concurrency` clients, each for `--seconds`: every client is a thread with its own keep-alive
`httpx.Client` that sends its next request as soon as the last one is answered. Every request embeds
`--texts` short sentences. Before measuring, every client sends `--warmup` requests that are not
counted. Only 200 answers count as requests; anything else (another status, a timeout, a refused
connection) is an error, counted apart with its first answer shown. Latency is the client's wall time
per call (p50/p99, linear interpolation); req/s is 200 answers over the run's wall time; "head CPU" is
the server process's user+system CPU during the run over its wall time (in direct runs: what the idle
head spends on the agent, health checks and its own loops). After each proxy run it prints the
service's stats as the head measured them (forward to answer) and, at the end, how many audit records
the proxied calls left (every POST through the head is audited).

    .venv/bin/python bench/service_latency.py --concurrency 4 --seconds 20

The model runs on the CPU unless the machine has CUDA (the replica's log line says which; it is
printed). The replica encodes one call at a time, so with more clients the extra ones queue in the
replica, and its single core is the ceiling for both targets. Exit status 0 when every run got
answers, 1 when a run had errors, 2 when the benchmark could not run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from liveness import cpu_seconds, percentile

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # for tests.e2e.conftest: the e2e tests' head and CLI helpers
from tests.e2e.conftest import ADMIN, GPUFLEET, Head, base_env, run_cli, stop, wait_for  # noqa: E402

SERVER = ROOT / "examples" / "embedding_service" / "server.py"
SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The stock market fell sharply today.",
    "A cat sleeps on the warm windowsill.",
]


class BenchError(Exception):
    """The benchmark could not run."""


@dataclass
class Run:
    target: str
    clients: int
    latencies: list[float] = field(default_factory=list)  # seconds, 200 answers only
    errors: Counter[str] = field(default_factory=Counter)
    first_error: dict[str, str] = field(default_factory=dict)
    wall_s: float = 0.0
    head_cpu_s: float = 0.0

    def p(self, q: float) -> float | None:
        found = percentile(self.latencies, q)
        return None if found is None else 1000 * found

    @property
    def per_s(self) -> float:
        return len(self.latencies) / self.wall_s if self.wall_s else 0.0


def _inference_venv() -> tuple[str, str]:
    """The inference venv's python and the model directory, from scripts/services/inference.sh."""
    found = subprocess.run(
        ["bash", str(ROOT / "scripts/services/inference.sh"), "path"], capture_output=True, text=True, check=False
    )
    if found.returncode != 0:
        raise BenchError(f"no inference venv: {found.stderr.strip()} (bash scripts/services/inference.sh install)")
    python, model_dir = found.stdout.split()[:2]
    return python, model_dir


def _user_token(head: Head, user: str) -> str:
    head.api("POST", "/api/v1/users", json={"username": user})
    token: str = head.api("POST", "/api/v1/tokens/user", json={"user": user})["token"]
    return token


def _cli(head: Head, workdir: Path, *args: str) -> None:
    done = run_cli(workdir, *args, server=head.url)
    if done.returncode != 0:
        raise BenchError(f"gpufleet {' '.join(args[:2])} failed: {done.stderr.strip()}")


def bring_up(head: Head, workdir: Path, args: argparse.Namespace, run_as: str) -> str:
    """Project, member, model and service; returns the member's token once every replica is ready."""
    python, model_dir = _inference_venv()
    wait_for(lambda: any(n["state"] == "up" for n in head.nodes()), 60)
    if run_as == "nobody":
        head.api("POST", "/api/v1/users", json={"username": run_as})
    head.api("POST", "/api/v1/projects", json={"name": "ml"})
    head.api("POST", "/api/v1/projects/ml/members", json={"user": run_as})
    member = _user_token(head, "carol")
    head.api("POST", "/api/v1/projects/ml/members", json={"user": "carol"})
    _cli(
        head, workdir, "model", "register", "minilm:1", model_dir, "--project", "ml", "--framework", "pytorch",
        "--format", "safetensors", "--licence", "apache-2.0", "--source", "sentence-transformers/all-MiniLM-L6-v2",
    )  # fmt: skip
    _cli(
        head, workdir, "service", "create", "embed", "--replicas", str(args.replicas), "--gpus", "0",
        "--project", "ml", "--user", run_as, "--model", "minilm:1", "--startup", "5m",
        "--export", f"HOME={workdir / 'home'}", "--", python, str(SERVER),
    )  # fmt: skip
    started = time.monotonic()
    wait_for(lambda: head.api("GET", "/api/v1/services/embed")["ready"] == args.replicas, 300, interval=1)
    print(f"{args.replicas} replica(s) ready in {time.monotonic() - started:.1f} s")
    return member


def replica_line(head: Head) -> str:
    """The replica's own start-up line (model, device, threads), from its output."""
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        pages: dict[str, dict[str, Any]] = head.api("GET", "/api/v1/services/embed/logs")
        for page in pages.values():
            for chunk in page["chunks"]:
                data: str = chunk["data"]
                for line in data.splitlines():
                    if "embedding-service: serving" in line:
                        return line.strip()
        time.sleep(0.5)
    return "(the replica's start-up line was not in its output)"


def load(
    target: str, url: str, headers: dict[str, str], clients: int, args: argparse.Namespace, head: psutil.Process
) -> Run:
    """`clients` closed-loop clients against `url` for `args.seconds`, after `args.warmup` calls each."""
    run = Run(target, clients)
    lock = threading.Lock()
    go = threading.Barrier(clients + 1)
    failed_warmup: list[str] = []

    def call(client: httpx.Client, n: int) -> tuple[float, str | None, str]:
        texts = [SENTENCES[(n + i) % len(SENTENCES)] for i in range(args.texts)]
        body = json.dumps({"texts": texts}).encode()
        sent = time.perf_counter()
        try:
            answer = client.post(url, content=body)
        except httpx.HTTPError as exc:
            return time.perf_counter() - sent, type(exc).__name__, str(exc)[:300]
        took = time.perf_counter() - sent
        if answer.status_code != 200:
            return took, f"HTTP {answer.status_code}", answer.text[:300]
        return took, None, ""

    def worker(index: int) -> None:
        mine: list[float] = []
        errors: Counter[str] = Counter()
        first: dict[str, str] = {}
        with httpx.Client(timeout=60, headers=headers | {"Content-Type": "application/json"}) as client:
            try:
                for n in range(args.warmup):
                    _, kind, text = call(client, n)
                    if kind is not None:
                        failed_warmup.append(f"{kind}: {text}")
            finally:
                go.wait()
            deadline = time.monotonic() + args.seconds
            n = index
            while time.monotonic() < deadline:
                took, kind, text = call(client, n)
                n += clients
                if kind is None:
                    mine.append(took)
                else:
                    errors[kind] += 1
                    first.setdefault(kind, text)
        with lock:
            run.latencies += mine
            run.errors += errors
            for kind, text in first.items():
                run.first_error.setdefault(kind, text)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    go.wait()
    cpu0, t0 = cpu_seconds(head), time.monotonic()
    for thread in threads:
        thread.join()
    run.wall_s = time.monotonic() - t0
    run.head_cpu_s = cpu_seconds(head) - cpu0
    if failed_warmup:
        print(f"  {target}: {len(failed_warmup)} warm-up call(s) failed, first: {failed_warmup[0]}")
    return run


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def table(runs: list[Run]) -> str:
    direct = {r.clients: r for r in runs if r.target == "direct"}
    lines = [
        "| target | clients | requests | errors | req/s | p50 ms | p99 ms | proxy added p50 ms | head CPU, cores |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        added = "—"
        base = direct.get(r.clients)
        if r.target == "proxy" and base is not None and r.latencies and base.latencies:
            added = f"+{(r.p(50) or 0) - (base.p(50) or 0):.1f}"
        cores = f"{r.head_cpu_s / r.wall_s:.2f}" if r.wall_s else "n/a"
        lines.append(
            f"| {r.target} | {r.clients} | {len(r.latencies)} | {sum(r.errors.values())} | {r.per_s:.1f} "
            f"| {_ms(r.p(50))} | {_ms(r.p(99))} | {added} | {cores} |"
        )
    return "\n".join(lines)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _leftover_replicas(cache: Path) -> list[psutil.Process]:
    """Replica processes of this run (their model comes from this run's cache), should any outlive the agent."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if str(SERVER) in (proc.info["cmdline"] or []) and proc.environ().get("GPUFLEET_MODEL_PATH", "").startswith(
                str(cache)
            ):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def _end_replicas(cache: Path, wait_s: float = 5.0) -> None:
    """Kill (by pid) any replica process of this run still there after `wait_s`."""
    started = time.monotonic()
    left = _leftover_replicas(cache)
    while left and time.monotonic() - started < wait_s:
        time.sleep(0.2)
        left = [p for p in left if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    for proc in left:
        print(f"replica process {proc.pid} outlived the agent by {wait_s:.0f} s: killed", file=sys.stderr)
        proc.kill()


def audit_records(head: Head, action: str) -> int:
    """How many audit records name `action` (paged: the API lists at most 10,000 at a time)."""
    count = 0
    while True:
        page = head.api("GET", "/api/v1/audit", params={"action": action, "offset": count, "limit": 10_000})
        count += len(page)
        if len(page) < 10_000:
            return count


def measure(args: argparse.Namespace, workdir: Path, run_as: str) -> list[Run]:
    head = Head(workdir, env={"GPUFLEET_SERVICE_CHECK_INTERVAL_S": "1"})
    agent: subprocess.Popen[bytes] | None = None
    try:
        head.start()
        assert head.proc is not None
        env = base_env(workdir) | {
            "GPUFLEET_SERVER": head.url,
            "GPUFLEET_AGENT_STATE_DIR": str(workdir / "agent"),
            "GPUFLEET_JOB_SPOOL_DIR": str(workdir / "spool"),
            "GPUFLEET_JOB_KILL_GRACE_S": "2",
            "GPUFLEET_ARTIFACT_CACHE_DIR": str(workdir / "cache"),
        }
        with (workdir / "agent.log").open("ab") as log:
            agent = subprocess.Popen(
                [*GPUFLEET, "agent", "--join-token", head.join_token(1), "--name", "benchnode"],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        member = bring_up(head, workdir, args, run_as)
        address = head.api("GET", "/api/v1/services/embed")["replica_list"][0]["address"]
        print(f"replica: {replica_line(head)}")
        targets = {
            "direct": (f"http://{address}/embed", {}),
            "proxy": (f"{head.url}/services/embed/embed", {"Authorization": f"Bearer {member}"}),
        }
        print(f"direct: {targets['direct'][0]}   proxy: {targets['proxy'][0]}")
        runs = []
        for clients in sorted({1, args.concurrency}):
            for target, (url, headers) in targets.items():
                print(f"  {target}, {clients} client(s), {args.seconds:.0f} s ...", flush=True)
                runs.append(load(target, url, headers, clients, args, psutil.Process(head.proc.pid)))
                if target == "proxy":  # the proxy's own view: forward to answer, over the last 60 s
                    stats = head.api("GET", "/api/v1/services/embed")["stats"]
                    print(f"    the head's stats for the service (proxied calls of the last 60 s): {stats}")
        proxy_runs = [r for r in runs if r.target == "proxy"]
        proxied = sum(len(r.latencies) + sum(r.errors.values()) + r.clients * args.warmup for r in proxy_runs)
        print(f"audit records for proxied calls: {audit_records(head, 'call_service')} (proxied calls: {proxied})")
        return runs
    finally:
        # The agent dies of SIGTERM without ending its jobs, whose processes have their own session: delete
        # the service first, so the agent ends the replicas, then stop it and kill what is left by pid.
        try:
            if head.proc is not None and head.proc.poll() is None and agent is not None and agent.poll() is None:
                with contextlib.suppress(httpx.HTTPError):  # 204, or 404 when it was never created
                    httpx.delete(f"{head.url}/api/v1/services/embed", headers={"Authorization": f"Bearer {ADMIN}"})
                with contextlib.suppress(AssertionError):
                    wait_for(lambda: not _leftover_replicas(workdir / "cache"), 20, interval=0.2)
        finally:
            if agent is not None:
                stop(agent)
            _end_replicas(workdir / "cache")
            if head.proc is not None and head.proc.poll() is None:
                stop(head.proc)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--replicas", type=int, default=1, help="replicas of the service (the first is called)")
    parser.add_argument("--concurrency", type=int, default=4, help="clients in the closed-loop run")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured seconds per run")
    parser.add_argument("--texts", type=int, default=1, help="sentences embedded per request")
    parser.add_argument("--warmup", type=int, default=5, help="uncounted calls per client before each run")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs, database) for a look")
    args = parser.parse_args(argv)
    if args.replicas < 1 or args.concurrency < 1 or args.texts < 1 or args.seconds <= 0:
        parser.error("--replicas, --concurrency, --texts and --seconds must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # cleans up like Ctrl-C
    # A root agent runs the replicas as nobody; their cache and HOME must be readable by it (0755).
    run_as = "nobody" if os.geteuid() == 0 else psutil.Process().username()
    workdir = Path(tempfile.mkdtemp(prefix="gpufleet-bench-serve-"))
    workdir.chmod(0o755)
    (workdir / "home").mkdir(mode=0o777)
    (workdir / "home").chmod(0o777)  # past the umask
    load_before = os.getloadavg()
    try:
        runs = measure(args, workdir, run_as)
    except (BenchError, AssertionError, httpx.HTTPError) as exc:
        print(f"benchmark failed: {exc}", file=sys.stderr)
        print(f"state and logs kept in {workdir}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"interrupted; state and logs kept in {workdir}", file=sys.stderr)
        return 130
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    print()
    print(
        f"machine: {os.cpu_count()} CPUs ({_cpu_model()}), {platform.platform()}, Python {platform.python_version()};"
        f" load average {load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after"
    )
    print(
        f"{args.replicas} replica(s), {args.texts} sentence(s) per request, {args.seconds:.0f} s per run,"
        f" {args.warmup} warm-up calls per client"
    )
    print()
    print(table(runs))
    for r in runs:
        for kind, count in r.errors.most_common():
            print(f"\n{r.target} x {r.clients}: {count} x {kind}, first: {r.first_error[kind]}")
    if args.keep:
        print(f"\nstate and logs kept in {workdir}")
    return 1 if any(r.errors for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
