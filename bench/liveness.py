"""How fast does the head notice a dead node, what does it cost, and does it ever cry wolf?

Starts `gpufleet server` (SQLite in a fresh temp dir) as a subprocess, runs N simulated nodes with 1 s
heartbeats in this process, and after the leader's grace period kills a batch of random nodes every
few seconds (their agent task is cancelled, as if the node died), restarting each one a round later.
At the end it reads every changed node's transitions from the API and reports:

* detection latency: the `up -> down` transition's time minus the killed agent's last heartbeat send,
  as p50/p90/p99/max;
* false `down` transitions: any `up -> down` in the measured window that no kill explains;
* the head's CPU (user+system of the server process over the window / wall time) and the simulator's;
* how long N nodes took to join and all be `up`.

    .venv/bin/python bench/liveness.py --nodes 1000 --duration 300 --json bench/results/liveness-1000.json

Goal (the liveness issue): p99 <= 3 s with zero false transitions. Exit status 0 when met, 1 when not,
2 when the benchmark itself could not run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import platform
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

import httpx
import psutil

from gpufleet.client import HeadClient
from gpufleet.core import gc_tuning
from gpufleet.core.errors import GpufleetError
from gpufleet.sim.runner import SimOptions, Simulation

HEARTBEAT_S = 1.0
DOWN_AFTER_INTERVALS = 2.5  # the head's default; set explicitly for the server below
LEADER_GRACE_S = 10.0
GOAL_P99_S = 3.0
BOOTSTRAP_TOKEN = "gfa_bench_liveness_0123456789abcdef"  # noqa: S105 - a throwaway head on 127.0.0.1
SILENCE_RE = re.compile(r"no heartbeat for ([0-9.]+)s")


class BenchError(Exception):
    """The benchmark could not run (server did not start, nodes did not come up, ...)."""


@dataclass
class Kill:
    node: str
    killed_at: float  # wall clock when the agent was stopped
    last_heartbeat_at: float  # wall clock of the agent's last heartbeat send
    restarted_at: float | None = None
    down_at: float | None = None  # the matching up->down transition
    head_silence_s: float | None = None  # the silence the head's sweep saw, from the transition reason
    up_again_at: float | None = None


@dataclass
class ChurnState:
    """Shared by the kill loop and the monitor: every kill so far, the nodes dead now, restart times."""

    kills: list[Kill] = field(default_factory=list)
    down_now: dict[str, Kill] = field(default_factory=dict)
    restarted: dict[str, float] = field(default_factory=dict)


@dataclass
class SimHealth:
    """What the monitor coroutine sees inside the simulator: event-loop lag and heartbeat gaps."""

    lag_samples: list[float] = field(default_factory=list)
    # One row a second: wall time, then CPU cores used in that second by the head, this process and the
    # rest of the machine, and this event loop's worst lag in it. Lets a slow detection be put in context.
    series: list[tuple[float, float, float, float, float]] = field(default_factory=list)
    max_heartbeat_age_s: float = 0.0  # of live (not killed, not just restarted) nodes, sampled
    max_heartbeat_age_node: str = ""


@dataclass
class ServerProcess:
    proc: subprocess.Popen[bytes]
    log_path: Path
    url: str
    started_at: float
    agent_url: str = ""  # where the simulated agents connect: `url`, or a channel process's own address

    def __post_init__(self) -> None:
        self.agent_url = self.agent_url or self.url

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


# -- small helpers --------------------------------------------------------------------------------
def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in 0..100), like numpy's default; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def cpu_seconds(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return float(times.user + times.system)


def tree_cpu_seconds(proc: psutil.Process) -> float:
    """CPU of a process and its live children: a head with `workers` is a supervisor and its processes."""
    total = cpu_seconds(proc)
    for child in proc.children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            total += cpu_seconds(child)
    return total


@dataclass
class ProcessCpu:
    """Cores each of the head's processes used over a window, named by role, and PostgreSQL's.

    `head_pid` is the `gpufleet server` process (with several processes, their supervisor); `agent_url`
    where a channel process of its own answers (agent_listen), to tell it from the API's processes."""

    head_pid: int
    agent_url: str | None = None
    at_start: dict[int, float] = field(default_factory=dict)
    started: float = 0.0

    def _head(self) -> dict[int, float]:
        head = psutil.Process(self.head_pid)
        out = {}
        for proc in (head, *head.children(recursive=True)):
            with contextlib.suppress(psutil.NoSuchProcess):
                out[proc.pid] = cpu_seconds(proc)
        return out

    @staticmethod
    def _postgres() -> float:
        total = 0.0
        for proc in psutil.process_iter(["name"]):
            if proc.info["name"] in ("postgres", "postmaster"):
                with contextlib.suppress(psutil.NoSuchProcess):
                    total += cpu_seconds(proc)
        return total

    def start(self) -> None:
        self.at_start = self._head() | {-1: self._postgres()}
        self.started = time.monotonic()

    def cores(self) -> dict[str, float]:
        """Per process since `start` (a pid killed meanwhile is left out, a new one not counted)."""
        wall = time.monotonic() - self.started
        channel_pid = None
        if self.agent_url is not None:
            with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                channel_pid = int(httpx.get(self.agent_url + "/healthz", timeout=5).json()["pid"])
        out = {}
        for pid, cpu in sorted((self._head() | {-1: self._postgres()}).items()):
            if pid not in self.at_start:
                continue
            if pid == -1:
                name = "postgresql (all its processes)"
            elif pid == self.head_pid:
                name = f"supervisor {pid}"
            elif pid == channel_pid:
                name = f"channels {pid}"
            else:
                name = f"{_kind(pid, self.head_pid, channel_pid is not None)} {pid}"
            out[name] = round((cpu - self.at_start[pid]) / wall, 3)
        return out


def _kind(pid: int, supervisor: int, split: bool) -> str:
    """A head process that is neither the supervisor nor the channel process: an API process (a full
    replica when the head is not split), a worker one of them started (the roll-ups' aggregation), or
    the resource tracker Python's spawned processes bring along."""
    with contextlib.suppress(psutil.Error):
        proc = psutil.Process(pid)
        if "resource_tracker" in " ".join(proc.cmdline()):
            return "resource-tracker"
        if proc.ppid() != supervisor:
            return f"worker of {proc.ppid()}"
    return "api" if split else "replica"


def set_heartbeat(seconds: float) -> None:
    """Run at another heartbeat interval (bench/fleet_scale.py): the deadline and the goal scale with it,
    the goal staying the deadline plus half a second (3 s at 1 s)."""
    global HEARTBEAT_S, GOAL_P99_S  # noqa: PLW0603 - the run's one setting, read by every phase
    HEARTBEAT_S = seconds
    GOAL_P99_S = seconds * DOWN_AFTER_INTERVALS + 0.5


def machine_busy_seconds() -> float:
    """CPU seconds every process on the machine has used (all cores), to spot other load during the run."""
    t = psutil.cpu_times()
    return float(sum(t) - t.idle - getattr(t, "iowait", 0.0) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0))


def parse_at(value: str) -> float:
    return datetime.fromisoformat(value).timestamp()


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: TIME_WAIT is no conflict
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def fmt(value: float | None, unit: str = "s", digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f} {unit}".rstrip()


# -- the head node --------------------------------------------------------------------------------
def start_server(
    workdir: Path, port: int, extra_env: dict[str, str] | None = None, agent_port: int | None = None
) -> ServerProcess:
    """A `gpufleet server` on 127.0.0.1:`port`; with `agent_port`, its agents served apart there (agent_listen)."""
    for wanted in (port, agent_port):
        if wanted is not None and not port_free(wanted):
            raise BenchError(f"port {wanted} on 127.0.0.1 is taken; pass --port")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
    env.update(
        {
            "GPUFLEET_BOOTSTRAP_TOKEN": BOOTSTRAP_TOKEN,
            "GPUFLEET_LOG_LEVEL": "WARNING",
            "GPUFLEET_CLIENT_CONFIG": str(workdir / "no-client.toml"),
            "GPUFLEET_HEARTBEAT_INTERVAL_S": str(HEARTBEAT_S),
            "GPUFLEET_DOWN_AFTER_INTERVALS": str(DOWN_AFTER_INTERVALS),
            "GPUFLEET_LEADER_GRACE_S": str(LEADER_GRACE_S),
        }
        | (extra_env or {})
    )
    log_path = workdir / "server.log"
    cmd = [
        sys.executable,
        "-m",
        "gpufleet.entry",
        "server",
        "--data-dir",
        str(workdir / "head"),
        "--listen",
        f"127.0.0.1:{port}",
        *(["--agent-listen", f"127.0.0.1:{agent_port}"] if agent_port else []),
    ]
    with log_path.open("wb") as log_file:
        # Own session: a Ctrl-C in the terminal reaches only this script, which then stops the server itself.
        proc = subprocess.Popen(cmd, env=env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
    agent_url = f"http://127.0.0.1:{agent_port}" if agent_port else ""
    return ServerProcess(
        proc=proc, log_path=log_path, url=f"http://127.0.0.1:{port}", started_at=time.time(), agent_url=agent_url
    )


def wait_healthy(server: ServerProcess, timeout_s: float = 60.0) -> None:
    """Until the server answers /healthz. Raises BenchError if it exits or does not answer in time."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise BenchError(f"the server exited: {server.log_path.read_text()[-2000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(server.url + "/healthz", timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    raise BenchError(f"the server did not answer /healthz within {timeout_s:.0f} s")


async def until(predicate: Any, timeout_s: float, what: str, every_s: float = 0.5) -> None:
    """Await `predicate()` every `every_s` until true. Raises BenchError("{what} within N s") on timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await predicate():
            return
        await asyncio.sleep(every_s)
    raise BenchError(f"{what} within {timeout_s:.0f} s")


async def healthy_fleet(
    http: httpx.AsyncClient, url: str, nodes: int, state_dir: Path, metrics_interval_s: float
) -> asyncio.Task[None]:
    """`nodes` simulated 8-GPU nodes joined to the head at `url` (`http` holds the admin token), running
    as a task of this process, once every one has a `healthy` verdict. The caller cancels the task."""
    join = (await http.post("/api/v1/tokens/join", json={"expires_in_s": 3600, "uses": nodes})).json()
    sim = Simulation(
        SimOptions(
            server=url,
            join_token=join["token"],
            nodes=nodes,
            gpus_per_node=8,
            state_dir=state_dir,
            metrics_interval_s=metrics_interval_s,
        )
    )
    sim.build()
    gc_tuning.tune_for_long_running()
    task = asyncio.create_task(sim.run())

    async def all_judged() -> bool:
        rows = (await http.get("/api/v1/health")).json()
        return len(rows) == nodes and all(r["health"] == "healthy" for r in rows)

    try:
        await until(all_judged, 300, f"{nodes} nodes were not all up and healthy")
    except BaseException:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        raise
    return task


def stop_server(server: ServerProcess) -> None:
    if server.proc.poll() is not None:
        return
    server.proc.send_signal(signal.SIGTERM)
    try:
        server.proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait(timeout=10)


def wait_for_leader(server: ServerProcess, timeout_s: float = 60.0) -> float:
    """Wait until /healthz answers from a process that holds the leader lease. Returns when that was first
    seen. A new connection each time: with several head processes a kept-alive one asks the same one."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise BenchError(f"the server exited with {server.proc.returncode}:\n{server.log_tail()}")
        with contextlib.suppress(httpx.HTTPError, ValueError):
            if httpx.get(server.url + "/healthz", timeout=2).json().get("leader"):
                return time.time()
        time.sleep(0.1)
    raise BenchError(f"the server did not become healthy and leader in {timeout_s:.0f}s:\n{server.log_tail()}")


# -- the simulator side ---------------------------------------------------------------------------


async def monitor(sim: Simulation, state: ChurnState, health: SimHealth, head: psutil.Process) -> None:
    """Every 0.25 s: how late this event loop wakes up and the oldest heartbeat of a live node; every 1 s, CPU."""
    loop = asyncio.get_running_loop()
    me = psutil.Process()
    period = 0.25
    tick = 0
    last = (time.monotonic(), tree_cpu_seconds(head), cpu_seconds(me), machine_busy_seconds())
    second_lag = 0.0
    while True:
        expected = loop.time() + period
        await asyncio.sleep(period)
        lag = max(0.0, loop.time() - expected)
        health.lag_samples.append(lag)
        second_lag = max(second_lag, lag)
        now = time.time()
        for name, agent in sim.agents.items():
            if name in state.down_now or agent.last_heartbeat_at is None or not agent.connected:
                continue
            if now - state.restarted.get(name, 0.0) < 5.0:
                continue
            age = now - agent.last_heartbeat_at
            if age > health.max_heartbeat_age_s:
                health.max_heartbeat_age_s = age
                health.max_heartbeat_age_node = name
        tick += 1
        if tick % 4 == 0:
            current = (time.monotonic(), tree_cpu_seconds(head), cpu_seconds(me), machine_busy_seconds())
            wall = current[0] - last[0]
            head_c, me_c = (current[1] - last[1]) / wall, (current[2] - last[2]) / wall
            other_c = max(0.0, (current[3] - last[3]) / wall - head_c - me_c)
            health.series.append((now, head_c, me_c, other_c, second_lag))
            last, second_lag = current, 0.0


def context(health: SimHealth, start: float, end: float) -> dict[str, float]:
    """The worst of each per-second figure between `start` and `end` (plus the second after)."""
    rows = [r for r in health.series if start <= r[0] <= end + 1.0]
    return {
        "head_cores_max": max((r[1] for r in rows), default=0.0),
        "sim_cores_max": max((r[2] for r in rows), default=0.0),
        "other_cores_max": max((r[3] for r in rows), default=0.0),
        "sim_loop_lag_max_s": max((r[4] for r in rows), default=0.0),
    }


async def wait_all_up(sim: Simulation, sim_task: asyncio.Task[None], client: HeadClient, timeout_s: float) -> int:
    """Poll the head until every simulated node is `up`. Returns the number of polls."""
    deadline = time.monotonic() + timeout_s
    polls = 0
    want = len(sim.agents)
    up = 0
    while time.monotonic() < deadline:
        if sim_task.done():
            sim_task.result()  # raises the simulator's error
            raise BenchError("the simulator stopped early")
        polls += 1
        try:
            nodes = await asyncio.to_thread(client.list_nodes)
        except GpufleetError as exc:  # a head busy with a join storm may time out; keep waiting
            print(f"  (poll {polls}: {exc})", flush=True)
            await asyncio.sleep(1.0)
            continue
        up = sum(1 for n in nodes if n["state"] == "up" and n["name"] in sim.agents)
        if up == want:
            return polls
        if sim.failures:
            first = next(iter(sim.failures.items()))
            raise BenchError(f"{len(sim.failures)} simulated node(s) failed, e.g. {first[0]}: {first[1]}")
        await asyncio.sleep(1.0)
    raise BenchError(f"only {up} of {want} nodes were up after {timeout_s:.0f}s")


def pick_victims(
    sim: Simulation, rng: random.Random, count: int, down_now: set[str], restarted: dict[str, float]
) -> list[str]:
    """Random nodes that are live and settled: connected, beating, not killed, not restarted in the last 5 s."""
    now = time.time()
    candidates = [
        name
        for name, agent in sim.agents.items()
        if name not in down_now
        and agent.connected
        and agent.last_heartbeat_at is not None
        and now - agent.last_heartbeat_at < 1.5 * HEARTBEAT_S
        and now - restarted.get(name, 0.0) >= 5.0
    ]
    return rng.sample(candidates, min(count, len(candidates)))


async def kill(sim: Simulation, name: str, state: ChurnState) -> None:
    k = Kill(node=name, killed_at=time.time(), last_heartbeat_at=0.0)
    state.down_now[name] = k
    await sim.stop_node(name)
    # Read after the task is gone: a beat in flight when it was cancelled has then been counted or not.
    last = sim.agents[name].last_heartbeat_at
    assert last is not None
    k.last_heartbeat_at = last
    state.kills.append(k)


def restart(sim: Simulation, k: Kill, state: ChurnState) -> None:
    sim.start_node(k.node)
    k.restarted_at = state.restarted[k.node] = time.time()
    del state.down_now[k.node]


async def churn(
    sim: Simulation, args: argparse.Namespace, window_start: float, window_end: float, state: ChurnState
) -> None:
    """Every --kill-every seconds: restart the nodes killed long enough ago, then kill a new batch.

    The last round is early enough that its nodes are detected and restarted inside the window.
    """
    rng = random.Random(args.seed)
    restart_after = HEARTBEAT_S * DOWN_AFTER_INTERVALS + 2.5  # well past detection: a restart never hides a kill
    round_no = 0
    while True:
        round_no += 1
        at = window_start + round_no * args.kill_every
        if at + restart_after > window_end:
            break
        await asyncio.sleep(max(0.0, at - time.time()))
        now = time.time()
        for k in [k for k in state.down_now.values() if now - k.killed_at >= restart_after]:
            restart(sim, k, state)
        victims = pick_victims(sim, rng, args.kill_batch, set(state.down_now), state.restarted)
        await asyncio.gather(*(kill(sim, name, state) for name in victims))
    last_kill = max((k.killed_at for k in state.down_now.values()), default=0.0)
    await asyncio.sleep(max(0.0, last_kill + restart_after - time.time()))
    for k in list(state.down_now.values()):
        restart(sim, k, state)


# -- reading the verdict back ---------------------------------------------------------------------
def fetch_transitions(client: HeadClient, since: float, must: set[str]) -> dict[str, list[dict[str, Any]]]:
    """Chronological transitions of every node whose state changed since `since` (plus `must`).

    A node whose `state_since` is older than the window has had no transition in it, so it needs no call.
    """
    nodes = client.list_nodes()
    names = {n["name"] for n in nodes if parse_at(n["state_since"]) >= since} | must
    out: dict[str, list[dict[str, Any]]] = {}
    for name in sorted(names):
        detail = client.show_node(name)
        out[name] = list(reversed(detail["transitions"]))  # the API gives newest first
    return out


def match(
    kills: list[Kill], transitions: dict[str, list[dict[str, Any]]], window_start: float, window_end: float
) -> list[dict[str, Any]]:
    """Fill each kill's detection and recovery; return the up->down transitions no kill explains."""
    downs: dict[str, list[dict[str, Any]]] = {}
    ups: dict[str, list[dict[str, Any]]] = {}
    for name, rows in transitions.items():
        for row in rows:
            at = parse_at(row["at"])
            if not window_start <= at <= window_end:
                continue
            entry = {**row, "node": name, "ts": at}
            if row["from_state"] == "up" and row["to_state"] == "down":
                downs.setdefault(name, []).append(entry)
            elif row["to_state"] == "up":
                ups.setdefault(name, []).append(entry)
    explained: set[int] = set()
    for k in sorted(kills, key=lambda k: k.killed_at):
        until = k.restarted_at if k.restarted_at is not None else window_end
        for entry in downs.get(k.node, []):
            if id(entry) not in explained and k.killed_at <= entry["ts"] <= until:
                explained.add(id(entry))
                k.down_at = entry["ts"]
                silence = SILENCE_RE.search(entry["reason"])
                k.head_silence_s = float(silence.group(1)) if silence else None
                break
        if k.restarted_at is not None:
            k.up_again_at = next((e["ts"] for e in ups.get(k.node, []) if e["ts"] >= k.restarted_at), None)
    return [e for rows in downs.values() for e in rows if id(e) not in explained]


# -- the run --------------------------------------------------------------------------------------
class Load(Protocol):
    """Something run against the head during the measured window (bench/api_load.py's API clients)."""

    def start(self, url: str, seconds: float) -> None: ...

    def finish(self) -> dict[str, Any]: ...


async def run_simulation(
    args: argparse.Namespace, server: ServerProcess, workdir: Path, load: Load | None = None
) -> dict[str, Any]:
    client = HeadClient(server.url, BOOTSTRAP_TOKEN)
    try:
        leader_at = await asyncio.to_thread(wait_for_leader, server)
        join = await asyncio.to_thread(client.create_join_token, 3600, args.nodes)
        sim = Simulation(
            SimOptions(
                server=server.agent_url,
                join_token=join["token"],
                nodes=args.nodes,
                gpus_per_node=args.gpus_per_node,
                state_dir=workdir / "sim",
                heartbeat_interval_s=HEARTBEAT_S,
                metrics_interval_s=args.metrics_interval,
            )
        )
        sim.build()
        if not args.sim_default_gc:
            gc_tuning.tune_for_long_running()
        sim_started = time.time()
        sim_task = asyncio.create_task(sim.run(), name="simulation")
        try:
            return await measure(args, server, client, sim, sim_task, leader_at, sim_started, load)
        finally:
            sim_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, GpufleetError):
                await sim_task
    finally:
        client.close()


async def measure(
    args: argparse.Namespace,
    server: ServerProcess,
    client: HeadClient,
    sim: Simulation,
    sim_task: asyncio.Task[None],
    leader_at: float,
    sim_started: float,
    load: Load | None = None,
) -> dict[str, Any]:
    polls = await wait_all_up(sim, sim_task, client, timeout_s=max(120.0, args.nodes * 0.2))
    all_up_s = time.time() - sim_started
    print(f"all {args.nodes} nodes up after {all_up_s:.1f}s ({polls} polls); waiting out the leader grace", flush=True)
    await asyncio.sleep(max(2.0, leader_at + LEADER_GRACE_S + 1.0 - time.time()))

    state, health = ChurnState(), SimHealth()
    head, me = psutil.Process(server.proc.pid), psutil.Process()
    head_cpu0, me_cpu0, all_cpu0, wall0 = (
        tree_cpu_seconds(head),
        cpu_seconds(me),
        machine_busy_seconds(),
        time.monotonic(),
    )
    window_start = time.time()
    window_end = window_start + args.duration
    print(
        f"measuring for {args.duration:.0f}s: {args.kill_batch} node(s) killed every {args.kill_every:g}s", flush=True
    )
    monitor_task = asyncio.create_task(monitor(sim, state, health, head))
    if load is not None:
        load.start(server.url, args.duration)
    try:
        await churn(sim, args, window_start, window_end, state)
        await asyncio.sleep(max(0.0, window_end - time.time()))
    finally:
        monitor_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await monitor_task
    loaded = await asyncio.to_thread(load.finish) if load is not None else None
    head_cpu1, me_cpu1, all_cpu1, wall1 = (
        tree_cpu_seconds(head),
        cpu_seconds(me),
        machine_busy_seconds(),
        time.monotonic(),
    )
    head_rss = head.memory_info().rss
    window_end = time.time()
    if sim_task.done():
        sim_task.result()
        raise BenchError("the simulator stopped during the run")
    transitions = await asyncio.to_thread(fetch_transitions, client, window_start, {k.node for k in state.kills})
    false_downs = match(state.kills, transitions, window_start, window_end)
    wall = wall1 - wall0
    fig = figures(
        args,
        kills=state.kills,
        false_downs=false_downs,
        health=health,
        all_up_s=all_up_s,
        setup_s=window_start - server.started_at,
        window_start=window_start,
        wall=wall,
        head_cpu=head_cpu1 - head_cpu0,
        sim_cpu=me_cpu1 - me_cpu0,
        other_cpu=(all_cpu1 - all_cpu0) - (head_cpu1 - head_cpu0) - (me_cpu1 - me_cpu0),
        head_rss=head_rss,
    )
    if loaded is not None:
        fig["load"] = loaded
    return fig


def figures(
    args: argparse.Namespace,
    *,
    kills: list[Kill],
    false_downs: list[dict[str, Any]],
    health: SimHealth,
    all_up_s: float,
    setup_s: float,
    window_start: float,
    wall: float,
    head_cpu: float,
    sim_cpu: float,
    other_cpu: float,
    head_rss: int,
) -> dict[str, Any]:
    detected = [k for k in kills if k.down_at is not None]
    latencies = [k.down_at - k.last_heartbeat_at for k in detected if k.down_at is not None]
    silences = [k.head_silence_s for k in detected if k.head_silence_s is not None]
    recoveries = [k.up_again_at - k.restarted_at for k in kills if k.up_again_at and k.restarted_at]
    p99 = percentile(latencies, 99)
    missed = len(kills) - len(detected)
    slowest = sorted(detected, key=lambda k: (k.down_at or 0.0) - k.last_heartbeat_at, reverse=True)[:5]
    return {
        "machine": {
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
            "python": platform.python_version(),
            "load_avg_1m_at_end": os.getloadavg()[0],
        },
        "nodes": args.nodes,
        "heartbeat_interval_s": HEARTBEAT_S,
        "down_deadline_s": HEARTBEAT_S * DOWN_AFTER_INTERVALS,
        "duration_s": round(wall, 1),
        "kill_every_s": args.kill_every,
        "kill_batch": args.kill_batch,
        "kills": len(kills),
        "detected": len(detected),
        "missed": missed,
        "latency_s": {
            "p50": percentile(latencies, 50),
            "p90": percentile(latencies, 90),
            "p99": p99,
            "max": max(latencies, default=None),
            "min": min(latencies, default=None),
        },
        "head_silence_at_down_s": {"p50": percentile(silences, 50), "max": max(silences, default=None)},
        "false_down_transitions": len(false_downs),
        "false_down_examples": [
            {"node": e["node"], "at": e["at"], "reason": e["reason"]}
            for e in sorted(false_downs, key=lambda e: e["ts"])
        ][:10],
        "recovered": len(recoveries),
        "recovery_s": {"p50": percentile(recoveries, 50), "max": max(recoveries, default=None)},
        "head_cpu_cores": head_cpu / wall,
        "head_rss_mib": head_rss / 2**20,
        "sim_cpu_cores": sim_cpu / wall,
        "other_processes_cpu_cores": max(0.0, other_cpu / wall),
        "sim_loop_lag_s": {
            "p50": percentile(health.lag_samples, 50),
            "p99": percentile(health.lag_samples, 99),
            "max": max(health.lag_samples, default=None),
        },
        "sim_max_heartbeat_age_s": health.max_heartbeat_age_s,
        "sim_gc": "default" if args.sim_default_gc else f"freeze + threshold {gc_tuning.THRESHOLD}",
        "time_to_all_up_s": all_up_s,
        "setup_s": setup_s,
        "goal": {
            "p99_max_s": GOAL_P99_S,
            "met": p99 is not None and p99 <= GOAL_P99_S and not false_downs and missed == 0,
        },
        "slowest_detections": [
            {
                "node": k.node,
                "latency_s": (k.down_at or 0.0) - k.last_heartbeat_at,
                "head_silence_s": k.head_silence_s,
                "s_into_window": k.killed_at - window_start,
                **context(health, k.last_heartbeat_at, k.down_at or k.last_heartbeat_at),
            }
            for k in slowest
        ],
        "kill_log": [asdict(k) for k in kills],
        "per_second": [
            {"t": r[0] - window_start, "head_cores": r[1], "sim_cores": r[2], "other_cores": r[3], "sim_lag_s": r[4]}
            for r in health.series
        ],
    }


def report(fig: dict[str, Any]) -> str:
    m = fig["machine"]
    lat = fig["latency_s"]
    lag = fig["sim_loop_lag_s"]
    goal = fig["goal"]
    lines = [
        "gpufleet liveness benchmark",
        f"  machine          {m['platform']}, {m['cpu_count']} CPUs, Python {m['python']}",
        f"  nodes            {fig['nodes']} (heartbeat {fig['heartbeat_interval_s']:g}s,"
        f" down after {fig['down_deadline_s']:g}s silent)",
        f"  duration         {fig['duration_s']:.0f}s measured; {fig['kills']} kills"
        f" ({fig['kill_batch']} every {fig['kill_every_s']:g}s), {fig['detected']} detected, {fig['missed']} missed",
        f"  detection        p50 {fmt(lat['p50'])}  p90 {fmt(lat['p90'])}  p99 {fmt(lat['p99'])}"
        f"  max {fmt(lat['max'])}  (last heartbeat sent -> down)",
        f"    of which       the head's own silence count at down (0.1 s resolution):"
        f" p50 {fmt(fig['head_silence_at_down_s']['p50'], digits=1)}"
        f" max {fmt(fig['head_silence_at_down_s']['max'], digits=1)}",
        f"  false downs      {fig['false_down_transitions']}",
        f"  recovery         {fig['recovered']} restarted nodes back up, p50 {fmt(fig['recovery_s']['p50'])}"
        f" max {fmt(fig['recovery_s']['max'])}",
        f"  head CPU         {fig['head_cpu_cores']:.3f} cores ({fig['head_cpu_cores'] * 100:.1f}% of one core),"
        f" RSS {fig['head_rss_mib']:.0f} MiB",
        f"  simulator CPU    {fig['sim_cpu_cores']:.3f} cores ({fig['sim_cpu_cores'] * 100:.1f}% of one core);"
        f" loop lag p50 {fmt(lag['p50'])} p99 {fmt(lag['p99'])} max {fmt(lag['max'])};"
        f" oldest live heartbeat {fmt(fig['sim_max_heartbeat_age_s'])}; GC {fig['sim_gc']}",
        f"  other processes  {fig['other_processes_cpu_cores']:.3f} cores busy on this machine during the window",
        f"  time to all up   {fig['time_to_all_up_s']:.1f}s (server start to measuring: {fig['setup_s']:.1f}s)",
        f"  goal             p99 <= {goal['p99_max_s']:g}s, 0 false downs, none missed:"
        f" {'MET' if goal['met'] else 'NOT MET'}",
    ]
    lines += [
        f"  slow detection   {d['node']} {d['latency_s']:.3f}s at +{d['s_into_window']:.0f}s (head silence"
        f" {d['head_silence_s']}s); that second: head {d['head_cores_max']:.2f}, sim {d['sim_cores_max']:.2f},"
        f" others {d['other_cores_max']:.2f} cores, sim lag {d['sim_loop_lag_max_s']:.3f}s"
        for d in fig["slowest_detections"][:3]
    ]
    lines += [f"  false down       {e['node']} at {e['at']}: {e['reason']}" for e in fig["false_down_examples"]]
    return "\n".join(lines)


def parse_args(
    argv: list[str] | None = None, more: Callable[[argparse.ArgumentParser], object] | None = None
) -> argparse.Namespace:
    """The options; `more` adds a calling benchmark's own (bench/api_load.py)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    if more is not None:
        more(parser)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--duration", type=float, default=300.0, help="measured seconds")
    parser.add_argument("--kill-every", type=float, default=15.0, help="seconds between kill rounds")
    parser.add_argument("--kill-batch", type=int, default=10, help="nodes killed per round")
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--metrics-interval", type=float, default=5.0, help="the agents' metrics interval, s")
    parser.add_argument("--port", type=int, default=18765)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--sim-default-gc",
        action="store_true",
        help="leave the simulator process's garbage collector at Python's defaults (see tune_gc)",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    args = parser.parse_args(argv)
    if args.kill_every < HEARTBEAT_S * DOWN_AFTER_INTERVALS + 1.0:
        parser.error("--kill-every must leave time for detection (at least 3.5s)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM cleans up like Ctrl-C: the server is stopped and the simulation cancelled.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with tempfile.TemporaryDirectory(prefix="gpufleet-bench-") as tmp:
        workdir = Path(tmp)
        try:
            server = start_server(workdir, args.port)
        except BenchError as exc:
            print(f"benchmark failed: {exc}", file=sys.stderr)
            return 2
        try:
            fig = asyncio.run(run_simulation(args, server, workdir))
        except (BenchError, GpufleetError) as exc:
            print(f"benchmark failed: {exc}", file=sys.stderr)
            print(f"server log (last lines):\n{server.log_tail()}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130
        finally:
            stop_server(server)
    print(report(fig))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(fig, indent=2) + "\n")
        print(f"figures written to {args.json}")
    return 0 if fig["goal"]["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
