"""Liveness under API load: does a busy API ever cost a live node its `up`, or delay a dead one's `down`?

bench/liveness.py's run (a real `gpufleet server`, `--nodes` simulated nodes with 1 s heartbeats, `--kill-batch`
nodes killed every `--kill-every` seconds), with API clients hammering the head for the whole measured
window: `wrk` processes (Debian's `wrk`, C, so the clients cost little of the machine), `--per-kind`
connections each, one per kind of request:

- `nodes`: GET /api/v1/nodes (every node, 8 GPUs each);
- `jobs`: GET /api/v1/jobs;
- `submit`: POST /api/v1/jobs, a one-GPU `sleep 120` job (the simulated nodes run them);
- `dashboard`: GET /nodes as the dashboard's live refresh asks for it (htmx fragment, logged-in session).

It reports liveness as bench/liveness.py does (detection p50/p99, false downs, missed) and per kind the
requests per second, p50/p99 latency and non-2xx answers, and the head's CPU.

    .venv/bin/python bench/api_load.py --nodes 1000 --duration 300 --json bench/results/api-load.json

Goal (issue 22): liveness p99 <= 3 s, 0 false downs, 0 missed, while the clients run. Exit status 0 when
met, 1 when not, 2 when the benchmark could not run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import create_engine, text

from gpufleet.core.errors import GpufleetError
from liveness import (
    BOOTSTRAP_TOKEN,
    BenchError,
    ProcessCpu,
    parse_args,
    report,
    run_simulation,
    start_server,
    stop_server,
)

PASSWORD = "correct horse battery staple"  # noqa: S105 - a throwaway user on a throwaway head
JOB = {"argv": ["sleep", "120"], "gpus_per_node": 1, "user": "alice", "project": "bench", "time_limit_s": 600}


def _seconds(text: str) -> float:
    """wrk's latency ("512.00us", "3.20ms", "1.01s") in milliseconds."""
    found = re.fullmatch(r"([0-9.]+)(us|ms|s|m)", text)
    if found is None:
        return float("nan")
    return float(found.group(1)) * {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 6e4}[found.group(2)]


def _lua(method: str, headers: dict[str, str], body: str | None) -> str:
    lines = [f'wrk.method = "{method}"']
    lines += [f'wrk.headers["{k}"] = "{v}"' for k, v in headers.items()]
    if body is not None:
        lines.append(f"wrk.body = '{body}'")
    return "\n".join(lines) + "\n"


@dataclass
class ApiClients:
    """The `Load` bench/liveness.py runs during its window: one wrk process per kind of request; and with
    `kill_leader_after`, the leading head process killed with SIGKILL that many seconds in."""

    workdir: Path
    per_kind: int
    kill_leader_after: float | None = None
    database_url: str | None = None
    procs: dict[str, subprocess.Popen[str]] = field(default_factory=dict)
    killer: threading.Thread | None = None
    takeover: dict[str, Any] = field(default_factory=dict)
    cpu: ProcessCpu | None = None  # the head's processes, measured over the window

    def _set_up(self, url: str) -> str:
        """A user in a project for the submissions, and a logged-in web session for the dashboard."""
        auth = {"Authorization": f"Bearer {BOOTSTRAP_TOKEN}"}
        with httpx.Client(base_url=url, headers=auth, timeout=60) as api:
            for path, body in (
                ("/api/v1/users", {"username": "alice", "role": "operator", "password": PASSWORD}),
                ("/api/v1/projects", {"name": "bench"}),
                ("/api/v1/projects/bench/members", {"user": "alice"}),
            ):
                answer = api.post(path, json=body)
                if answer.status_code >= 300:
                    raise BenchError(f"POST {path} answered {answer.status_code}: {answer.text[:200]}")
        with httpx.Client(base_url=url, timeout=60) as browser:
            form = browser.get("/login")
            csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
            if csrf is None:
                raise BenchError("the login form carries no CSRF token")
            browser.post("/login", data={"username": "alice", "password": PASSWORD, "csrf": csrf.group(1)})
            session = browser.cookies.get("gpufleet_session")
            if not session:
                raise BenchError("logging in to the dashboard gave no session")
        return session

    def start(self, url: str, seconds: float) -> None:
        session = self._set_up(url)
        if self.cpu is not None:
            self.cpu.start()
        bearer = {"Authorization": f"Bearer {BOOTSTRAP_TOKEN}"}
        kinds = {
            "nodes": ("/api/v1/nodes", _lua("GET", bearer, None)),
            "jobs": ("/api/v1/jobs", _lua("GET", bearer, None)),
            "submit": ("/api/v1/jobs", _lua("POST", bearer | {"Content-Type": "application/json"}, json.dumps(JOB))),
            "dashboard": (
                "/nodes",
                _lua("GET", {"HX-Request": "true", "Cookie": f"gpufleet_session={session}"}, None),
            ),
        }
        for kind, (path, lua) in kinds.items():
            script = self.workdir / f"{kind}.lua"
            script.write_text(lua)
            self.procs[kind] = subprocess.Popen(
                ["wrk", "-t1", f"-c{self.per_kind}", f"-d{seconds:.0f}s", "--timeout", "30s", "--latency",
                 "-s", str(script), url + path],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            )  # fmt: skip
        if self.kill_leader_after is not None:
            self.killer = threading.Thread(target=self._kill_leader, args=(url, self.kill_leader_after), daemon=True)
            self.killer.start()

    def _kill_leader(self, url: str, after: float) -> None:
        """SIGKILL the process that answers /healthz as the leader, then time until another one does."""
        time.sleep(after)
        leader = self._leader(url, deadline=time.monotonic() + 30)
        if leader is None:
            self.takeover["error"] = "no process answered as the leader"
            return
        os.kill(leader, signal.SIGKILL)
        killed = time.monotonic()
        successor = self._leader(url, deadline=killed + 60, other_than=leader)
        self.takeover |= {"killed_pid": leader, "successor_pid": successor}
        self.takeover["takeover_s"] = round(time.monotonic() - killed, 2) if successor else None

    @staticmethod
    def _leader(url: str, deadline: float, other_than: int | None = None) -> int | None:
        while time.monotonic() < deadline:
            try:
                answer = httpx.get(url + "/healthz", timeout=2).json()
            except (httpx.HTTPError, ValueError):
                answer = {}
            if answer.get("leader") and answer.get("pid") != other_than:
                return int(answer["pid"])
            time.sleep(0.1)
        return None

    def finish(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for kind, proc in self.procs.items():
            text, _ = proc.communicate(timeout=120)
            rate = re.search(r"Requests/sec:\s+([0-9.]+)", text)
            total = re.search(r"(\d+) requests in", text)
            bad = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
            out[kind] = {
                "clients": self.per_kind,
                "requests": int(total.group(1)) if total else 0,
                "per_s": float(rate.group(1)) if rate else 0.0,
                "non_2xx": int(bad.group(1)) if bad else 0,
            } | {
                f"p{q[:2]}_ms": _seconds(m.group(1))
                for q in ("50%", "99%")
                if (m := re.search(rf"^\s+{q}\s+(\S+)", text, re.M))
            }
        if self.cpu is not None:
            out["cpu_cores_per_process"] = self.cpu.cores()
        if self.killer is not None:
            self.killer.join(timeout=90)
            out["leader_kill"] = self.takeover | self._kept_submissions(out["submit"])
        return out

    def _kept_submissions(self, submit: dict[str, Any]) -> dict[str, Any]:
        """Acknowledged submissions (wrk's 2xx answers) against the jobs the database holds: none lost
        means at least as many rows (a submission answered to no one, cut by the kill, may be there too)."""
        if self.database_url is None:
            return {}
        engine = create_engine(self.database_url)
        try:
            with engine.connect() as conn:
                stored = int(conn.execute(text("SELECT count(*) FROM jobs")).scalar_one())
        finally:
            engine.dispose()
        acknowledged = submit["requests"] - submit["non_2xx"]
        return {"acknowledged_submissions": acknowledged, "stored_jobs": stored, "lost": max(0, acknowledged - stored)}


def load_report(load: dict[str, Any]) -> str:
    lines = ["API clients during the window (wrk):"]
    for kind, row in load.items():
        if kind in ("leader_kill", "cpu_cores_per_process"):
            lines.append(f"  {kind.replace('_', ' ')}: {row}")
            continue
        lines.append(
            f"  {kind:<10} {row['clients']:>3} clients {row['per_s']:8.1f}/s  p50 {row.get('p50_ms', 0):8.1f} ms"
            f"  p99 {row.get('p99_ms', 0):8.1f} ms  non-2xx {row['non_2xx']}"
        )
    return "\n".join(lines)


def main() -> int:
    def more(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--per-kind", type=int, default=4, help="wrk connections per kind of request (4 kinds)")
        parser.add_argument("--database-url", help="PostgreSQL URL of an empty database (default: SQLite)")
        parser.add_argument("--workers", type=int, default=1, help="head processes (several need --database-url)")
        parser.add_argument(
            "--agent-port", type=int, help="serve the agents on this port from a channel process of their own"
        )
        parser.add_argument(
            "--kill-leader-after", type=float, help="SIGKILL the leading head process this many seconds in"
        )

    args = parse_args(more=more)
    if shutil.which("wrk") is None:
        print("bench/api_load.py: needs wrk (apt-get install wrk)", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with tempfile.TemporaryDirectory(prefix="gpufleet-bench-load-") as tmp:
        workdir = Path(tmp)
        extra = {"GPUFLEET_WORKERS": str(args.workers)}
        if args.database_url:
            extra["GPUFLEET_DATABASE_URL"] = args.database_url
        try:
            server = start_server(workdir, args.port, extra, args.agent_port)
        except BenchError as exc:
            print(f"benchmark failed: {exc}", file=sys.stderr)
            return 2
        clients = ApiClients(workdir, args.per_kind, args.kill_leader_after, args.database_url)
        clients.cpu = ProcessCpu(server.proc.pid, server.agent_url if args.agent_port else None)
        try:
            fig = asyncio.run(run_simulation(args, server, workdir, clients))
        except (BenchError, GpufleetError, httpx.HTTPError) as exc:
            print(f"benchmark failed: {exc}\nserver log (last lines):\n{server.log_tail()}", file=sys.stderr)
            return 2
        finally:
            stop_server(server)
            if args.json is not None:  # the head's warnings, beside the figures: what went wrong, if anything
                args.json.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(server.log_path, args.json.with_suffix(".server.log"))
    print(report(fig))
    print(load_report(fig.get("load", {})))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(fig, indent=2) + "\n")
    return 0 if fig["goal"]["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
