"""What the REST list endpoints cost the head at 1,000 nodes x 8 GPUs, and what a repeat with the ETag costs.

Builds (or reuses, with `--db`) the same fleet as bench/dashboard.py: `--nodes` nodes joined with a
simulated 8-GPU H200 inventory, a few down, failed, degraded and drained, about 50 firing alerts, and
`--jobs` jobs (a quarter running, the rest ended). Then, with the real app (`create_app`, no background
loops) and an admin token, it GETs each list URL `--requests` times, and again with `If-None-Match` set
to the ETag it got, and reports per URL: the status, the body's size, and the server time (from the ASGI
call to the last byte: routing, authentication, the read, the JSON) as p50/p95/max, with this process's
CPU per request.

    .venv/bin/python bench/api_reads.py --db bench/results/fleet.db --json bench/results/api-reads.json

Goal (issue 22): GET /api/v1/nodes at 1,000 x 8 in at most 50 ms of server time at p50, and a 304 on an
unchanged repeat. Exit status 0 when met, 1 when not, 2 when the benchmark could not run.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import insert

from dashboard import Builder, Fleet, Timed, admin_token, busy_seconds, machine, summary
from gpufleet.api.app import create_app
from gpufleet.core.clock import FakeClock, to_datetime
from gpufleet.core.config import load_settings
from gpufleet.core.db import make_engine, make_session_factory, transaction
from gpufleet.jobs.models import Job, JobState
from gpufleet.migrations import upgrade

GOAL_MS = 50.0
URLS = (
    "/api/v1/nodes",
    "/api/v1/nodes?limit=100",
    "/api/v1/gpus",
    "/api/v1/jobs",
    "/api/v1/alerts",
    "/api/v1/logs?events=true",
)


@dataclass
class Timing:
    url: str
    status: int
    bytes: int
    server_ms: dict[str, float]
    cpu_ms: dict[str, float]
    repeat_status: int
    repeat_server_ms: dict[str, float]


def add_jobs(sessions: Any, clock: FakeClock, count: int) -> None:
    """`count` jobs as plain rows: a quarter running, the rest ended, spread over the last day."""
    now = clock.now()
    rows = []
    for k in range(count):
        running = k % 4 == 0
        submitted = to_datetime(now - 86400 + k * 86400 / max(count, 1))
        rows.append(
            {
                "name": f"train-{k}",
                "user": "alice",
                "project": "vision",
                "submitted_by": "token:bench",
                "state": (JobState.RUNNING if running else JobState.COMPLETED).value,
                "reason": "",
                "nodes": 1,
                "gpus_per_node": 8,
                "time_limit_s": 86400.0,
                "argv": ["python", "train.py"],
                "env": {},
                "submitted_at": submitted,
                "started_at": submitted + timedelta(seconds=5),
                "ended_at": None if running else submitted + timedelta(seconds=600),
                "exit_code": None if running else 0,
            }
        )
    with transaction(sessions) as session:
        session.execute(insert(Job), rows)


def measure(client: Any, timed: Timed, url: str, requests: int) -> Timing:
    for _ in range(2):
        first = client.get(url)  # warm-up
    tag = first.headers.get("etag")
    server, cpu = [], []
    for _ in range(requests):
        before = time.process_time()
        response = client.get(url)
        cpu.append((time.process_time() - before) * 1000)
        server.append(timed.last * 1000)
    repeat, status = [], 0
    for _ in range(requests):
        answer = client.get(url, headers={"If-None-Match": tag} if tag else {})
        status = answer.status_code
        repeat.append(timed.last * 1000)
    return Timing(
        url, response.status_code, len(response.content), summary(server), summary(cpu), status, summary(repeat)
    )


def run(args: argparse.Namespace, workdir: Path) -> tuple[Fleet, list[Timing], float]:
    path = args.db or workdir / "gpufleet.db"
    meta = path.with_name(path.name + ".api.json")
    engine = make_engine(f"sqlite:///{path}")
    sessions = make_session_factory(engine)
    try:
        if args.db is not None and path.exists() and meta.exists():
            built = json.loads(meta.read_text())
            clock, fleet = FakeClock(built["now"]), Fleet(**built["fleet"])
            print(f"reusing {path} ({fleet.nodes} nodes)")
        else:
            clock = FakeClock(time.time())
            print(f"building the database in {path}:")
            upgrade(engine)
            fleet = Builder(sessions, clock, args).build()
            add_jobs(sessions, clock, args.jobs)
            meta.write_text(json.dumps({"now": clock.now(), "fleet": asdict(fleet)}))
        token = admin_token(sessions, clock)
        settings = load_settings(client_file=workdir / "none.toml", data_dir=workdir)
        timed = Timed(create_app(settings, sessions, clock, run_loops=False))
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
            from fastapi.testclient import TestClient
        with TestClient(timed, headers={"Authorization": f"Bearer {token}"}) as client:
            started, machine_s, own_s = time.perf_counter(), *busy_seconds()
            timings = [measure(client, timed, url, args.requests) for url in URLS]
            machine_now, own_now = busy_seconds()
            others = max(0.0, (machine_now - machine_s) - (own_now - own_s)) / (time.perf_counter() - started)
        return fleet, timings, others
    finally:
        engine.dispose()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--db", type=Path, help="keep the database in this file, and reuse it if it is there")
    parser.add_argument("--json", type=Path, default=Path("bench/results/api-reads.json"))
    args = parser.parse_args()
    # What bench/dashboard.py's builder reads: a small metric history (the lists do not read samples).
    args.history, args.rollup_minutes, args.down, args.failed, args.degraded = 10.0, 2, 4, 3, 5
    args.alerts, args.resolved_alerts, args.seed = 50, 200, 1
    with tempfile.TemporaryDirectory(prefix="gpufleet-bench-api-") as tmp:
        try:
            fleet, timings, others = run(args, Path(tmp))
        except Exception as exc:  # a benchmark that cannot run says why and exits 2
            print(f"bench/api_reads.py: {exc!r}", file=sys.stderr)
            return 2
    print(f"\n{fleet.nodes} nodes x {args.gpus_per_node} GPUs; other processes used {others:.2f} cores meanwhile")
    print(
        f"{'url':<28} {'status':>6} {'bytes':>9} {'p50 ms':>8} {'p95 ms':>8} {'cpu p50':>8} {'repeat':>6} {'p50 ms':>7}"
    )
    for t in timings:
        print(
            f"{t.url:<28} {t.status:>8} {t.bytes:>8,} {t.server_ms['p50']:>8.1f} {t.server_ms['p95']:>8.1f}"
            f" {t.cpu_ms['p50']:>8.1f} {t.repeat_status:>8} {t.repeat_server_ms['p50']:>8.1f}"
        )
    nodes = timings[0]
    met = nodes.server_ms["p50"] <= GOAL_MS and nodes.repeat_status == 304
    print(f"goal: GET /api/v1/nodes p50 <= {GOAL_MS:.0f} ms and 304 on a repeat: {'met' if met else 'MISSED'}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    report = {"machine": machine(), "fleet": asdict(fleet), "others_cores": others, "met": met}
    args.json.write_text(json.dumps(report | {"timings": [asdict(t) for t in timings]}, indent=2))
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
