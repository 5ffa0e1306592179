"""The `gpufleet` console script: the CLI plus the long-running commands (server, agent, sim, demo).

This is the composition root for processes. The heavy imports happen inside each command, so
`gpufleet node list` on a laptop or `gpufleet agent` on a GPU node never loads the server.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
from pathlib import Path
from typing import Annotated

import typer

from gpufleet.cli.app import app
from gpufleet.cli.state import state
from gpufleet.core import gc_tuning
from gpufleet.core.errors import GpufleetError, InvalidInput
from gpufleet.protocol.messages import check_node_name

ServerOpt = Annotated[str | None, typer.Option("--server", help="head node URL (env GPUFLEET_SERVER)")]
JoinOpt = Annotated[str | None, typer.Option("--join-token", envvar="GPUFLEET_JOIN_TOKEN", help="join token")]
IntervalOpt = Annotated[
    float | None,
    typer.Option("--heartbeat-interval", min=0.05, max=3600, help="seconds between heartbeats (default: the head's)"),
]


def _logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")


@app.command("server")
def server(
    ctx: typer.Context,
    data_dir: Annotated[Path | None, typer.Option(help="state directory (env GPUFLEET_DATA_DIR)")] = None,
    listen: Annotated[str | None, typer.Option(help="HOST:PORT (env GPUFLEET_LISTEN)")] = None,
) -> None:
    """Run the head node: API, agent channels, liveness."""
    settings = state(ctx).settings(data_dir=data_dir, listen=listen)
    _logging(settings.log_level)
    from gpufleet.api.server import run

    run(settings)


@app.command("agent")
def agent(
    ctx: typer.Context,
    server: ServerOpt = None,
    join_token: JoinOpt = None,
    name: Annotated[str | None, typer.Option(help="node name (default: the short hostname)")] = None,
    state_dir: Annotated[Path | None, typer.Option(help="where the node credential is kept")] = None,
    heartbeat_interval: IntervalOpt = None,
) -> None:
    """Run the node agent: join with a join token once, then heartbeat and report inventory."""
    settings = state(ctx).settings(server=server, agent_state_dir=state_dir)
    _logging(settings.log_level)
    from gpufleet.agent.main import run_agent

    node = name or socket.gethostname().split(".")[0]
    try:
        check_node_name(node)
    except ValueError as exc:
        raise InvalidInput(f"{exc}; pass --name") from None
    run_agent(settings, node, join_token, heartbeat_interval)


@app.command("sim")
def sim(
    ctx: typer.Context,
    server: ServerOpt = None,
    join_token: JoinOpt = None,
    nodes: Annotated[int, typer.Option(min=1, max=10_000, help="number of simulated nodes")] = 16,
    gpus_per_node: Annotated[int, typer.Option(min=0, max=64)] = 8,
    gpu_model: Annotated[str, typer.Option(help="H200, H100 or A100")] = "H200",
    state_dir: Annotated[Path, typer.Option(help="where the simulated nodes keep their credentials")] = Path(
        "gpufleet-sim"
    ),
    prefix: Annotated[str, typer.Option(help="node name prefix")] = "sim",
    heartbeat_interval: IntervalOpt = None,
) -> None:
    """Run N simulated GPU nodes: real agent code over a simulated NVML."""
    settings = state(ctx).settings(server=server)
    _logging(settings.log_level)
    from gpufleet.sim.runner import SimOptions, Simulation

    simulation = Simulation(
        SimOptions(
            server=settings.server,
            join_token=join_token,
            nodes=nodes,
            gpus_per_node=gpus_per_node,
            gpu_model=gpu_model,
            state_dir=state_dir,
            prefix=prefix,
            heartbeat_interval_s=heartbeat_interval,
        )
    )
    simulation.build()
    gc_tuning.tune_for_long_running()  # a thousand agents in one process: see core/gc_tuning.py
    typer.echo(f"simulating {nodes} node(s) with {gpus_per_node} {gpu_model} GPU(s) each against {settings.server}")
    try:
        asyncio.run(simulation.run())
    except KeyboardInterrupt:
        typer.echo("simulator stopped")


@app.command("demo")
def demo(
    ctx: typer.Context,
    data_dir: Annotated[Path, typer.Option(help="demo state (reused by the next run)")] = Path(".gpufleet/demo"),
    listen: Annotated[str, typer.Option(help="HOST:PORT")] = "127.0.0.1:8080",
    nodes: Annotated[int, typer.Option(min=1, max=10_000)] = 16,
    gpus_per_node: Annotated[int, typer.Option(min=0, max=64)] = 8,
) -> None:
    """Head node + simulated nodes in one command, with SQLite under DATA_DIR."""
    from gpufleet.demo import run_demo

    run_demo(state(ctx), data_dir.resolve(), listen, nodes, gpus_per_node)


def main() -> None:
    """Run the CLI. A user error prints one line and exits non-zero; no traceback.

    Typer's standalone mode already turns usage errors into a message and exit code 2; what is left
    to catch is gpufleet's own error tree.
    """
    try:
        app(prog_name="gpufleet")
    except GpufleetError as exc:
        typer.echo(f"gpufleet: error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
