"""What the dashboard's pages cost the head at 1,000 nodes x 8 GPUs, in server time.

Builds, in this process, a migrated SQLite database in a fresh temp dir (WAL, like production) holding
a fleet as a head sees it after an hour: `--nodes` nodes that joined with a simulated 8-GPU H200
inventory (the simulator's own NVML and host, `gpufleet.sim`), the last `--history` seconds of metric
samples every 5 s per node (the entity and metric set of a real simulator sample: 8 GPUs x 29 metrics,
the host, a disk, a NIC, 4 InfiniBand ports, made by the agent's real collectors over `SimulatedNvml`),
an hour of raw samples for the first node (its charts), an hour of one-minute node roll-ups
(`store.rollup_rows` for what the samples cover, the rest shaped the same) and the fleet roll-ups
computed from them (`store.fleet_rollup_rows`), a few down, failed, degraded and drained nodes with
health reasons, and about 50 firing alerts.

Then, with the real app (`create_app`, no background loops, a fixed clock at the newest sample) and a
logged-in browser (a web user, session cookie), it GETs each dashboard URL `--requests` times and
reports per URL the server time (from the ASGI call to the last byte sent: routing, the session check,
the database, the template) as p50/p95/max, the part spent in the page's read transaction (data) and in
the template, the client's wall time and the response size.

    .venv/bin/python bench/dashboard.py --json bench/results/dashboard.json
    .venv/bin/python bench/dashboard.py --profile          # + cProfile of one overview request

Goal (the dashboard issue): the overview and the node table render in under 300 ms of server time at
1,000 nodes x 8 GPUs (p95 here). Exit status 0 when met, 1 when not, 2 when the benchmark could not run.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import functools
import gc
import inspect
import io
import json
import math
import os
import platform
import pstats
import random
import re
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import psutil
from fastapi import FastAPI
from sqlalchemy import insert, select
from sqlalchemy.orm import Session, sessionmaker
from starlette.types import Receive, Scope, Send

from gpufleet.agent.gpu.nvml import NvmlReader
from gpufleet.agent.inventory import inventory_source
from gpufleet.agent.metrics.gpu import GpuCollector
from gpufleet.agent.metrics.infiniband import IbCollector
from gpufleet.agent.metrics.sampler import Sampler
from gpufleet.agent.metrics.xid import XidBook
from gpufleet.api import deps
from gpufleet.api.app import create_app
from gpufleet.api.dashboard import gpu_usage, pages
from gpufleet.api.dashboard import overview as overview_page
from gpufleet.api.templates import TEMPLATES
from gpufleet.auth import service as auth
from gpufleet.core import gc_tuning
from gpufleet.core.clock import FakeClock, to_datetime
from gpufleet.core.config import load_settings
from gpufleet.core.db import make_engine, make_session_factory, transaction
from gpufleet.inventory import service as inventory
from gpufleet.inventory.models import Node
from gpufleet.inventory.schemas import NodeSettings
from gpufleet.inventory.states import NodeState
from gpufleet.migrations import upgrade
from gpufleet.monitoring import alerts, store
from gpufleet.monitoring import fleet as fleet_metrics
from gpufleet.monitoring.models import MetricRollup
from gpufleet.protocol.metrics import EntityValues, Sample
from gpufleet.sim.host import simulated_host
from gpufleet.sim.host_metrics import SimulatedHostMetrics
from gpufleet.sim.infiniband import SimulatedInfiniband
from gpufleet.sim.nvml import SimulatedNvml

if TYPE_CHECKING:
    from fastapi.testclient import TestClient

GOAL_MS = 300.0
GOAL_PAGES = ("overview", "nodes")  # what the goal is about
ADMIN_TOKEN = "gfa_bench_dashboard_0123456789abcdef"  # noqa: S105 - a throwaway database
PASSWORD = "correct horse battery staple"  # noqa: S105 - a throwaway user in a throwaway database
INTERVAL_S = 5.0
# GPU gauges that follow the load; everything else in a sample is kept as the simulator reported it.
LOAD_GAUGES = ("gpu_util", "mem_copy_util", "power_w", "gpu_temp_c", "mem_temp_c", "fb_used_mib", "fb_free_mib")
FB_TOTAL_MIB = 143_771.0


class BenchError(Exception):
    """The benchmark could not run."""


@dataclass
class Url:
    key: str
    path: str
    htmx: bool = False  # sent with HX-Request: true (the live part alone)
    goal: bool = False  # counted against GOAL_MS
    route: str | None = None  # the route it needs; skipped with a note when the app lacks it


@dataclass
class Result:
    key: str
    path: str
    htmx: bool
    status: int
    bytes: int
    server_ms: dict[str, float]
    data_ms: dict[str, float] | None
    template_ms: dict[str, float] | None
    client_ms: dict[str, float]
    cpu_ms: dict[str, float]  # this process's CPU time per request (server and client): robust to other load
    gc_ms: dict[str, float]  # the garbage collector's pauses during a request
    gc_full: int  # full (oldest generation) collections during the timed requests
    goal_ms: float | None = None
    met: bool | None = None


@dataclass
class Fleet:
    """What was put in the database, for the report."""

    nodes: int
    gpus: int
    up: int
    down: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    degraded: list[str] = field(default_factory=list)
    drained: list[str] = field(default_factory=list)
    firing_alerts: int = 0
    resolved_alerts: int = 0
    sample_rows: int = 0
    rollup_rows: int = 0
    fleet_rollup_rows: int = 0
    sample_bytes: int = 0  # one sample row's JSON
    db_bytes: int = 0
    build_s: float = 0.0


# -- small helpers --------------------------------------------------------------------------------
def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100), like numpy's default."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summary(values: list[float]) -> dict[str, float]:
    return {
        "p50": round(percentile(values, 50), 2),
        "p95": round(percentile(values, 95), 2),
        "max": round(max(values), 2),
    }


def node_names(count: int) -> list[str]:
    width = max(4, len(str(count)))
    return [f"gpu{i:0{width}d}" for i in range(1, count + 1)]


def fleet_load(ts: float) -> float:
    """How busy the fleet is at `ts`, 0.6-1.0: a slow swell, so the fleet charts have a shape."""
    return 0.8 + 0.2 * math.sin(2 * math.pi * ts / 2400.0)


# -- the fleet's metrics ----------------------------------------------------------------------------
@dataclass
class NodeMetrics:
    """One node's metrics: a real sample from the simulator's collectors, and each GPU's share of load."""

    template: dict[str, dict[str, float]]  # {entity: {metric: value}}
    loads: list[float]  # per GPU, 0 (idle) to 1 (full matmul)

    def gauges(self, index: int, at: float, rng: random.Random) -> dict[str, float]:
        """The load-following GPU gauges of GPU `index` at `at` (the rest of a sample stays as sampled)."""
        load = self.loads[index] * fleet_load(at)
        used = 615.0 + load * 120_000.0
        if load == 0.0:
            return {"gpu_util": 0.0, "mem_copy_util": 0.0, "power_w": 79.6, "gpu_temp_c": 40.0, "mem_temp_c": 38.0}
        return {
            "gpu_util": round(min(100.0, 100 * load + rng.uniform(-1.0, 1.0)), 1),
            "mem_copy_util": round(25 * load),
            "power_w": round(80 + 612 * load + rng.uniform(-3.0, 3.0), 3),
            "gpu_temp_c": round(40 + 25 * load + rng.uniform(-0.5, 0.5)),
            "mem_temp_c": round(38 + 30 * load + rng.uniform(-0.5, 0.5)),
            "fb_used_mib": round(used),
            "fb_free_mib": round(FB_TOTAL_MIB - 2 * 1024 - used),
        }

    def sample(self, at: float, rng: random.Random) -> Sample:
        """The sample at `at`, as the agent would send it (built unvalidated: the values came from the
        agent's own Sampler, which validated them)."""
        values = {entity: dict(metrics) for entity, metrics in self.template.items()}
        for index in range(len(self.loads)):
            values[f"gpu:{index}"].update(self.gauges(index, at, rng))
        entities = [EntityValues.model_construct(entity=e, values=v) for e, v in values.items()]
        return Sample.model_construct(ts=at, entities=entities)

    def rollup(self, bucket: float, rng: random.Random) -> dict[str, dict[str, list[float]]]:
        """A one-minute roll-up ([min, max, sum, count] per metric) shaped like `store.rollup_rows`'."""
        count = 60.0 / INTERVAL_S
        stats = {e: {m: [v, v, v * count, count] for m, v in metrics.items()} for e, metrics in self.template.items()}
        for index in range(len(self.loads)):
            for metric, value in self.gauges(index, bucket + 30.0, rng).items():
                spread = abs(value) * 0.02
                stats[f"gpu:{index}"][metric] = [value - spread, value + spread, value * count, count]
        return stats


def simulated_node(name: str, gpus: int, rng: random.Random) -> tuple[Any, NodeMetrics]:
    """The node's inventory and a real sample, both read through the simulator's NVML by the agent's code."""
    nvml = SimulatedNvml(name, gpu_count=gpus, gpu_model="H200")
    loads = [0.0 if rng.random() < 0.2 else rng.uniform(0.55, 1.0) for _ in range(gpus)]
    for index, load in enumerate(loads):
        nvml.set_load(index, load)
    read = inventory_source(functools.partial(simulated_host, name, gpus), [NvmlReader(nvml, source="simulated")])
    sampler = Sampler(
        [GpuCollector(nvml, xids=XidBook()), SimulatedHostMetrics(name, nvml), IbCollector(SimulatedInfiniband(4))]
    )
    sample, _events = sampler.collect()
    template = {e.entity: dict(e.values) for e in sample.entities}
    return read(), NodeMetrics(template, loads)


@contextlib.contextmanager
def step(what: str) -> Iterator[None]:
    print(f"  {what}...", end="", flush=True)
    started = time.perf_counter()
    yield
    print(f" {time.perf_counter() - started:.1f} s")


# -- building the database --------------------------------------------------------------------------
@dataclass
class Builder:
    """Fills the database with `args`' fleet as it stands at `clock`'s time."""

    sessions: sessionmaker[Session]
    clock: FakeClock
    args: argparse.Namespace
    rng: random.Random = field(init=False)
    names: list[str] = field(init=False)
    ids: dict[str, int] = field(default_factory=dict)
    metrics: dict[str, NodeMetrics] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.args.seed)
        self.names = node_names(self.args.nodes)

    def build(self) -> Fleet:
        started = time.perf_counter()
        args = self.args
        fleet = Fleet(nodes=args.nodes, gpus=args.nodes * args.gpus_per_node, up=args.nodes - args.down)
        # Never the first node: its page is the one timed, and it should look like most nodes.
        picked = self.rng.sample(self.names[1:], args.down + args.failed + args.degraded + 1)
        fleet.down = sorted(picked[: args.down])
        fleet.failed = sorted(picked[args.down : args.down + args.failed])
        fleet.degraded = sorted(picked[args.down + args.failed : -1])
        with step(f"{args.nodes} nodes x {args.gpus_per_node} GPUs, simulated H200 inventories"):
            self.add_nodes()
        with step("down, failed, degraded and drained nodes, alerts"), transaction(self.sessions) as session:
            self.break_nodes(session, fleet, picked[-1])
            self.add_alerts(session, [n for n in self.names if n not in set(picked)], fleet)
        with step(f"{args.history:.0f} s of samples every {INTERVAL_S:.0f} s per node, an hour for {self.names[0]}"):
            fleet.sample_rows, fleet.sample_bytes = self.write_samples(set(fleet.down))
        with step(f"{args.rollup_minutes} minutes of node roll-ups, and the fleet's from them"):
            fleet.rollup_rows, fleet.fleet_rollup_rows = self.write_rollups(set(fleet.down))
        fleet.build_s = round(time.perf_counter() - started, 1)
        return fleet

    def node(self, session: Session, name: str) -> Node:
        found = session.get(Node, self.ids[name])
        if found is None:
            raise BenchError(f"node {name} vanished")
        return found

    def add_nodes(self) -> None:
        """Every node, joined three hours ago with its simulated inventory, up, healthy, just heard from."""
        now, rng = self.clock.now(), self.rng
        joined = to_datetime(now - 3 * 3600)
        with transaction(self.sessions) as session:
            for start in range(0, len(self.names), 250):
                batch = self.names[start : start + 250]
                for node in inventory.add_nodes(session, self.clock, batch, NodeSettings(category="hgx-h200")):
                    node.labels = {"rack": f"r{len(self.ids) // 32 + 1:02d}"}
                    info, self.metrics[node.name] = simulated_node(node.name, self.args.gpus_per_node, rng)
                    inventory.apply_inventory(session, self.clock, node, info)
                    inventory.transition(session, self.clock, node.id, NodeState.NEW, NodeState.UP, "joined")
                    self.ids[node.name] = node.id
            session.flush()
            for node in session.scalars(select(Node)):
                node.state_since, node.health, node.health_since = joined, "healthy", joined
                node.heartbeat_interval_s = 1.0
                node.last_seen = to_datetime(now - rng.uniform(0.0, 1.0))

    def break_nodes(self, session: Session, fleet: Fleet, person_drained: str) -> None:
        """Down, failed (and drained by gpufleet), degraded nodes with their alerts; one drained by a person."""
        now, rng, gpus = self.clock.now(), self.rng, self.args.gpus_per_node
        for name in fleet.down:
            went = FakeClock(now - 90.0)
            inventory.transition(session, went, self.ids[name], NodeState.UP, NodeState.DOWN, "no heartbeat for 2.6s")
            self.node(session, name).last_seen = to_datetime(now - 92.6)
            alerts.fire(session, went, "NodeDown", self.ids[name], name, "no heartbeat for 2.6s")
        for name in fleet.failed:
            node, gpu = self.node(session, name), rng.randrange(gpus)
            reasons = [f"GPU {gpu}: Xid 79 (GPU has fallen off the bus)", f"GPU {gpu}: missing from the inventory"]
            node.health, node.health_reasons, node.health_since = "failed", reasons, to_datetime(now - 600)
            node.drained_at, node.drained_by = to_datetime(now - 600), "gpufleet"
            node.drain_reason = f"gpufleet: health failed: {reasons[0]}"
            fleet.drained.append(name)
            alerts.fire(session, FakeClock(now - 600), "NodeFailed", node.id, name, "; ".join(reasons))
        for name in fleet.degraded:
            node, gpu = self.node(session, name), rng.randrange(gpus)
            reasons = [f"GPU {gpu}: thermal throttling for 6 samples", f"GPU {gpu}: 91 C"]
            node.health, node.health_reasons, node.health_since = "degraded", reasons, to_datetime(now - 300)
            alerts.fire(session, FakeClock(now - 300), "NodeDegraded", node.id, name, "; ".join(reasons))
        node = self.node(session, person_drained)
        node.drained_at, node.drained_by, node.drain_reason = to_datetime(now - 1800), "alice", "BIOS update"
        fleet.drained.append(person_drained)

    def add_alerts(self, session: Session, healthy: list[str], fleet: Fleet) -> None:
        """Threshold-rule alerts on single GPUs until `--alerts` fire in all, and an hour of resolved ones."""
        now, rng, gpus = self.clock.now(), self.rng, self.args.gpus_per_node
        built_in = len(fleet.down) + len(fleet.failed) + len(fleet.degraded)
        for name in rng.sample(healthy, max(0, self.args.alerts - built_in)):
            gpu = rng.randrange(gpus)
            summary = f"gpu_temp_c > 85 for 5m (86.0 on GPU {gpu})"
            at = FakeClock(now - rng.uniform(60, 3000))
            alerts.fire(
                session, at, "GpuHot", self.ids[name], name, summary, gpu, severity="warning", entity=f"gpu:{gpu}"
            )
        for name in rng.sample(healthy, self.args.resolved_alerts):
            gpu, fired = rng.randrange(gpus), now - rng.uniform(600, 3600)
            summary, entity = "gpu_util < 5 for 10m", f"gpu:{gpu}"
            if alerts.fire(
                session, FakeClock(fired), "GpuIdle", self.ids[name], name, summary, gpu, severity="info", entity=entity
            ):
                alerts.resolve(session, FakeClock(fired + 300), "GpuIdle", name, gpu, entity)
        fleet.firing_alerts = max(self.args.alerts, built_in)
        fleet.resolved_alerts = self.args.resolved_alerts

    def write_samples(self, gone: set[str]) -> tuple[int, int]:
        """`--history` seconds of samples per node (an hour for the first), every 5 s, each node on its
        own phase; the down nodes' stop 90 s ago. Returns (rows, bytes of one row's JSON)."""
        newest, written, size = self.clock.now() - 1.0, 0, 0
        for start in range(0, len(self.names), 100):
            rows: list[dict[str, Any]] = []
            for name in self.names[start : start + 100]:
                history = 3600.0 if name == self.names[0] else self.args.history
                last = newest - self.rng.uniform(0.0, INTERVAL_S) - (90.0 if name in gone else 0.0)
                samples = [
                    self.metrics[name].sample(last - k * INTERVAL_S, self.rng) for k in range(int(history / INTERVAL_S))
                ]
                rows += store.sample_rows(self.ids[name], samples)  # the head's own row format
            written, size = written + len(rows), len(rows[0]["values"])
            with transaction(self.sessions) as session:
                store.write_rows(session, rows)
        return written, size

    def write_rollups(self, gone: set[str]) -> tuple[int, int]:
        """`store.rollup_rows` for the minutes the samples cover; the older minutes of the hour made
        in the same shape; the fleet roll-ups from all of them (`store.fleet_rollup_rows`, the leader's
        code). Returns (node roll-ups, fleet roll-ups)."""
        now = self.clock.now()
        with transaction(self.sessions, readonly=True) as session:
            rows = store.rollup_rows(session, now)
        oldest = math.floor(now / 60) * 60 - self.args.rollup_minutes * 60
        first_real: dict[int, float] = {}
        for row in rows:
            first_real[row["node_id"]] = min(row["bucket"], first_real.get(row["node_id"], math.inf))
        for name in self.names:
            node_id = self.ids[name]
            until = first_real.get(node_id, math.floor((now - (120 if name in gone else 0)) / 60) * 60)
            for k in range(max(0, int((until - oldest) / 60))):
                rolled = self.metrics[name].rollup(oldest + k * 60, self.rng)
                rows.append(
                    {"node_id": node_id, "bucket": oldest + k * 60, "values": json.dumps(rolled, separators=(",", ":"))}
                )
        rows.sort(key=lambda r: r["bucket"])
        fleet_rows = store.fleet_rollup_rows(rows)
        for start in range(0, len(rows), 5000):
            with transaction(self.sessions) as session:
                session.execute(insert(MetricRollup), rows[start : start + 5000])
        with transaction(self.sessions) as session:
            store.write_fleet_rollups(session, fleet_rows)
        return len(rows), len(fleet_rows)


# -- timing ----------------------------------------------------------------------------------------
class Timed:
    """The app, timed: seconds from the ASGI call to the response's last byte, per request."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self.last = 0.0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        try:
            await self.app(scope, receive, send)
        finally:
            self.last = time.perf_counter() - started


@dataclass
class Phases:
    """Per request: seconds in the page's read transaction (its data) and in the template, and the
    garbage collector's pauses (any thread: a collection stops them all)."""

    data: float = 0.0
    template: float = 0.0
    gc: float = 0.0
    gc_full: int = 0  # collections of the oldest generation
    _gc_started: float = 0.0

    def on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
            return
        self.gc += time.perf_counter() - self._gc_started
        self.gc_full += info["generation"] == 2

    def reset(self) -> None:
        self.data = self.template = self.gc = 0.0
        self.gc_full = 0


@contextlib.contextmanager
def phase_timers() -> Iterator[Phases]:
    """Time `pages.render`'s two parts: the `tx` block around the page's data function, and the
    template (Starlette renders it when the response is made)."""
    phases = Phases()
    real_tx = deps.tx
    real_response = TEMPLATES.TemplateResponse

    @contextlib.contextmanager
    def timed_tx(*a: Any, **kw: Any) -> Iterator[Session]:
        started = time.perf_counter()
        try:
            with real_tx(*a, **kw) as session:
                yield session
        finally:
            phases.data += time.perf_counter() - started

    def timed_response(*a: Any, **kw: Any) -> Any:
        started = time.perf_counter()
        try:
            return real_response(*a, **kw)
        finally:
            phases.template += time.perf_counter() - started

    vars(pages)["tx"] = timed_tx
    vars(TEMPLATES)["TemplateResponse"] = timed_response  # an instance attribute, over the class's method
    gc.callbacks.append(phases.on_gc)
    try:
        yield phases
    finally:
        gc.callbacks.remove(phases.on_gc)
        vars(pages)["tx"] = real_tx
        del vars(TEMPLATES)["TemplateResponse"]


def log_in(browser: TestClient, admin_token: str, role: str) -> None:
    """Create a `role` web user with the admin token, and log `browser` in through the login form."""
    username = f"bench{int(time.time())}"  # a database kept with --db already has earlier runs' users
    made = browser.post(
        "/api/v1/users",
        json={"username": username, "role": role, "password": PASSWORD},
        headers={"Authorization": f"Bearer {admin_token}"},
    )
    if made.status_code != 201:
        raise BenchError(f"could not create the web user: {made.status_code} {made.text}")
    found = re.search(r'name="csrf" value="([^"]+)"', browser.get("/login").text)
    if found is None:
        raise BenchError("the login form has no CSRF field")
    answer = browser.post("/login", data={"username": username, "password": PASSWORD, "csrf": found.group(1)})
    if answer.status_code != 200 or not browser.cookies:
        raise BenchError(f"login failed: {answer.status_code}")


def served(browser: TestClient, path: str) -> bool:
    """Whether the app serves `path` at all (a route being written may not be wired in yet)."""
    return bool(browser.get(path).status_code != 404)


def measure(browser: TestClient, timed: Timed, url: Url, requests: int, warmup: int) -> Result:
    headers = {"HX-Request": "true"} if url.htmx else {}
    server, client, cpu, data, template, collected = [], [], [], [], [], []
    status, size, full = 0, 0, 0
    with phase_timers() as phases:
        for i in range(warmup + requests):
            phases.reset()
            started, cpu_started = time.perf_counter(), time.process_time()
            response = browser.get(url.path, headers=headers)
            elapsed, cpu_used = time.perf_counter() - started, time.process_time() - cpu_started
            status, size = response.status_code, len(response.content)
            if status != 200:
                raise BenchError(f"GET {url.path} answered {status}: {response.text[:300]}")
            if i >= warmup:
                server.append(timed.last * 1000)
                client.append(elapsed * 1000)
                cpu.append(cpu_used * 1000)
                data.append(phases.data * 1000)
                template.append(phases.template * 1000)
                collected.append(phases.gc * 1000)
                full += phases.gc_full
    is_page = any(data)
    result = Result(
        key=url.key,
        path=url.path,
        htmx=url.htmx,
        status=status,
        bytes=size,
        server_ms=summary(server),
        data_ms=summary(data) if is_page else None,
        template_ms=summary(template) if is_page else None,
        client_ms=summary(client),
        cpu_ms=summary(cpu),
        gc_ms=summary(collected),
        gc_full=full,
    )
    if url.goal:
        result.goal_ms = GOAL_MS
        result.met = result.server_ms["p95"] <= GOAL_MS
    return result


def profile_overview(browser: TestClient, top: int) -> str:
    """cProfile of one overview request, inside the worker thread that runs it (the endpoint is sync:
    Starlette runs it in a thread pool, where a profiler enabled on this thread would see nothing)."""
    profiler = cProfile.Profile()
    real_render = vars(overview_page)["render"]

    def profiled(*a: Any, **kw: Any) -> Any:
        profiler.enable()
        try:
            return real_render(*a, **kw)
        finally:
            profiler.disable()

    vars(overview_page)["render"] = profiled
    try:
        response = browser.get("/")
    finally:
        vars(overview_page)["render"] = real_render
    if response.status_code != 200:
        raise BenchError(f"GET / answered {response.status_code}")
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("cumulative").print_stats(top)
    return out.getvalue()


# -- the report ------------------------------------------------------------------------------------
def busy_seconds() -> tuple[float, float]:
    """(CPU seconds every process on the machine has used, CPU seconds this process has used)."""
    t = psutil.cpu_times()
    machine_s = sum(t) - t.idle - getattr(t, "iowait", 0.0) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)
    own = psutil.Process().cpu_times()
    return float(machine_s), float(own.user + own.system)


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "cpus": os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def print_table(results: list[Result]) -> None:
    header = (
        f"{'URL':<60} {'server p50':>10} {'p95':>8} {'max':>8} {'data p50':>9} {'tmpl p50':>9}"
        f" {'cpu p50':>8} {'gc max':>7} {'bytes':>10}  goal"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        label = r.path + (" (htmx)" if r.htmx else "")
        data = f"{r.data_ms['p50']:.1f}" if r.data_ms else "-"
        tmpl = f"{r.template_ms['p50']:.1f}" if r.template_ms else "-"
        goal = "" if r.met is None else ("met" if r.met else "MISSED")
        print(
            f"{label:<60} {r.server_ms['p50']:>10.1f} {r.server_ms['p95']:>8.1f} {r.server_ms['max']:>8.1f}"
            f" {data:>9} {tmpl:>9} {r.cpu_ms['p50']:>8.1f} {r.gc_ms['max']:>7.1f} {r.bytes:>10,}  {goal}"
        )


@dataclass
class Run:
    fleet: Fleet
    results: list[Result] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    others_cores: float = 0.0  # CPU other processes used while timing
    parts: dict[str, dict[str, float]] = field(default_factory=dict)
    profile: str = ""


def urls_to_time(nodes: int) -> list[Url]:
    first = node_names(nodes)[0]
    return [
        Url("overview", "/", goal=True),
        Url("nodes", "/nodes", goal=True),
        Url("nodes-filtered", f"/nodes?q=gpu[0001-{nodes // 2:04d}]&sort=health"),
        Url("gpu-map", "/gpus"),
        Url("node-detail", f"/nodes/{first}", route="/nodes/{name}"),
        Url("overview-htmx", "/", htmx=True, goal=True),
        Url("nodes-htmx", "/nodes", htmx=True, goal=True),
        Url("fleet-chart", "/api/v1/fleet/metrics?metric=gpu_util&since=1h"),
        Url(
            "node-gpu-chart",
            f"/api/v1/nodes/{first}/gpu-charts?metric=gpu_util&since=1h",
            route="/api/v1/nodes/{name}/gpu-charts",
        ),
    ]


# Where the overview's time goes, without a profiler: every function defined in these modules (all
# of them, whatever they are called as the code changes), and the named ones of the others.
WATCHED: tuple[tuple[ModuleType, tuple[str, ...] | None], ...] = (
    (overview_page, None),
    (pages, ("session_principal",)),
    (gpu_usage, None),
    (fleet_metrics, None),
    (inventory, None),
    (alerts, ("list_alerts",)),
)


def overview_parts(browser: TestClient, rounds: int = 10) -> dict[str, dict[str, float]]:
    """ms per overview request spent in each watched function (inclusive: a caller's time contains its
    callees'), p50 and max over `rounds` requests, and the template's. Functions are wrapped where
    they are looked up (`module.function`), so this times the real request path."""
    spent: dict[str, float] = {}
    originals: list[tuple[dict[str, Any], str, Any]] = []

    def wrap(label: str, function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def timed(*a: Any, **kw: Any) -> Any:
            started = time.perf_counter()
            try:
                return function(*a, **kw)
            finally:
                spent[label] = spent.get(label, 0.0) + time.perf_counter() - started

        return timed

    for module, names in WATCHED:
        namespace = vars(module)
        for name, value in list(namespace.items()):
            own = inspect.isfunction(value) and value.__module__ == module.__name__
            if (names is None and own) or (names is not None and name in names):
                originals.append((namespace, name, value))
                namespace[name] = wrap(f"{module.__name__.removeprefix('gpufleet.')}.{name}", value)
    per_request: dict[str, list[float]] = {}
    try:
        with phase_timers() as phases:
            for _ in range(rounds):
                spent.clear()
                phases.template = 0.0
                if browser.get("/").status_code != 200:
                    raise BenchError("GET / failed while timing its parts")
                spent["template (fragments/overview.html in layout)"] = phases.template
                for label, seconds in spent.items():
                    per_request.setdefault(label, []).append(seconds * 1000)
    finally:
        for namespace, name, value in originals:
            namespace[name] = value
    ranked = sorted(per_request.items(), key=lambda item: -percentile(item[1], 50))
    return {label: summary(values) for label, values in ranked}


def admin_token(sessions: sessionmaker[Session], clock: FakeClock) -> str:
    """The bench's admin token, installed as `gpufleet server` installs GPUFLEET_BOOTSTRAP_TOKEN."""
    with transaction(sessions) as session:
        auth.ensure_admin_token(session, clock, ADMIN_TOKEN)
    return ADMIN_TOKEN


def run(args: argparse.Namespace, workdir: Path) -> Run:
    """Build the database in `workdir`, then time every URL. Raises BenchError."""
    path = args.db or workdir / "gpufleet.db"
    meta = path.with_name(path.name + ".bench.json")  # the fleet built in it, and its clock
    reuse = args.db is not None and path.exists() and meta.exists()
    engine = make_engine(f"sqlite:///{path}")
    try:
        sessions = make_session_factory(engine)
        if reuse:
            built = json.loads(meta.read_text())
            clock, fleet = FakeClock(built["now"]), Fleet(**built["fleet"])
            print(f"reusing {path} (built {built['built']} for {fleet.nodes} nodes)")
        else:
            clock = FakeClock(time.time())
            print(f"building the database in {path}:")
            upgrade(engine)
            fleet = Builder(sessions, clock, args).build()
            fleet.db_bytes = sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))
            if args.db is not None:
                built_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                meta.write_text(json.dumps({"now": clock.now(), "built": built_at, "fleet": asdict(fleet)}))
        print(
            f"database: {fleet.db_bytes / 2**20:,.0f} MiB, {fleet.sample_rows:,} sample rows"
            f" ({fleet.sample_bytes:,} bytes of JSON each), {fleet.rollup_rows:,} node roll-ups,"
            f" {fleet.fleet_rollup_rows} fleet roll-ups; built in {fleet.build_s} s"
        )
        token = admin_token(sessions, clock)
        settings = load_settings(client_file=workdir / "none.toml", data_dir=workdir)
        app = create_app(settings, sessions, clock, run_loops=False)
        timed = Timed(app)
        done = Run(fleet)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
            from fastapi.testclient import TestClient
        # As a context manager the client runs the app's lifespan and keeps one event loop for every
        # request, as uvicorn does.
        with TestClient(timed) as browser:
            log_in(browser, token, args.role)
            if not args.default_gc:
                gc_tuning.tune_for_long_running()  # what `gpufleet server` does after start-up
            started, machine_s, own_s = time.perf_counter(), *busy_seconds()
            for url in urls_to_time(args.nodes):
                if url.route is not None and not served(browser, url.path):
                    done.skipped[url.key] = f"{url.path} answers 404: the app serves no {url.route} (not wired yet?)"
                    print(f"note: skipping {url.path}: {done.skipped[url.key]}")
                    continue
                done.results.append(measure(browser, timed, url, args.requests, args.warmup))
            machine_now, own_now = busy_seconds()
            wall = time.perf_counter() - started
            done.others_cores = max(0.0, (machine_now - machine_s) - (own_now - own_s)) / wall
            if args.profile:
                done.parts = overview_parts(browser)
                done.profile = profile_overview(browser, args.profile_top)
        return done
    finally:
        engine.dispose()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--requests", type=int, default=30, help="timed GETs per URL (after --warmup)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed GETs per URL first")
    parser.add_argument("--history", type=float, default=120.0, help="seconds of samples per node")
    parser.add_argument("--rollup-minutes", type=int, default=60, help="minutes of node and fleet roll-ups")
    parser.add_argument("--down", type=int, default=4)
    parser.add_argument("--failed", type=int, default=3, help="failed nodes (drained by gpufleet)")
    parser.add_argument("--degraded", type=int, default=5)
    parser.add_argument("--alerts", type=int, default=50, help="firing alerts")
    parser.add_argument("--resolved-alerts", type=int, default=200)
    parser.add_argument("--role", default="operator", help="the web user's role (viewer, operator, admin)")
    parser.add_argument("--profile", action="store_true", help="also: the overview's data step by step, and cProfile")
    parser.add_argument("--profile-top", type=int, default=15)
    parser.add_argument(
        "--default-gc", action="store_true", help="leave CPython's GC thresholds alone (the head tunes them)"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, default=Path("bench/results/dashboard.json"))
    parser.add_argument(
        "--db",
        type=Path,
        help="keep the database in this file, and reuse it if it is there (the fleet options are then ignored)",
    )
    args = parser.parse_args()
    if args.nodes < 2 or args.down + args.failed + args.degraded + 1 >= args.nodes:
        parser.error("--nodes must leave room for the down, failed and degraded nodes")
    if args.nodes > 9999:
        parser.error("--nodes is at most 9999 (names gpu0001-gpu9999)")

    with tempfile.TemporaryDirectory(prefix="gpufleet-bench-dashboard-") as tmp:
        try:
            done = run(args, Path(tmp))
        except BenchError as exc:
            print(f"bench/dashboard.py: {exc}", file=sys.stderr)
            return 2

    print()
    print(
        f"{args.nodes} nodes x {args.gpus_per_node} GPUs, {args.role} session, {args.requests} GETs per URL after"
        f" {args.warmup} untimed. Times in ms. server: ASGI call to last byte; data: the page's read"
        " transaction; tmpl: the template; cpu: this process's CPU per request; gc: the longest time the garbage"
        " collector stopped one request"
    )
    print_table(done.results)
    goal = [r for r in done.results if r.met is not None]
    met = all(r.met for r in goal)
    full = sum(r.gc_full for r in done.results)
    worst = max(done.results, key=lambda r: r.gc_ms["max"])
    print(
        f"garbage collector: {full} full collection(s) in {len(done.results) * args.requests} timed requests;"
        f" the longest pause {worst.gc_ms['max']:.0f} ms ({worst.path})"
    )
    print()
    print(
        f"goal (overview and node table, server p95 <= {GOAL_MS:.0f} ms): {'met' if met else 'NOT met'}"
        f" (worst p95 {max(r.server_ms['p95'] for r in goal):.1f} ms)"
    )
    m = machine() | {"other_processes_cores": round(done.others_cores, 2)}
    print(f"machine: {m['cpus']} CPUs ({m['cpu']}), Python {m['python']}")
    busy = done.others_cores > 0.2
    print(f"other processes used {done.others_cores:.2f} cores while timing", end="")
    print(": the figures are inflated, run again on a quiet machine" if busy else "")
    for key, why in done.skipped.items():
        print(f"skipped {key}: {why}")
    if done.parts:
        print()
        print("where an overview request's time goes, by function (inclusive, no profiler; ms p50 / max of 10):")
        for step, ms in done.parts.items():
            print(f"  {step:<60} {ms['p50']:>7.1f} {ms['max']:>7.1f}")
    if done.profile:
        print()
        print("one overview request under cProfile (its overhead inflates the total), by cumulative time:")
        print(done.profile)

    args.json.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "goal_ms": GOAL_MS,
        "goal_met": met,
        "machine": m,
        "options": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "fleet": asdict(done.fleet),
        "results": [asdict(r) for r in done.results],
        "skipped": done.skipped,
        "overview_parts_ms": done.parts or None,
        "profile": done.profile or None,
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
