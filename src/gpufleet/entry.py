"""The `gpufleet` console script: the CLI plus the long-running commands (server, agent, sim, demo).

This is the composition root for processes. The heavy imports happen inside each command, so
`gpufleet node list` on a laptop or `gpufleet agent` on a GPU node never loads the server.
"""

from __future__ import annotations

import asyncio
import enum
import socket
import sys
from pathlib import Path
from typing import Annotated

import typer

from gpufleet.cli import units
from gpufleet.cli.app import app
from gpufleet.cli.output import Format, OutputOpt, print_json, table
from gpufleet.cli.state import state
from gpufleet.core import gc_tuning, logs
from gpufleet.core.config_storage import check_mount_paths
from gpufleet.core.errors import GpufleetError, InvalidInput
from gpufleet.doctor.command import doctor
from gpufleet.ops.commands import add_commands as add_server_commands
from gpufleet.ops.commands import check_upgrade
from gpufleet.protocol.messages import check_node_name
from gpufleet.protocol.metrics import FAULT_KINDS

ServerOpt = Annotated[str | None, typer.Option("--server", help="head node URL (env GPUFLEET_SERVER)")]
JoinOpt = Annotated[str | None, typer.Option("--join-token", envvar="GPUFLEET_JOIN_TOKEN", help="join token")]
IntervalOpt = Annotated[
    float | None,
    typer.Option("--heartbeat-interval", min=0.05, max=3600, help="seconds between heartbeats (default: the head's)"),
]


server_app = typer.Typer(help="The head node: run it, or prepare its TLS certificates.", no_args_is_help=False)
app.add_typer(server_app, name="server")
add_server_commands(server_app)  # backup, restore, check-upgrade (gpufleet.ops)


@server_app.callback(invoke_without_command=True)
def server(
    ctx: typer.Context,
    data_dir: Annotated[Path | None, typer.Option(help="state directory (env GPUFLEET_DATA_DIR)")] = None,
    listen: Annotated[str | None, typer.Option(help="HOST:PORT (env GPUFLEET_LISTEN)")] = None,
    workers: Annotated[
        int | None, typer.Option(help="head processes behind HOST:PORT, on PostgreSQL (env GPUFLEET_WORKERS)")
    ] = None,
    agent_listen: Annotated[
        str | None,
        typer.Option(help="HOST:PORT where a channel process serves the agents (env GPUFLEET_AGENT_LISTEN)"),
    ] = None,
    access_log: Annotated[
        str | None,
        typer.Option(help="access log: - (stderr), a file, or off (env GPUFLEET_ACCESS_LOG)"),
    ] = None,
    check_upgrade_only: Annotated[
        bool,
        typer.Option("--check-upgrade", help="say which migrations a start would run; change nothing (exit 1: some)"),
    ] = False,
) -> None:
    """Run the head node: API, agent channels, liveness. HTTPS once `gpufleet server init` has run."""
    if ctx.invoked_subcommand is not None:
        return
    settings = state(ctx).settings(
        data_dir=data_dir, listen=listen, workers=workers, agent_listen=agent_listen, access_log=access_log
    )
    if check_upgrade_only:
        check_upgrade(settings)  # exits with its outcome (gpufleet.ops.commands)
    logs.configure(settings.log_level)
    from gpufleet.api.server import run

    run(settings)


@server_app.command("init")
def server_init(
    ctx: typer.Context,
    data_dir: Annotated[Path | None, typer.Option(help="state directory (env GPUFLEET_DATA_DIR)")] = None,
    san: Annotated[
        list[str] | None,
        typer.Option("--san", help="host name or IP agents use to reach the head (repeat; default: this host's)"),
    ] = None,
    reissue: Annotated[bool, typer.Option(help="issue a new server certificate with the same CA")] = False,
) -> None:
    """Create the cluster CA and the head's server certificate in DATA_DIR/tls (the CA is kept if present)."""
    settings = state(ctx).settings(data_dir=data_dir)
    from gpufleet.api.pki import default_names, init_pki

    names = [*(san or []), *default_names()]
    result = init_pki(settings.data_dir / "tls", names, reissue=reissue)
    made = "created" if result.created_ca else "kept"
    typer.echo(f"CA {made}: {result.files.ca_cert}\n  fingerprint: {result.ca_fingerprint}")
    if result.issued_cert:
        typer.echo(f"server certificate issued: {result.files.cert}\n  names: {', '.join(result.names)}")
    else:
        typer.echo(f"server certificate kept: {result.files.cert} (--reissue for a new one)")
    typer.echo("`gpufleet server` now serves HTTPS; new join tokens carry the CA fingerprint for agents to pin.")


app.command("doctor")(doctor)


agent_app = typer.Typer(help="The node agent: run it, or install its systemd unit.", no_args_is_help=False)
app.add_typer(agent_app, name="agent")
agent_app.command("install-unit")(units.agent_install_unit)  # gpufleet.cli.units
server_app.command("install-unit")(units.server_install_unit)


@agent_app.callback(invoke_without_command=True)
def agent(
    ctx: typer.Context,
    server: ServerOpt = None,
    join_token: JoinOpt = None,
    name: Annotated[str | None, typer.Option(help="node name (default: the short hostname)")] = None,
    state_dir: Annotated[Path | None, typer.Option(help="where the node credential is kept")] = None,
    heartbeat_interval: IntervalOpt = None,
) -> None:
    """Run the node agent: join with a join token once, then heartbeat and report inventory."""
    if ctx.invoked_subcommand is not None:  # install-unit
        return
    settings = state(ctx).settings(server=server, agent_state_dir=state_dir)
    logs.configure(settings.log_level)
    from gpufleet.agent.main import run_agent

    node = name or socket.gethostname().split(".")[0]
    try:
        check_node_name(node)
    except ValueError as exc:
        raise InvalidInput(f"{exc}; pass --name") from None
    run_agent(settings, node, join_token, heartbeat_interval)


sim_app = typer.Typer(help="Simulated GPU nodes: run them, inject or heal faults; replay a job trace.")
app.add_typer(sim_app, name="sim")


@sim_app.command("fault")
def sim_fault(
    ctx: typer.Context,
    node: str,
    kind: Annotated[str, typer.Option(help="|".join(FAULT_KINDS))],
    gpu: Annotated[int | None, typer.Option(help="which GPU (default: the first)")] = None,
) -> None:
    """Inject a fault into a running simulated node, through the head and the node's channel."""
    if kind not in FAULT_KINDS:
        raise InvalidInput(f"unknown fault kind {kind!r}; one of {', '.join(FAULT_KINDS)}")
    result = state(ctx).client().fault(node, "inject", kind, gpu)
    _fault_answer(result)


@sim_app.command("heal")
def sim_heal(ctx: typer.Context, node: str) -> None:
    """Undo every fault injected into a simulated node."""
    _fault_answer(state(ctx).client().fault(node, "heal", None, None))


class ReplayPolicy(enum.StrEnum):
    fifo = "fifo"
    gpufleet = "gpufleet"
    both = "both"


@sim_app.command("replay")
def sim_replay(
    trace: Annotated[Path, typer.Argument(help="an openb pod list or a Philly runtime list (CSV)")],
    nodes_file: Annotated[
        Path | None,
        typer.Option("--nodes-file", help="openb node list (default: openb_node_list_gpu_node.csv beside TRACE)"),
    ] = None,
    nodes: Annotated[int | None, typer.Option(min=1, max=100_000, help="a homogeneous cluster of N nodes")] = None,
    gpus_per_node: Annotated[int | None, typer.Option(min=1, max=64, help="GPUs per node, with --nodes")] = None,
    policy: Annotated[ReplayPolicy, typer.Option(help="fifo, gpufleet, or both side by side")] = ReplayPolicy.both,
    limit: Annotated[
        int | None, typer.Option(min=1, help="openb: the first K pods; Philly: a seeded sample of K runtimes")
    ] = None,
    load: Annotated[
        float, typer.Option(min=0.01, max=10.0, help="Philly: share of the GPUs the synthetic arrivals offer")
    ] = 0.8,
    seed: Annotated[int, typer.Option(help="Philly: seed of the synthetic arrivals, GPU counts and order")] = 1,
    time_limit_factor: Annotated[
        float, typer.Option(min=1.0, max=1000.0, help="a job's time limit = its runtime x this (backfill uses it)")
    ] = 1.0,
    output: Format = OutputOpt,
) -> None:
    """Replay a job trace through the built-in scheduler in simulated time and compare policies.

    Reports mean and p99 job completion time and queueing delay, GPU allocation rate and fragmentation.
    No head node is needed: this runs in this process.
    """
    from gpufleet.jobs.replay import POLICIES, ReplayOptions, replay_file

    chosen = POLICIES if policy == ReplayPolicy.both else (policy.value,)
    report = replay_file(
        trace,
        [p for p in POLICIES if p in chosen],
        nodes_file=nodes_file,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        limit=limit,
        load=load,
        seed=seed,
        options=ReplayOptions(time_limit_factor=time_limit_factor),
    )
    if output == Format.json:
        print_json(report.as_dict())
        return
    typer.echo(f"trace: {report.trace} ({report.format}, {report.rows} rows, {report.jobs} jobs replayed)")
    typer.echo(f"cluster: {report.cluster}")
    for note in report.notes:
        typer.echo(f"  - {note}")
    columns = [r.figures() for r in report.results]
    rows = [
        {"figure": label, **{r.policy: col[i][1] for r, col in zip(report.results, columns, strict=True)}}
        for i, (label, _) in enumerate(columns[0])
    ]
    table(rows, [("figure", ""), *((r.policy, r.policy) for r in report.results)])
    if any(r.never_started for r in report.results):
        typer.echo("warning: some jobs neither started nor were unschedulable (see -o json: never_started)", err=True)


def _shared_mounts(paths: list[str]) -> list[str]:
    """`--shared-mount` paths, checked as the `shared_mounts` setting checks them. Raises InvalidInput."""
    try:
        return check_mount_paths(paths)
    except ValueError as exc:
        raise InvalidInput(f"--shared-mount: {exc}") from None


def _fault_answer(result: dict[str, object]) -> None:
    if not result["ok"]:
        raise InvalidInput(f"node {result['node']} refused: {result['message']}")
    typer.echo(f"{result['node']}: {result['message'] or 'done'}")


@sim_app.callback(invoke_without_command=True)
def sim(
    ctx: typer.Context,
    server: ServerOpt = None,
    join_token: JoinOpt = None,
    nodes: Annotated[int, typer.Option(min=1, max=10_000, help="number of simulated nodes")] = 16,
    gpus_per_node: Annotated[int, typer.Option(min=0, max=64)] = 8,
    gpu_model: Annotated[str, typer.Option(help="H200, H100 or A100")] = "H200",
    driver_version: Annotated[
        str | None, typer.Option(help="the NVIDIA driver the nodes report, e.g. 535.183.01 (default: 580.159.04)")
    ] = None,
    state_dir: Annotated[
        Path | None,
        typer.Option(
            help="where the simulated nodes keep their credentials"
            " (default: $XDG_STATE_HOME/gpufleet/sim, else ~/.local/state/gpufleet/sim)"
        ),
    ] = None,
    prefix: Annotated[str, typer.Option(help="node name prefix")] = "sim",
    heartbeat_interval: IntervalOpt = None,
    software: Annotated[
        bool, typer.Option("--software/--no-software", help="report simulated installed software (assets, CVEs)")
    ] = False,
    fault: Annotated[
        list[str] | None,
        typer.Option(
            "--fault",
            metavar="NODE:KIND[:GPU]",
            help="a fault NODE has from the start, e.g. sim003:weak-gpu-slow:2 or sim007:weak-link (repeat)",
        ),
    ] = None,
    burnin_time_scale: Annotated[
        float | None,
        typer.Option(
            min=0,
            max=10,
            envvar="GPUFLEET_SIM_BURNIN_TIME_SCALE",
            help="a burn-in step lasts its seconds times this (default 0.005)",
        ),
    ] = None,
    burnin_max_seconds: Annotated[
        float | None,
        typer.Option(
            min=0,
            max=86_400,
            envvar="GPUFLEET_SIM_BURNIN_MAX_SECONDS",
            help="and at most this many seconds (default 0.5)",
        ),
    ] = None,
    shared_mount: Annotated[
        list[str] | None,
        typer.Option(
            "--shared-mount",
            metavar="PATH",
            help="a shared NFS mount every node has and requires, checked every checks_interval_s; "
            "`sim fault NODE --kind mount-hang` hangs it (repeat)",
        ),
    ] = None,
) -> None:
    """Run N simulated GPU nodes: real agent code over a simulated NVML."""
    if ctx.invoked_subcommand is not None:  # fault/heal talk to the head; `sim --server` names it too
        if server is not None:
            state(ctx).overrides["server"] = server
        return
    settings = state(ctx).settings(server=server)
    logs.configure(settings.log_level)
    from gpufleet.agent.trust import head_context
    from gpufleet.core.tls import split_join_token
    from gpufleet.sim.jobs import BURNIN_MAX_S, BURNIN_TIME_SCALE
    from gpufleet.sim.runner import SimOptions, Simulation, default_state_dir, parse_fault

    faults = [parse_fault(spec) for spec in fault or []]  # a typo fails before the head is reached
    state_dir = state_dir or default_state_dir()
    secret, pin = split_join_token(join_token) if join_token else (None, None)
    context = asyncio.run(head_context(settings.server, pin, state_dir, settings.ca_file, settings.insecure_http))
    simulation = Simulation(
        SimOptions(
            server=settings.server,
            join_token=secret,
            tls_context=context,
            nodes=nodes,
            gpus_per_node=gpus_per_node,
            gpu_model=gpu_model,
            driver_version=driver_version,
            state_dir=state_dir,
            cache_limit_bytes=int(settings.artifact_cache_gb * 1e9),
            prefix=prefix,
            heartbeat_interval_s=heartbeat_interval,
            metrics_interval_s=settings.metrics_interval_s,
            software=software,
            faults=faults,
            burnin_time_scale=BURNIN_TIME_SCALE if burnin_time_scale is None else burnin_time_scale,
            burnin_max_s=BURNIN_MAX_S if burnin_max_seconds is None else burnin_max_seconds,
            shared_mounts=_shared_mounts(shared_mount or []),
            storage_probe_timeout_s=settings.storage_probe_timeout_s,
            checks_interval_s=settings.checks_interval_s if shared_mount else None,
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
