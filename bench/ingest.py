"""How many metric values per second does the head store, and what does each million cost it?

Starts `gpufleet server` (SQLite in a fresh temp dir) as a subprocess, joins N nodes, opens N agent
channels from this process and, on each, sends a heartbeat and a `metrics` message every
`--interval` seconds: one sample of 8 GPUs x 33 GPU metrics, the host, a disk, a NIC and an
InfiniBand port (about 300 values), with H200-like values. After `--duration` seconds it stops the
load, lets the head flush, stops the head, and counts the rows that reached the database.

    .venv/bin/python bench/ingest.py --nodes 1000 --interval 1 --duration 60 --json bench/results/ingest-1000.json

Reports values stored per second (over the load window), the head's CPU seconds per million values,
and the values dropped (offered minus stored). The load generator runs on the same machine and
competes for its cores; its CPU is reported too. Goal (issue 4): >= 300,000 values/s.
Exit status 0 when met, 1 when not, 2 when the benchmark could not run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
from websockets.asyncio.client import connect

from gpufleet.protocol.messages import Heartbeat, Hello
from gpufleet.protocol.metrics import GPU_METRICS, HOST_METRICS, IB_METRICS, NIC_METRICS

TOKEN = "gfa_bench_ingest_0123456789abcdef"  # noqa: S105 - a throwaway head on 127.0.0.1
GOAL_VALUES_PER_S = 300_000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def sample_template(gpus: int) -> tuple[str, int]:
    """A metrics message with a `"TS"` placeholder for the time, and how many values it carries."""
    rng = random.Random(7)
    entities: list[dict[str, Any]] = [
        {"entity": "host", "values": {m: round(rng.uniform(0, 60), 2) for m in HOST_METRICS}},
        {
            "entity": "disk:/",
            "values": {"disk_total_bytes": 1.9e12, "disk_used_pct": 41.5, "disk_inodes_used_pct": 3.2},
        },
        {"entity": "nic:eth0", "values": {m: float(rng.randint(0, 10**9)) for m in NIC_METRICS}},
        {"entity": "ib:mlx5_0/1", "values": dict.fromkeys(IB_METRICS, 0.0) | {"ib_state": 4.0, "ib_phys_state": 5.0}},
    ]
    healthy = {  # what a healthy H200 reports for the counters and states the health checks read
        "clocks_event_reasons": 0.0,
        "pcie_link_width": 16.0,
        "pcie_link_width_max": 16.0,
        "nvlink_links_up": 18.0,
        "nvlink_links_total": 18.0,
        "gpu_temp_c": 45.0,
    } | {m: 0.0 for m in GPU_METRICS if m.startswith(("ecc_", "retired_", "remapped_", "xid"))}
    for index in range(gpus):
        values = {m: round(rng.uniform(0, 700), 2) for m in GPU_METRICS} | healthy
        entities.append({"entity": f"gpu:{index}", "values": values})
    values = sum(len(e["values"]) for e in entities)
    message = json.dumps({"type": "metrics", "samples": [{"ts": "TS", "entities": entities}]})
    return message, values


def start_head(workdir: Path, port: int, interval: float) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
    env |= {
        "GPUFLEET_BOOTSTRAP_TOKEN": TOKEN,
        "GPUFLEET_LOG_LEVEL": "WARNING",
        "GPUFLEET_CLIENT_CONFIG": str(workdir / "none.toml"),
        "GPUFLEET_METRICS_INTERVAL_S": str(interval),
        "GPUFLEET_HEARTBEAT_INTERVAL_S": "1.0",
    }
    cmd = [
        sys.executable,
        "-m",
        "gpufleet.entry",
        "server",
        "--data-dir",
        str(workdir),
        "--listen",
        f"127.0.0.1:{port}",
    ]
    log = (workdir / "server.log").open("wb")
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def wait_healthy(url: str, proc: subprocess.Popen[bytes], workdir: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited: {(workdir / 'server.log').read_text()[-2000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    raise SystemExit("server did not start")


def join_all(url: str, nodes: int) -> list[str]:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=url, timeout=60) as http:
        join = http.post("/api/v1/tokens/join", json={"expires_in_s": 3600, "uses": nodes}, headers=auth).json()
        credentials = []
        for i in range(nodes):
            body = {"name": f"ing{i:04d}"}
            response = http.post("/api/v1/agent/join", json=body, headers={"Authorization": f"Bearer {join['token']}"})
            response.raise_for_status()
            credentials.append(response.json()["credential"])
    return credentials


async def one_node(ws_url: str, credential: str, template: str, interval: float, stop: float, sent: list[int]) -> None:
    async with connect(
        ws_url, additional_headers={"Authorization": f"Bearer {credential}"}, compression=None, max_size=2**20
    ) as ws:
        await ws.send(Hello(heartbeat_interval_s=1.0, inventory_fingerprint="x").model_dump_json())
        await ws.recv()  # welcome
        reader = asyncio.create_task(_drain(ws))
        seq = 0
        loop = asyncio.get_running_loop()
        await asyncio.sleep(random.uniform(0, interval))
        next_at = loop.time()
        while time.time() < stop:
            seq += 1
            await ws.send(Heartbeat(seq=seq).model_dump_json())
            await ws.send(template.replace('"TS"', repr(time.time()), 1))
            sent[0] += 1
            next_at += interval
            await asyncio.sleep(max(0.0, next_at - loop.time()))
        reader.cancel()


async def _drain(ws: Any) -> None:
    async for _ in ws:
        pass


async def load(url: str, credentials: list[str], template: str, interval: float, duration: float) -> tuple[int, float]:
    ws_url = url.replace("http://", "ws://") + "/api/v1/agent/channel"
    sent = [0]
    start = time.time()
    stop = start + duration
    await asyncio.gather(*(one_node(ws_url, c, template, interval, stop, sent) for c in credentials))
    return sent[0], start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between samples per node")
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    template, values_per_sample = sample_template(args.gpus)
    with tempfile.TemporaryDirectory(prefix="gpufleet-ingest-") as tmp:
        workdir = Path(tmp)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        proc = start_head(workdir, port, args.interval)
        try:
            wait_healthy(url, proc, workdir)
            credentials = join_all(url, args.nodes)
            head = psutil.Process(proc.pid)
            if os.environ.get("INGEST_PROFILE"):  # e.g. INGEST_PROFILE=/tmp/head.txt: where the head spends its CPU
                subprocess.Popen(
                    [
                        "py-spy",
                        "record",
                        "-p",
                        str(proc.pid),
                        "-d",
                        str(int(args.duration)),
                        "-f",
                        "raw",
                        "-o",
                        os.environ["INGEST_PROFILE"],
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            me = psutil.Process()
            head_cpu0, me_cpu0 = sum(head.cpu_times()[:2]), sum(me.cpu_times()[:2])
            sent, started = asyncio.run(load(url, credentials, template, args.interval, args.duration))
            window = time.time() - started
            time.sleep(3 * 1.0 + 1)  # two metrics flushes and a margin
            head_cpu = sum(head.cpu_times()[:2]) - head_cpu0
            load_cpu = sum(me.cpu_times()[:2]) - me_cpu0
        finally:
            proc.terminate()
            proc.wait(timeout=60)
        with sqlite3.connect(workdir / "gpufleet.db") as db:
            rows = db.execute("SELECT count(*) FROM metric_samples").fetchone()[0]
    stored_values = rows * values_per_sample  # one row per sample
    result = {
        "nodes": args.nodes,
        "gpus_per_node": args.gpus,
        "interval_s": args.interval,
        "window_s": round(window, 1),
        "values_per_sample": values_per_sample,
        "samples_offered": sent,
        "values_offered_per_s": round(sent * values_per_sample / window),
        "rows_stored": rows,
        "values_stored_per_s": round(stored_values / window),
        "values_lost": round(sent * values_per_sample - stored_values),
        "head_cpu_s": round(head_cpu, 1),
        "head_cpu_s_per_million_values": round(head_cpu / (stored_values / 1e6), 2) if stored_values else None,
        "head_cores": round(head_cpu / window, 2),
        "load_generator_cores": round(load_cpu / window, 2),
        "machine_cores": psutil.cpu_count(),
    }
    for key, value in result.items():
        print(f"{key:32} {value}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["values_stored_per_s"] >= GOAL_VALUES_PER_S else 1


if __name__ == "__main__":
    sys.exit(main())
