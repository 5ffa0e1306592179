"""`gpufleet demo`: a head node on SQLite and simulated H200 nodes in one process.

The data directory is kept between runs: the same database, the same admin token and web password
(kept in 0600 files so they can be printed again) and the same node credentials, so a second run
just resumes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets as _secrets
from collections.abc import Callable
from pathlib import Path

import httpx
import typer

from gpufleet.api.server import prepare
from gpufleet.cli.state import CliState
from gpufleet.client import raise_for
from gpufleet.core import gc_tuning, secrets
from gpufleet.core.config import default_client_file, load_settings, write_client_file
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


def run_demo(cli: CliState, data_dir: Path, listen: str, nodes: int, gpus_per_node: int) -> None:
    token = _kept_secret(data_dir, "admin-token", lambda: secrets.new_token(secrets.ADMIN_PREFIX))
    password = _kept_secret(data_dir, "admin-password", lambda: _secrets.token_urlsafe(12))
    # The demo always runs on its own SQLite file, whatever GPUFLEET_DATABASE_URL or a config file says.
    database_url = f"sqlite:///{data_dir / 'gpufleet.db'}"
    settings = cli.settings(data_dir=data_dir, listen=listen, bootstrap_token=token, database_url=database_url)
    host, port = settings.listen_host_port()
    url = f"http://{host}:{port}"
    server, _ = prepare(settings)

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
            f"  data dir    : {data_dir}\n"
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
            )
        )
        simulation.build()
        gc_tuning.tune_for_long_running()
        sim_task = asyncio.create_task(simulation.run())
        try:
            await serving
        finally:
            sim_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sim_task

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
    typer.echo("gpufleet demo stopped; run it again to resume with the same data.")
