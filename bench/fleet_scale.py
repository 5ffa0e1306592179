"""The head at fleet scale: thousands of simulated nodes at a slower heartbeat, across several head
processes on PostgreSQL. How far does this machine carry it, and what does each 1,000 nodes cost?

bench/liveness.py's run (a real `gpufleet server`, nodes simulated in this process, a batch killed every
`--kill-every` seconds and restarted a round later) with `--heartbeat` seconds between beats (the
deadline and the goal scale with it: down after 2.5 beats, p99 at most that plus 0.5 s), on PostgreSQL
with `--workers` head processes (and with `--agent-port`, a channel process of their own for the
agents). It reports liveness as bench/liveness.py does and the cores of each head process and of
PostgreSQL over the window, and per 1,000 nodes.

    .venv/bin/python bench/fleet_scale.py --nodes 4000 --heartbeat 5 --workers 2 \\
        --database-url postgresql+psycopg://USER@HOST/EMPTY_DB --json bench/results/fleet-4000.json

The agents send metrics (8 GPUs each) every `--metrics-interval` seconds, 5 by default as the head's
default; a longer one (30 s) leaves the simulator and the head more of the machine for heartbeats. Exit
status 0 when the goal is met, 1 when not, 2 when the benchmark could not run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

import liveness
from gpufleet.core.errors import GpufleetError


class Window:
    """The `Load` run during the measured window: nothing but the CPU of the head's processes."""

    def __init__(self, cpu: liveness.ProcessCpu) -> None:
        self.cpu = cpu

    def start(self, url: str, seconds: float) -> None:
        self.cpu.start()

    def finish(self) -> dict[str, Any]:
        return {"cpu_cores_per_process": self.cpu.cores()}


def per_thousand(cores: dict[str, float], nodes: int) -> dict[str, float]:
    return {name: round(value * 1000 / nodes, 3) for name, value in cores.items()}


def main() -> int:
    early = argparse.ArgumentParser(add_help=False)
    early.add_argument("--heartbeat", type=float, default=5.0)
    liveness.set_heartbeat(early.parse_known_args()[0].heartbeat)

    def more(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--heartbeat", type=float, default=5.0, help="seconds between heartbeats")
        parser.add_argument("--database-url", required=True, help="PostgreSQL URL of an empty database")
        parser.add_argument("--workers", type=int, default=2, help="head processes")
        parser.add_argument("--agent-port", type=int, help="serve the agents from a channel process on this port")

    args = liveness.parse_args(more=more)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with tempfile.TemporaryDirectory(prefix="gpufleet-bench-scale-") as tmp:
        workdir = Path(tmp)
        extra = {
            "GPUFLEET_WORKERS": str(args.workers),
            "GPUFLEET_DATABASE_URL": args.database_url,
            "GPUFLEET_METRICS_INTERVAL_S": str(args.metrics_interval),
        }
        try:
            server = liveness.start_server(workdir, args.port, extra, args.agent_port)
        except liveness.BenchError as exc:
            print(f"benchmark failed: {exc}", file=sys.stderr)
            return 2
        window = Window(liveness.ProcessCpu(server.proc.pid, server.agent_url if args.agent_port else None))
        try:
            fig = asyncio.run(liveness.run_simulation(args, server, workdir, window))
        except (liveness.BenchError, GpufleetError, httpx.HTTPError) as exc:
            print(f"benchmark failed: {exc}\nserver log (last lines):\n{server.log_tail()}", file=sys.stderr)
            return 2
        finally:
            liveness.stop_server(server)
    cores = fig.get("load", {}).get("cpu_cores_per_process", {})
    fig["cpu_cores_per_1000_nodes"] = per_thousand(cores, args.nodes)
    fig["metrics_interval_s"] = args.metrics_interval
    print(liveness.report(fig))
    print(f"  metrics interval {args.metrics_interval:g}s")
    print(f"  cores per process      {cores}")
    print(f"  per 1,000 nodes        {fig['cpu_cores_per_1000_nodes']}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(fig, indent=2) + "\n")
    return 0 if fig["goal"]["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
