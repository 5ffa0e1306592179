"""How fast the head queues a job array, beside single job submissions, through the real app.

Builds a migrated SQLite database (WAL, as the head runs it) in a fresh temp dir with `--nodes` nodes
of 8 GPUs up and one user, then with the real app (`create_app`, no background loops) and an admin
token, in this process (Starlette's TestClient: the HTTP layer, routing, auth, the audit record and the
route's transaction, no sockets):

- submits `--rounds` arrays of `--tasks` tasks each (`POST /api/v1/jobs` with `array`), and reports the
  tasks queued per second of each call's wall time (best and median);
- submits `--singles` single jobs one after another and reports jobs per second (the comparison);
- lists the queue with every array collapsed (`GET /api/v1/jobs`, what `gpufleet job list` asks for)
  and one page of it expanded, and cancels one whole array (`POST /api/v1/jobs/arrays/{id}/cancel`).

    .venv/bin/python bench/job_arrays.py
    .venv/bin/python bench/job_arrays.py --tasks 10000 --rounds 3 --singles 500 --json bench/results/job_arrays.json
    .venv/bin/python bench/job_arrays.py --url postgresql+psycopg://USER@HOST:PORT/EMPTY_DB

Goal (issue 22): at least 10,000 array tasks queued per second. Exit status 0 when met, 1 when not,
2 when the benchmark could not run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from gpufleet.api.app import create_app
from gpufleet.auth import service as auth
from gpufleet.auth.schemas import UserCreate
from gpufleet.auth.users import create_user
from gpufleet.core.clock import SystemClock
from gpufleet.core.config import load_settings
from gpufleet.core.db import make_engine, make_session_factory, transaction
from gpufleet.inventory import service as inventory
from gpufleet.inventory.schemas import NodeSettings
from gpufleet.inventory.states import NodeState
from gpufleet.migrations import upgrade
from gpufleet.protocol.inventory import GpuInfo, NodeInventory

GOAL_TASKS_PER_S = 10_000
ADMIN_TOKEN = "gfa_bench-job-arrays-admin-token-0123456789"  # noqa: S105 (a throwaway database)


def _inventory(name: str) -> NodeInventory:
    gpus = [
        GpuInfo(
            index=i,
            uuid=f"GPU-{name}-{i}",
            model="NVIDIA H200",
            pci_bus_id=f"00000000:{i + 1:02x}:00.0",
            memory_total_mib=143771,
        )
        for i in range(8)
    ]
    return NodeInventory(hostname=name, cpus=64, memory_total_mib=512 * 1024, gpu_source="nvml", gpus=gpus)


def build(url: str, nodes: int) -> Any:
    """A migrated database with `nodes` nodes up and user alice; returns its session factory and engine."""
    engine = make_engine(url)
    upgrade(engine)
    sessions = make_session_factory(engine)
    clock = SystemClock()
    with transaction(sessions) as s:
        auth.ensure_admin_token(s, clock, ADMIN_TOKEN)
        create_user(s, clock, UserCreate(username="alice"))
        for node in inventory.add_nodes(s, clock, [f"gpu[001-{nodes:03d}]"], NodeSettings()):
            inventory.apply_inventory(s, clock, node, _inventory(node.name))
            node.state = NodeState.UP
    return engine, sessions, clock


def timed(call: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    answer = call()
    return time.perf_counter() - started, answer


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    url = args.url or f"sqlite:///{workdir / 'gpufleet.db'}"
    engine, sessions, clock = build(url, args.nodes)
    try:
        settings = load_settings(client_file=workdir / "none.toml", data_dir=workdir)
        app = create_app(settings, sessions, clock, run_loops=False)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
            from fastapi.testclient import TestClient
        spec = {"user": "alice", "argv": ["python", "sweep.py"], "env": {"DATA": "/data/x"}, "gpus_per_node": 1}
        with TestClient(app, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as client:

            def post(body: dict[str, Any]) -> dict[str, Any]:
                answer = client.post("/api/v1/jobs", json=body)
                if answer.status_code != 201:
                    raise RuntimeError(f"submit answered {answer.status_code}: {answer.text[:300]}")
                result: dict[str, Any] = answer.json()
                return result

            post(spec)  # warm up: the first request builds the app's caches
            array_s, arrays = [], []
            for _ in range(args.rounds):
                seconds, first = timed(lambda: post(spec | {"array": f"0-{args.tasks - 1}%50"}))
                assert first["array_tasks"] == args.tasks
                array_s.append(seconds)
                arrays.append(first["id"])
                print(f"array of {args.tasks:,} tasks: {seconds * 1000:,.0f} ms, {args.tasks / seconds:,.0f} tasks/s")
            single_s, _ = timed(lambda: [post(spec) for _ in range(args.singles)])
            print(f"{args.singles} single submissions: {args.singles / single_s:,.1f} jobs/s")
            queued = args.tasks * args.rounds + args.singles + 1
            list_ms = []
            for _ in range(args.list_requests):
                seconds, rows = timed(lambda: client.get("/api/v1/jobs", params={"state": ["running", "pending"]}))
                list_ms.append(seconds * 1000)
            collapsed_rows = len(rows.json())
            seconds, page = timed(lambda: client.get("/api/v1/jobs", params={"expand": "true", "limit": 500}))
            expanded_ms = seconds * 1000
            seconds, cancelled = timed(lambda: client.post(f"/api/v1/jobs/arrays/{arrays[0]}/cancel"))
            assert cancelled.json()["cancelled"] == args.tasks, cancelled.text
            cancel_ms = seconds * 1000
        best = min(array_s)
        return {
            "machine": {
                "python": platform.python_version(),
                "platform": platform.platform(),
                "cpu": platform.processor() or platform.machine(),
                "cpus": os.cpu_count(),
                "load_avg_1m": os.getloadavg()[0],
            },
            "database": engine.dialect.name,
            "tasks_per_array": args.tasks,
            "array_tasks_per_s_best": round(args.tasks / best),
            "array_tasks_per_s_median": round(args.tasks / statistics.median(array_s)),
            "array_submit_ms": [round(s * 1000, 1) for s in array_s],
            "single_jobs_per_s": round(args.singles / single_s, 1),
            "array_vs_single": round((args.tasks / best) / (args.singles / single_s), 1),
            "queued_jobs": queued,
            "list_collapsed_rows": collapsed_rows,
            "list_collapsed_ms_p50": round(statistics.median(list_ms), 1),
            "list_collapsed_ms_max": round(max(list_ms), 1),
            "list_expanded_500_ms": round(expanded_ms, 1),
            "expanded_rows": len(page.json()),
            "cancel_array_ms": round(cancel_ms, 1),
        }
    finally:
        engine.dispose()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=10_000, help="tasks per array")
    parser.add_argument("--rounds", type=int, default=3, help="arrays submitted (each timed)")
    parser.add_argument("--singles", type=int, default=500, help="single jobs submitted one after another")
    parser.add_argument("--nodes", type=int, default=16, help="nodes of 8 GPUs (the capacity check reads them)")
    parser.add_argument("--list-requests", type=int, default=10, help="timed GETs of the collapsed queue")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--url", help="an empty database to use instead of a temp SQLite one, e.g. a PostgreSQL URL (migrated here)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpufleet-bench-arrays-") as tmp:
        try:
            result = run(args, Path(tmp))
        except (RuntimeError, AssertionError) as exc:
            print(f"bench/job_arrays.py: {exc}", file=sys.stderr)
            return 2
    print(json.dumps(result, indent=2))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    met = result["array_tasks_per_s_best"] >= GOAL_TASKS_PER_S
    print(f"goal: >= {GOAL_TASKS_PER_S:,} array tasks/s: {'met' if met else 'MISSED'}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
