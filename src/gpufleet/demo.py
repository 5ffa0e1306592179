"""`gpufleet demo`: a head node on SQLite and simulated H200 nodes in one process.

The data directory is kept between runs: the same database, the same admin token and web password
(kept in 0600 files so they can be printed again) and the same node credentials, so a second run
just resumes.

The terminal shows the banner and the head's events (nodes up and down, jobs placed, health); the
access log, a line per agent channel and per request, goes to DATA_DIR/access.log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets as _secrets
from collections.abc import Callable
from pathlib import Path

import httpx
import typer
import uvicorn

from gpufleet.api.server import prepare
from gpufleet.cli.state import CliState
from gpufleet.client import raise_for
from gpufleet.core import gc_tuning, logs, secrets
from gpufleet.core.config import Settings, default_client_file, load_settings, write_client_file
from gpufleet.core.errors import ConfigError
from gpufleet.sim.runner import SimOptions, Simulation


def _kept_secret(data_dir: Path, name: str, make: Callable[[], str]) -> str:
    """A secret made on the first run and kept in a 0600 file, so later runs can print it again."""
    path = data_dir / name
    if path.exists():
        return path.read_text().strip()
    data_dir.mkdir(parents=True, exist_ok=True)
    value = make()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(value + "\n")
    return value


def _point_cli_at(url: str, token: str) -> str:
    """Save the demo's URL and token for `gpufleet` in other terminals, unless a login elsewhere exists."""
    path = default_client_file()
    if path.exists():
        try:
            current = load_settings(client_file=path)
        except ConfigError:
            return f"left {path} alone (unreadable)"
        if current.server != url:
            return f"left {path} alone (it points at {current.server}); use --server/--token"
    write_client_file(path, url, token)
    return f"saved server and token to {path}"


async def _sample_jobs(url: str, token: str, nodes: int, gpus_per_node: int) -> None:
    """On the first run, once nodes are up: two projects with members and a quota, and jobs that keep
    the simulated cluster busy (a gang, single-GPU jobs, one holding idle GPUs, one over its quota)."""
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"}) as http:
        response = await http.get("/api/v1/jobs", params={"limit": 1, "state": list(_ALL_STATES)})
        raise_for(response)
        if response.json() or gpus_per_node == 0:
            return  # a later run: the jobs are there already
        for _ in range(120):  # the nodes join within seconds; submits check capacity against them
            if sum(n["state"] == "up" for n in (await http.get("/api/v1/nodes")).json()) >= min(nodes, 2):
                break
            await asyncio.sleep(1)
        for user, project in (("alice", "vision"), ("bob", "nlp")):
            await http.post("/api/v1/users", json={"username": user})
            await http.post("/api/v1/projects", json={"name": project})
            await http.post(f"/api/v1/projects/{project}/members", json={"user": user})
        await http.put("/api/v1/projects/nlp/quota", json={"max_gpus": min(4, gpus_per_node), "gpu_hours_budget": None})
        jobs: list[dict[str, object]] = []
        if nodes >= 2:
            jobs.append(
                {
                    "user": "alice",
                    "name": "llm-pretrain",
                    "nodes": 2,
                    "gpus_per_node": gpus_per_node,
                    "argv": ["torchrun", "train.py"],
                    "env": {"GPUFLEET_SIM_SECONDS": "1800"},
                    "time_limit_s": 7200,
                }
            )
        jobs += [
            {"user": "alice", "name": f"sweep-{i}", "gpus_per_node": 1, "argv": ["sleep", str(120 + 60 * i)]}
            for i in range(6)
        ]
        jobs.append(
            {
                "user": "bob",
                "name": "notebook",
                "gpus_per_node": 2,
                "argv": ["jupyter", "lab"],
                "env": {"GPUFLEET_SIM_SECONDS": "3600", "GPUFLEET_SIM_UTIL": "0.02"},
            }
        )
        jobs += [
            {"user": "bob", "name": f"finetune-{i}", "gpus_per_node": min(2, gpus_per_node), "argv": ["sleep", "900"]}
            for i in range(3)
        ]  # the nlp project's quota lets two run; the third waits with reason quota
        for job in jobs:
            response = await http.post("/api/v1/jobs", json=job)
            raise_for(response)


_ALL_STATES = ("pending", "running", "completed", "failed", "cancelled", "timeout", "node_fail")
ACCESS_LOG = "access.log"
# Off the terminal below WARNING: the simulated agents' routine lines (joined, reconnecting) repeat what the
# head reports about the same nodes; httpx logs every request the agents and the sample jobs make, alembic
# every migration.
_CHATTY = ("gpufleet.agent", "gpufleet.sim", "httpx", "alembic")


def demo_server(settings: Settings) -> uvicorn.Server:
    """The demo's head, its logging set up: the access log where `access_log` says (the demo's own
    settings put it in DATA_DIR/access.log), off the terminal. Unless a log level was asked for
    (GPUFLEET_LOG_LEVEL, a config file), uvicorn's own start and stop lines (the banner says where the
    head serves) and the `_CHATTY` ones stay off the terminal too."""
    logs.configure(settings.log_level)
    chosen = "log_level" in settings.model_fields_set
    if not chosen:
        for name in _CHATTY:
            logging.getLogger(name).setLevel(logging.WARNING)
    server, _ = prepare(settings, uvicorn_level=None if chosen else "WARNING")
    return server


def run_demo(cli: CliState, data_dir: Path, listen: str, nodes: int, gpus_per_node: int) -> None:
    token = _kept_secret(data_dir, "admin-token", lambda: secrets.new_token(secrets.ADMIN_PREFIX))
    password = _kept_secret(data_dir, "admin-password", lambda: _secrets.token_urlsafe(12))
    # The demo always runs on its own SQLite file, whatever GPUFLEET_DATABASE_URL or a config file says.
    database_url = f"sqlite:///{data_dir / 'gpufleet.db'}"
    settings = cli.settings(
        data_dir=data_dir,
        listen=listen,
        bootstrap_token=token,
        database_url=database_url,
        access_log=str(data_dir / ACCESS_LOG),
    )
    host, port = settings.listen_host_port()
    url = f"http://{host}:{port}"
    server = demo_server(settings)

    async def main() -> None:
        serving = asyncio.create_task(server.serve())
        while not server.started:
            if serving.done():
                serving.result()  # e.g. the port is taken: raise it
                return
            await asyncio.sleep(0.05)
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"}) as http:
            response = await http.post("/api/v1/tokens/join", json={"expires_in_s": 3600, "uses": nodes})
            raise_for(response)
            join_token = response.json()["token"]
            # A user for the web login; 409 on later runs, when it exists already.
            response = await http.post(
                "/api/v1/users", json={"username": "admin", "role": "admin", "password": password}
            )
            if response.status_code != 409:
                raise_for(response)
        saved = _point_cli_at(url, token)
        typer.echo(
            f"\ngpufleet demo is running: {nodes} simulated nodes x {gpus_per_node} H200\n"
            f"  dashboard   : {url}/  (user admin, password {password})\n"
            f"  admin token : {token}\n"
            f"  data dir    : {data_dir} (access log: {ACCESS_LOG})\n"
            f"  CLI         : {saved}\n"
            f"  try         : .venv/bin/gpufleet node list\n"
            f"Press Ctrl-C to stop.\n"
        )
        simulation = Simulation(
            SimOptions(
                server=url,
                join_token=join_token,
                nodes=nodes,
                gpus_per_node=gpus_per_node,
                state_dir=data_dir / "sim",
                metrics_interval_s=settings.metrics_interval_s,  # the pace the head expects samples at
                software=True,  # the Software page and `gpufleet assets` have something to show
            )
        )
        simulation.build()
        gc_tuning.tune_for_long_running()
        sim_task = asyncio.create_task(simulation.run())
        jobs_task = asyncio.create_task(_sample_jobs(url, token, nodes, gpus_per_node))
        try:
            await serving
        finally:
            for task in (sim_task, jobs_task):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
    typer.echo("gpufleet demo stopped; run it again to resume with the same data.")
