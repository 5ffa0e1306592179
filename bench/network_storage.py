"""What polling switches and shared mounts' counters cost the head, in CPU.

Three parts; the first two against a real `gpufleet server` subprocess each (SQLite in a fresh temp dir,
started as bench/liveness.py does), its CPU read with psutil (user + system of the server and its children):

* switches: real SNMP agents from scripts/services/snmp.sh (snmpsim serving the real switches' recordings
  in tests/fixtures/snmp, one v2c community per copy; by default the Arista, the Cisco and the HPE twice:
  59 + 57 + 42 + 42 = 200 ports). First, in this process, the head's own loop (`NetworkLoops.poll_once`:
  `snmp.poll` on a thread pool, then `service.record_poll` and the alerts in one transaction per switch)
  on a migrated SQLite database, a few rounds, to split a round's CPU into SNMP and database. Then the real
  head: its idle CPU with nothing registered, the switches registered through POST /api/v1/switches, and
  its CPU over `--rounds` poll rounds at the default `switch_poll_interval_s` (rounds seen by reading each
  switch's `polled_at` straight from the head's SQLite file, which costs the head nothing).
* mounts: `--nodes` simulated nodes (gpufleet.sim, the agent's real code; each with one NFS mount,
  `--shared-mount`, whose real StorageCollector sends the `fs:<mount>` entity with its mountstats counters
  every metrics interval) run in this process against a second head. Once all are healthy, the agents'
  storage collector is switched off and on in turn (off, on, on, off, ...), each window after a settling
  time, so the head's CPU with and without the mounts' counters is compared on the same head and the same
  1,000 channels; the difference is what the counters cost it (ingest, the tracker, StorageWatch in the
  health pass). Then GET /api/v1/storage (the fleet view) is called a few times and timed.
* local: the head's metrics path in this process (`LocalHead`: the channel's parse, MonitoringLoops'
  ingest, flush and health pass, a minute's roll-up, the fleet view as the route builds it), each on a
  migrated SQLite file, fed the same nodes' real samples (each simulated node's own sampler) with and
  without the fs entity. On a shared 2-core machine the real head's with/without difference is within the
  noise of its CPU (other processes change how much it batches); this is the figure that resolves it.

    .venv/bin/python bench/network_storage.py --json bench/results/network-storage.json
    .venv/bin/python bench/network_storage.py --part mounts --pairs 3     # the mounts part (and local) again

Needs snmpd, snmp and snmpsim's venv (`bash scripts/services/snmp.sh install`). Takes about 11 minutes
with the defaults. Exit status 0 when it ran, 2 when it could not.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import platform
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
from pydantic import TypeAdapter

import liveness
from gpufleet.agent.storage.collector import StorageCollector
from gpufleet.core import gc_tuning
from gpufleet.core.clock import FakeClock, SystemClock
from gpufleet.core.config_network import NetworkSettings
from gpufleet.core.credentials import CredentialBox
from gpufleet.core.db import make_engine, make_session_factory, transaction
from gpufleet.core.errors import GpufleetError
from gpufleet.inventory import service as inventory
from gpufleet.inventory.schemas import NodeSettings
from gpufleet.jobs.builtin import BuiltinWorkloadManager
from gpufleet.migrations import upgrade
from gpufleet.monitoring import store
from gpufleet.monitoring.health import HealthJudge
from gpufleet.monitoring.storage import StorageWatch, fleet_of_replica
from gpufleet.monitoring.storage_schemas import FileSystemOut
from gpufleet.monitoring.store import ROLLUP_BUCKET_S
from gpufleet.monitoring.tracker import HealthTracker
from gpufleet.network import service
from gpufleet.network.schemas import SwitchIn
from gpufleet.network.snmp import SnmpTarget, SwitchReading, poll
from gpufleet.protocol.bounds import without_nul
from gpufleet.protocol.messages import Metrics, agent_message_adapter
from gpufleet.sim.runner import SimOptions, Simulation, node_names
from gpufleet.workers.monitoring_loops import MonitoringLoops
from gpufleet.workers.network_loops import NetworkLoops

ROOT = Path(__file__).resolve().parent.parent
SNMP_SH = ROOT / "scripts" / "services" / "snmp.sh"
RECORDINGS = ROOT / "tests" / "fixtures" / "snmp"
SWITCHES = ("arista-dcs-7150s-52-cl", "cisco-c3560", "hpe-procurve-516733-b21", "hpe-procurve-516733-b21")
SHARED_MOUNT = "/shared"
BenchError = liveness.BenchError


def cores(cpu_s: float, wall_s: float) -> float:
    return cpu_s / wall_s if wall_s > 0 else 0.0


@dataclass
class Meter:
    """CPU of the head (process tree), this process and the rest of the machine over a window."""

    head: psutil.Process
    extra: list[psutil.Process] = field(default_factory=list)  # reported apart (snmpsim)
    at: tuple[float, ...] = ()

    def _read(self) -> tuple[float, ...]:
        extra = sum(liveness.cpu_seconds(p) for p in self.extra)
        return (
            time.monotonic(),
            liveness.tree_cpu_seconds(self.head),
            liveness.cpu_seconds(psutil.Process()),
            liveness.machine_busy_seconds(),
            extra,
        )

    def start(self) -> None:
        self.at = self._read()

    def stop(self) -> dict[str, float]:
        now = self._read()
        wall, head, me, busy, extra = (b - a for a, b in zip(self.at, now, strict=True))
        return {
            "wall_s": wall,
            "head_cpu_s": head,
            "head_cores": cores(head, wall),
            "bench_cores": cores(me, wall),
            "other_cores": max(0.0, cores(busy - head - me - extra, wall)),
            "extra_cpu_s": extra,
        }


# -- switches ---------------------------------------------------------------------------------------
@dataclass
class Snmp:
    env: dict[str, str]
    port: int
    communities: list[str]
    snmpsim: psutil.Process | None


def start_snmp(workdir: Path, port: int, recordings: list[str]) -> Snmp:
    """snmp.sh's snmpsim (and snmpd) on `port` (and port + 1), serving a copy of each recording under a
    community of its own (sw1-..., sw2-...): the same recording twice is two switches."""
    data = workdir / "recordings"
    data.mkdir(parents=True)
    communities = []
    for i, name in enumerate(recordings, 1):
        source = RECORDINGS / f"{name}.snmprec"
        if not source.is_file():
            raise BenchError(f"no recording {source}")
        community = f"sw{i}-{name}"
        shutil.copy(source, data / f"{community}.snmprec")
        communities.append(community)
    env = {
        "GPUFLEET_SNMPSIM_PORT": str(port),
        "GPUFLEET_SNMPD_PORT": str(port + 1),
        "GPUFLEET_SERVICES_RUN": str(workdir / "services"),
        "GPUFLEET_SNMP_RECORDINGS": str(data),
    }
    done = subprocess.run(
        ["bash", str(SNMP_SH), "start"],
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **env},
    )
    if done.returncode != 0:
        raise BenchError(f"snmp.sh start failed: {(done.stderr or done.stdout).strip()[-800:]}")
    env_file = Path(done.stdout.strip().splitlines()[-1])
    values = dict(line.split("=", 1) for line in env_file.read_text().splitlines() if "=" in line)
    snmpsim = None
    with contextlib.suppress(psutil.Error, KeyError, ValueError):
        snmpsim = psutil.Process(int(values["GPUFLEET_SNMPSIM_PID"]))
    return Snmp(env, port, communities, snmpsim)


def stop_snmp(snmp: Snmp) -> None:
    subprocess.run(
        ["bash", str(SNMP_SH), "stop"], capture_output=True, timeout=120, env={**os.environ, **snmp.env}, check=False
    )


def switch_specs(snmp: Snmp) -> list[SwitchIn]:
    return [
        SwitchIn.model_validate({"name": c[:63], "address": "127.0.0.1", "port": snmp.port, "community": c})
        for c in snmp.communities
    ]


def in_process_rounds(workdir: Path, snmp: Snmp, rounds: int, interval_s: float) -> dict[str, Any]:
    """The head's loop (`NetworkLoops.poll_once`, as its worker thread runs it) in this process, on a migrated
    SQLite file: CPU of each round, and of the SNMP polls within it (each poll's thread CPU)."""
    engine = make_engine(f"sqlite:///{workdir / 'in-process.db'}")
    upgrade(engine)
    sessions = make_session_factory(engine)
    box = CredentialBox.generate()
    clock = SystemClock()
    with transaction(sessions) as session:
        for spec in switch_specs(snmp):
            service.add_switch(session, clock, box, spec)
    lock = threading.Lock()
    snmp_cpu: list[float] = []
    ports: dict[str, int] = {}

    def timed_poll(target: SnmpTarget) -> SwitchReading:
        started = time.thread_time()
        try:
            reading = poll(target)
        finally:
            with lock:
                snmp_cpu.append(time.thread_time() - started)
        with lock:
            ports[target.credential.community or ""] = len(reading.ports)
        return reading

    loops = NetworkLoops(
        sessions=sessions,
        clock=clock,
        box=lambda: box,
        interval_s=interval_s,
        is_leader=lambda: True,
        poller=timed_poll,
    )
    out = []
    for _ in range(rounds):
        snmp_cpu.clear()
        wall0, cpu0 = time.perf_counter(), time.process_time()
        answered = loops.poll_once()
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        if answered != len(snmp.communities):
            raise BenchError(f"in-process round: {answered} of {len(snmp.communities)} switches answered")
        out.append({"cpu_s": cpu, "snmp_cpu_s": sum(snmp_cpu), "wall_s": wall})
        time.sleep(1.0)  # rates need time between readings
    engine.dispose()
    steady = out[1:] or out
    return {
        "ports": ports,
        "ports_total": sum(ports.values()),
        "rounds": out,
        "first_cpu_s": out[0]["cpu_s"],
        "steady_cpu_s": statistics.fmean(r["cpu_s"] for r in steady),
        "steady_snmp_cpu_s": statistics.fmean(r["snmp_cpu_s"] for r in steady),
        "steady_wall_s": statistics.fmean(r["wall_s"] for r in steady),
    }


def read_polled(db: Path) -> dict[str, str | None]:
    """Each switch's polled_at, read from the head's SQLite file (read-only; the head does no work for it)."""
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)) as conn:
        return dict(conn.execute("SELECT name, polled_at FROM switches").fetchall())


def wait_round(db: Path, before: dict[str, str | None], timeout_s: float) -> dict[str, str | None]:
    """Until every switch's polled_at differs from `before` (a whole round recorded); returns them."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(sqlite3.Error):
            now = read_polled(db)
            if now and all(v is not None and v != before.get(k) for k, v in now.items()):
                return now
        time.sleep(0.25)
    raise BenchError(f"no whole poll round within {timeout_s:.0f} s")


def switches_part(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    interval = args.interval or float(NetworkSettings.model_fields["switch_poll_interval_s"].default)
    snmp = start_snmp(workdir / "snmp", args.snmpsim_port, list(args.switches))
    try:
        print(f"snmpsim on 127.0.0.1:{snmp.port}: {', '.join(snmp.communities)}", flush=True)
        local = in_process_rounds(workdir, snmp, args.probe_rounds, interval)
        print(
            f"in process: {local['ports_total']} ports, a steady round {local['steady_cpu_s']:.3f} CPU s"
            f" ({local['steady_snmp_cpu_s']:.3f} s of it SNMP), {local['steady_wall_s']:.2f} s wall",
            flush=True,
        )
        headdir = workdir / "head-switches"
        headdir.mkdir()
        extra = {"GPUFLEET_SWITCH_POLL_INTERVAL_S": str(interval)} if args.interval else {}
        server = liveness.start_server(headdir, args.port, extra)
        try:
            liveness.wait_healthy(server)
            liveness.wait_for_leader(server)
            meter = Meter(psutil.Process(server.proc.pid), [snmp.snmpsim] if snmp.snmpsim else [])
            time.sleep(3.0)
            print(f"head idle, nothing registered: measuring {args.idle:.0f} s", flush=True)
            meter.start()
            time.sleep(args.idle)
            idle = meter.stop()
            headers = {"Authorization": f"Bearer {liveness.BOOTSTRAP_TOKEN}"}
            with httpx.Client(base_url=server.url, headers=headers, timeout=30) as http:
                for spec in switch_specs(snmp):
                    body = spec.model_dump(mode="json", exclude_none=True)
                    body["community"] = spec.community.get_secret_value() if spec.community else None
                    answer = http.post("/api/v1/switches", json=body)
                    if answer.status_code != 201:
                        raise BenchError(f"POST /api/v1/switches: {answer.status_code} {answer.text[:300]}")
            db = headdir / "head" / "gpufleet.db"
            polled = wait_round(db, {}, interval + 60)  # the first round: ports inserted, no rates yet
            print(f"switches registered and polled once; measuring {args.rounds} rounds at {interval:g} s", flush=True)
            meter.start()
            for _ in range(args.rounds):
                polled = wait_round(db, polled, interval + 60)
            window = meter.stop()
            with httpx.Client(base_url=server.url, headers=headers, timeout=30) as http:
                listed = http.get("/api/v1/switches").json()
        finally:
            liveness.stop_server(server)
    finally:
        stop_snmp(snmp)
    idle_rate = idle["head_cores"]
    per_round = (window["head_cpu_s"] - idle_rate * window["wall_s"]) / args.rounds
    errors = [s["last_error"] for s in listed if s.get("last_error")]
    return {
        "interval_s": interval,
        "switches": [
            {"name": s["name"], "ports": s["ports_total"], "ports_up": s["ports_up"], "sensors": len(s["sensors"])}
            for s in listed
        ],
        "ports_total": sum(s["ports_total"] for s in listed),
        "errors": errors,
        "in_process": local,
        "idle": idle,
        "window": window,
        "rounds": args.rounds,
        "head_cpu_s_per_round": per_round,
        "head_cores_at_interval": per_round / interval,
        "head_cores_raw": window["head_cores"],
        "snmpsim_cpu_s_per_round": window["extra_cpu_s"] / args.rounds,
    }


# -- mounts -----------------------------------------------------------------------------------------
def set_storage(sim: Simulation, kept: dict[str, list[Any]], on: bool) -> None:
    """Every agent's sampler with or without its StorageCollector (the list is replaced, never edited: a
    collection running in a worker thread keeps the one it started with)."""
    for name, agent in sim.agents.items():
        sampler: Any = agent.options.metrics  # the sim's agents' Sampler (a SampleSource to the agent)
        if sampler is None:
            continue
        collectors = getattr(sampler, "collectors", None)
        if collectors is None:
            raise BenchError("the agents' sampler has no collectors list: this benchmark needs updating")
        if name not in kept:
            kept[name] = [c for c in collectors if isinstance(c, StorageCollector)]
        others = [c for c in collectors if not isinstance(c, StorageCollector)]
        sampler.collectors = others + (kept[name] if on else [])


async def mounts_part(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    headdir = workdir / "head-mounts"
    headdir.mkdir()
    server = liveness.start_server(headdir, args.port)
    try:
        await asyncio.to_thread(liveness.wait_healthy, server)
        leader_at = await asyncio.to_thread(liveness.wait_for_leader, server)
        headers = {"Authorization": f"Bearer {liveness.BOOTSTRAP_TOKEN}"}
        async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=120) as http:
            return await _mounts(args, workdir, server, http, leader_at)
    finally:
        liveness.stop_server(server)


async def _mounts(
    args: argparse.Namespace, workdir: Path, server: liveness.ServerProcess, http: httpx.AsyncClient, leader_at: float
) -> dict[str, Any]:
    # Spare uses: under load an agent may time out on a join the head did record, and join again.
    body = {"expires_in_s": 3600, "uses": 3 * args.nodes}
    join = (await http.post("/api/v1/tokens/join", json=body)).json()
    sim = Simulation(
        SimOptions(
            server=server.url,
            join_token=join["token"],
            nodes=args.nodes,
            gpus_per_node=8,
            state_dir=workdir / "sim",
            metrics_interval_s=args.metrics_interval,
            shared_mounts=[SHARED_MOUNT],
        )
    )
    sim.build()
    gc_tuning.tune_for_long_running()
    started = time.monotonic()
    task = asyncio.create_task(sim.run())
    try:
        return await _measure_mounts(args, sim, task, server, http, leader_at, started)
    finally:
        # All agents at once (Simulation.close stops them one after the other: minutes for 1,000).
        agents = list(sim.tasks.values())
        for agent_task in agents:
            agent_task.cancel()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*agents, return_exceptions=True), 60)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.wait_for(task, 60)


async def _measure_mounts(
    args: argparse.Namespace,
    sim: Simulation,
    task: asyncio.Task[None],
    server: liveness.ServerProcess,
    http: httpx.AsyncClient,
    leader_at: float,
    started: float,
) -> dict[str, Any]:
    progress = [time.monotonic()]

    async def ready() -> bool:
        if task.done():
            task.result()
            raise BenchError("the simulator stopped")
        try:  # a loaded head may drop an idle kept-alive connection as it is reused: ask again
            rows = (await http.get("/api/v1/health")).json()
            healthy = sum(1 for r in rows if r["health"] == "healthy")
            if time.monotonic() - progress[0] > 20:
                progress[0] = time.monotonic()
                print(f"  {healthy} of {args.nodes} nodes healthy", flush=True)
            if healthy < args.nodes:
                return False
            systems = (await http.get("/api/v1/storage")).json()
        except httpx.HTTPError:
            return False
        return len(systems) == 1 and systems[0]["nodes_total"] == args.nodes

    await liveness.until(ready, 300, f"{args.nodes} nodes were not all healthy with their mount seen", every_s=2.0)
    up_s = time.monotonic() - started
    print(f"{args.nodes} nodes healthy, /shared seen on all, after {up_s:.0f} s", flush=True)
    await asyncio.sleep(max(0.0, leader_at + liveness.LEADER_GRACE_S + 1.0 - time.time()))
    meter = Meter(psutil.Process(server.proc.pid))
    kept: dict[str, list[Any]] = {}
    windows: list[dict[str, Any]] = []
    for pair in range(args.pairs):
        for on in (False, True) if pair % 2 == 0 else (True, False):
            set_storage(sim, kept, on)
            await asyncio.sleep(args.settle)
            meter.start()
            await asyncio.sleep(args.window)
            got = meter.stop()
            connected = sum(1 for a in sim.agents.values() if a.connected)
            got |= {"mounts": on, "pair": pair, "agents_connected": connected}
            windows.append(got)
            print(
                f"  pair {pair + 1} mounts {'on ' if on else 'off'}: head {got['head_cores']:.3f} cores,"
                f" simulator {got['bench_cores']:.3f}, others {got['other_cores']:.3f}"
                f" ({connected} agents connected)",
                flush=True,
            )
            if task.done():
                task.result()
                raise BenchError("the simulator stopped")
    set_storage(sim, kept, True)
    await asyncio.sleep(args.settle)
    views = await fleet_view_calls(server.url, args.views)
    with_cores = [w["head_cores"] for w in windows if w["mounts"]]
    without_cores = [w["head_cores"] for w in windows if not w["mounts"]]
    diffs = [
        statistics.fmean(w["head_cores"] for w in windows if w["pair"] == p and w["mounts"])
        - statistics.fmean(w["head_cores"] for w in windows if w["pair"] == p and not w["mounts"])
        for p in range(args.pairs)
    ]
    extra = statistics.fmean(with_cores) - statistics.fmean(without_cores)
    per_interval = extra * args.metrics_interval
    return {
        "nodes": args.nodes,
        "metrics_interval_s": args.metrics_interval,
        "mount": SHARED_MOUNT,
        "time_to_healthy_s": up_s,
        "window_s": args.window,
        "settle_s": args.settle,
        "windows": windows,
        "head_cores_off": statistics.fmean(without_cores),
        "head_cores_on": statistics.fmean(with_cores),
        "head_extra_cores": extra,
        "head_extra_cores_by_pair": diffs,
        "head_extra_cpu_s_per_interval": per_interval,
        "head_extra_cpu_ms_per_node_sample": per_interval / args.nodes * 1000,
        "sim_cores_off": statistics.fmean(w["bench_cores"] for w in windows if not w["mounts"]),
        "sim_cores_on": statistics.fmean(w["bench_cores"] for w in windows if w["mounts"]),
        "fleet_view_api": views,
    }


async def fleet_view_calls(url: str, calls: int) -> dict[str, Any]:
    """GET /api/v1/storage `calls` times in a row with curl, a process of its own: this process's event loop
    runs the 1,000 agents and would add its own lag to any timing taken here."""
    walls, starts = [], []
    size = 0
    body = b""
    for _ in range(calls):
        proc = await asyncio.create_subprocess_exec(
            "curl", "-sS", "--max-time", "120", "-H", f"Authorization: Bearer {liveness.BOOTSTRAP_TOKEN}",
            "-w", "\n%{http_code} %{time_starttransfer} %{time_total} %{size_download}", f"{url}/api/v1/storage",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await proc.communicate()
        body, _, tail = out.rpartition(b"\n")
        status, first_byte, total, size_text = tail.decode().split()
        if proc.returncode != 0 or status != "200":
            raise BenchError(f"GET /api/v1/storage: curl {proc.returncode}, HTTP {status}: {err.decode()[-300:]}")
        starts.append(float(first_byte))
        walls.append(float(total))
        size = int(float(size_text))
    systems = json.loads(body)
    verdict = systems[0]["verdict"] if systems else "(none)"
    print(f"GET /api/v1/storage: median {statistics.median(walls) * 1000:.0f} ms, verdict {verdict!r}", flush=True)
    return {
        "calls": calls,
        "wall_ms_median": statistics.median(walls) * 1000,
        "wall_ms_max": max(walls) * 1000,
        "first_byte_ms_median": statistics.median(starts) * 1000,
        "bytes": size,
        "verdict": verdict,
    }


@dataclass
class LocalHead:
    """The head's metrics path in this process, on a migrated SQLite file of its own: the channel's parse,
    MonitoringLoops.ingest (tracker), flush_metrics_once (one executemany) and health_once (the judge,
    thresholds, anomaly watch and StorageWatch), as a head's channel and loops run them."""

    label: str
    sessions: Any
    clock: FakeClock
    loops: MonitoringLoops
    ids: dict[str, int]
    cpu: dict[str, list[float]] = field(default_factory=dict)

    @classmethod
    def build(cls, label: str, path: Path, names: list[str], interval_s: float) -> LocalHead:
        engine = make_engine(f"sqlite:///{path}")
        upgrade(engine)
        sessions = make_session_factory(engine)
        clock = FakeClock(0.0)
        with transaction(sessions) as session:
            ids = {n.name: n.id for n in inventory.add_nodes(session, clock, names, NodeSettings())}
        judge = HealthJudge(
            tracker=HealthTracker(),
            workload=BuiltinWorkloadManager(clock),
            metrics_interval_s=interval_s,
            storage=StorageWatch(),
        )
        loops = MonitoringLoops(sessions=sessions, clock=clock, judge=judge, is_leader=lambda: True)
        return cls(label, sessions, clock, loops, ids)

    def interval(self, texts: dict[str, str], now: float, measured: bool) -> None:
        self.clock.advance(now - self.clock.now())
        t0 = time.process_time()
        messages = [(self.ids[name], agent_message_adapter.validate_json(without_nul(t))) for name, t in texts.items()]
        t1 = time.process_time()
        for node_id, message in messages:
            assert isinstance(message, Metrics)
            self.loops.ingest(node_id, message.samples)
        t2 = time.process_time()
        self.loops.flush_metrics_once()
        t3 = time.process_time()
        self.loops.health_once()
        t4 = time.process_time()
        if measured:
            for stage, spent in (("parse", t1 - t0), ("ingest", t2 - t1), ("flush", t3 - t2), ("health", t4 - t3)):
                self.cpu.setdefault(stage, []).append(spent)

    def rollup(self, until: float, repeat: int = 0) -> float:
        """Roll the minute before `until` up (store.rollup: read, aggregate, write); with `repeat`, first
        time its read and aggregation alone (store.rollup_rows, repeatable) that many times and return the
        best of those, a steadier figure than one whole roll-up."""
        best = float("inf")
        for _ in range(repeat):
            t0 = time.process_time()
            with transaction(self.sessions, readonly=True) as session:
                store.rollup_rows(session, until)
            best = min(best, time.process_time() - t0)
        t0 = time.process_time()
        with transaction(self.sessions) as session:
            store.rollup(session, until)
        return best if repeat else time.process_time() - t0

    def fleet_view(self) -> tuple[float, int, str]:
        """What GET /api/v1/storage does: the view of every node, as the route's models, encoded."""
        t0 = time.process_time()
        with transaction(self.sessions, readonly=True) as session:
            judge = self.loops.judge
            systems = [FileSystemOut.of(fs) for fs in fleet_of_replica(session, judge.tracker, judge.storage)]
        body = FLEET_VIEW.dump_json(systems)
        return time.process_time() - t0, len(body), systems[0].verdict if systems else ""


FLEET_VIEW: TypeAdapter[list[FileSystemOut]] = TypeAdapter(list[FileSystemOut])


def head_path_in_process(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Two LocalHeads fed the same real samples of `--nodes` simulated nodes (each node's own sampler,
    its StorageCollector included, collected again for every interval), one with the fs entity and its
    MountInfo, one with them taken out; intervals alternate which head goes first. After `--warm`
    uncounted intervals, a minute's worth are measured, then that minute is rolled up, then the fleet view
    is built."""
    names = node_names(args.nodes)
    sim = Simulation(
        SimOptions(
            server="http://127.0.0.1:9",  # never contacted: only the agents' samplers are used
            join_token=None,
            nodes=args.nodes,
            state_dir=workdir / "sim-local",
            metrics_interval_s=args.metrics_interval,
            shared_mounts=[SHARED_MOUNT],
        )
    )
    sim.build()
    samplers = {name: sim.agents[name].options.metrics for name in names}
    with_fs = LocalHead.build("with", workdir / "local-with.db", names, args.metrics_interval)
    without = LocalHead.build("without", workdir / "local-without.db", names, args.metrics_interval)
    gc_tuning.tune_for_long_running()  # as the head does at start-up
    measured = max(1, round(ROLLUP_BUCKET_S / args.metrics_interval))
    base = (time.time() // ROLLUP_BUCKET_S - 60) * ROLLUP_BUCKET_S  # an hour ago, on a bucket's start
    sizes: dict[str, int] = {}
    fs_values = 0
    collect_s = 0.0
    for k in range(args.warm + measured):
        ts = base + (k - args.warm) * args.metrics_interval
        texts_with: dict[str, str] = {}
        texts_without: dict[str, str] = {}
        t0 = time.process_time()
        for name, sampler in samplers.items():
            assert sampler is not None
            sample = sampler.collect()[0].model_copy(update={"ts": ts})
            plain = sample.model_copy(
                update={"entities": [e for e in sample.entities if not e.entity.startswith("fs:")], "mounts": []}
            )
            texts_with[name] = Metrics(samples=[sample]).model_dump_json()
            texts_without[name] = Metrics(samples=[plain]).model_dump_json()
            fs_values = sum(len(e.values) for e in sample.entities if e.entity.startswith("fs:"))
        collect_s += time.process_time() - t0
        sizes = {"with": len(texts_with[names[0]]), "without": len(texts_without[names[0]])}
        order = [(with_fs, texts_with), (without, texts_without)]
        for head, texts in order if k % 2 == 0 else order[::-1]:
            head.interval(texts, ts + 0.5, measured=k >= args.warm)
        if k == args.warm - 1:  # the warm-up minute rolled up, uncounted
            with_fs.rollup(base)
            without.rollup(base)
    until = base + ROLLUP_BUCKET_S
    rollup = {"with": with_fs.rollup(until, repeat=3), "without": without.rollup(until, repeat=3)}
    views = [with_fs.fleet_view() for _ in range(3)]
    with contextlib.suppress(Exception):
        asyncio.run(sim.close())
    stages = {head.label: {stage: statistics.fmean(v) for stage, v in head.cpu.items()} for head in (with_fs, without)}
    per_interval = {label: sum(v.values()) for label, v in stages.items()}
    extra_interval = per_interval["with"] - per_interval["without"]
    extra_rollup = rollup["with"] - rollup["without"]
    return {
        "nodes": args.nodes,
        "metrics_interval_s": args.metrics_interval,
        "intervals_measured": measured,
        "fs_values_per_sample": fs_values,
        "message_bytes": sizes,
        "cpu_s_per_interval_by_stage": stages,
        "cpu_s_per_interval": per_interval,
        "extra_cpu_s_per_interval": extra_interval,
        "rollup_cpu_s_per_minute": rollup,
        "extra_rollup_cpu_s_per_minute": extra_rollup,
        "extra_cores": extra_interval / args.metrics_interval + extra_rollup / ROLLUP_BUCKET_S,
        "fleet_view_cpu_ms": statistics.median(v[0] for v in views) * 1000,
        "fleet_view_bytes": views[0][1],
        "fleet_view_verdict": views[0][2],
        "agents_collect_cpu_s_per_interval": collect_s / (args.warm + measured),
    }


# -- report ------------------------------------------------------------------------------------------
def report(fig: dict[str, Any]) -> str:
    m = fig["machine"]
    lines = [
        "gpufleet network and storage polling cost",
        f"  machine            {m['platform']}, {m['cpu_count']} CPUs, Python {m['python']}, load {m['load_avg_1m']}",
    ]
    sw = fig.get("switches")
    if sw:
        local = sw["in_process"]
        names = ", ".join(f"{s['name']} {s['ports']}" for s in sw["switches"])
        lines += [
            f"  switches           {len(sw['switches'])} switches, {sw['ports_total']} ports ({names})",
            f"    in process       a steady round {local['steady_cpu_s']:.3f} CPU s:"
            f" SNMP {local['steady_snmp_cpu_s']:.3f} s, record_poll + alerts"
            f" {local['steady_cpu_s'] - local['steady_snmp_cpu_s']:.3f} s; {local['steady_wall_s']:.2f} s wall;"
            f" first round {local['first_cpu_s']:.3f} s",
            f"    head idle        {sw['idle']['head_cores']:.4f} cores over {sw['idle']['wall_s']:.0f} s",
            f"    head polling     {sw['head_cores_raw']:.4f} cores over {sw['rounds']} rounds"
            f" ({sw['window']['wall_s']:.0f} s at {sw['interval_s']:g} s)",
            f"    per round        {sw['head_cpu_s_per_round']:.3f} CPU s (idle subtracted) ="
            f" {sw['head_cores_at_interval']:.4f} cores at {sw['interval_s']:g} s;"
            f" snmpsim answering: {sw['snmpsim_cpu_s_per_round']:.3f} CPU s a round",
            f"    poll errors      {len(sw['errors'])} {sw['errors'][:2] if sw['errors'] else ''}",
        ]
    mo = fig.get("mounts")
    if mo:
        api = mo["fleet_view_api"]
        lines += [
            f"  mounts             {mo['nodes']} nodes, one NFS mount each ({mo['mount']}), metrics every"
            f" {mo['metrics_interval_s']:g} s; healthy after {mo['time_to_healthy_s']:.0f} s",
            f"    head             off {mo['head_cores_off']:.3f} cores, on {mo['head_cores_on']:.3f} cores:"
            f" +{mo['head_extra_cores']:.3f} cores (by pair:"
            f" {', '.join(f'{d:+.3f}' for d in mo['head_extra_cores_by_pair'])})",
            f"    per interval     {mo['head_extra_cpu_s_per_interval']:.3f} CPU s per {mo['metrics_interval_s']:g} s"
            f" = {mo['head_extra_cpu_ms_per_node_sample']:.3f} ms per node sample",
            f"    simulator        off {mo['sim_cores_off']:.3f} cores, on {mo['sim_cores_on']:.3f} cores",
            f"    others           {statistics.fmean(w['other_cores'] for w in mo['windows']):.3f} cores on average"
            " (other work on this machine)",
            f"    fleet view API   GET /api/v1/storage (curl): median {api['wall_ms_median']:.0f} ms (first byte"
            f" {api['first_byte_ms_median']:.0f} ms), max {api['wall_ms_max']:.0f} ms, {api['bytes'] / 1024:.0f} KiB",
        ]
    local = fig.get("head_path")
    if local:
        st = local["cpu_s_per_interval_by_stage"]
        stages = ", ".join(
            f"{k} {st['without'][k] * 1000:.0f}->{st['with'][k] * 1000:.0f}"
            for k in ("parse", "ingest", "flush", "health")
        )
        lines += [
            f"  head path, in process  {local['nodes']} nodes, {local['fs_values_per_sample']} fs values a sample"
            f" (message {local['message_bytes']['without']} -> {local['message_bytes']['with']} bytes),"
            f" {local['intervals_measured']} intervals",
            f"    per interval     without {local['cpu_s_per_interval']['without'] * 1000:.0f} ms, with"
            f" {local['cpu_s_per_interval']['with'] * 1000:.0f} ms CPU: +{local['extra_cpu_s_per_interval'] * 1000:.0f}"
            f" ms (ms, without->with: {stages})",
            f"    roll-up a minute (read + aggregate, best of 3) without"
            f" {local['rollup_cpu_s_per_minute']['without'] * 1000:.0f} ms,"
            f" with {local['rollup_cpu_s_per_minute']['with'] * 1000:.0f} ms",
            f"    extra            {local['extra_cores']:.4f} cores at {local['metrics_interval_s']:g} s",
            f"    fleet view       {local['fleet_view_cpu_ms']:.0f} ms CPU"
            f" ({local['fleet_view_bytes'] / 1024:.0f} KiB): {local['fleet_view_verdict']!r}",
        ]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, default=18767, help="the head's port (127.0.0.1)")
    parser.add_argument("--snmpsim-port", type=int, default=18790, help="snmpsim's port; snmpd's the next")
    parser.add_argument("--switches", nargs="+", default=list(SWITCHES), help="recordings, one switch each")
    parser.add_argument("--interval", type=float, default=None, help="switch poll interval (default: the head's)")
    parser.add_argument("--rounds", type=int, default=4, help="poll rounds measured on the head")
    parser.add_argument("--probe-rounds", type=int, default=4, help="rounds of the in-process breakdown")
    parser.add_argument("--idle", type=float, default=30.0, help="seconds of the head's idle baseline")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--metrics-interval", type=float, default=5.0, help="the agents' metrics interval, s")
    parser.add_argument("--pairs", type=int, default=2, help="off/on window pairs (alternating order)")
    parser.add_argument("--window", type=float, default=50.0, help="seconds of each measured window")
    parser.add_argument("--settle", type=float, default=15.0, help="seconds after each switch before measuring")
    parser.add_argument("--views", type=int, default=5, help="GET /api/v1/storage calls timed")
    parser.add_argument("--warm", type=int, default=3, help="uncounted intervals of the in-process head path")
    parser.add_argument("--part", choices=("switches", "mounts", "local", "both"), default="both")
    parser.add_argument("--json", type=Path, default=None, help="also write every figure to this file")
    return parser.parse_args(argv)


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    fig: dict[str, Any] = {
        "machine": {
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
            "load_avg_1m": round(os.getloadavg()[0], 2),
        },
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    if args.part in ("switches", "both"):
        fig["switches"] = switches_part(args, workdir)
        save(args, fig)  # a failure in the mounts part keeps these
    if args.part in ("mounts", "both"):
        fig["mounts"] = asyncio.run(mounts_part(args, workdir))
        save(args, fig)
    if args.part in ("local", "mounts", "both"):
        print("the head's metrics path in this process, with and without the fs entity", flush=True)
        fig["head_path"] = head_path_in_process(args, workdir)
    fig["machine"]["load_avg_1m_at_end"] = round(os.getloadavg()[0], 2)
    return fig


def save(args: argparse.Namespace, fig: dict[str, Any]) -> None:
    print(report(fig), flush=True)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(fig, indent=2) + "\n")
        print(f"figures written to {args.json}", flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpufleet-bench-") as tmp:
        try:
            fig = run(args, Path(tmp))
        except (BenchError, GpufleetError, httpx.HTTPError) as exc:
            print(f"benchmark failed: {exc}", file=sys.stderr)
            for log in Path(tmp).glob("head-*/server.log"):
                print(f"{log}:\n{log.read_text(errors='replace')[-2000:]}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130
    fig["took_s"] = round(time.monotonic() - started, 1)
    save(args, fig)
    return 0


if __name__ == "__main__":
    sys.exit(main())
