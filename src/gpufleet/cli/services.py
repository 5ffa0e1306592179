"""gpufleet service create|list|show|scale|update|delete|logs: inference services, long-running model
servers kept at their replica count and called through the head at /services/NAME/...

A replica is a job: `create` takes `job submit`'s resource options (GPUs, CPUs, memory, environment,
model) and the command after `--`. The command must listen on $GPUFLEET_SERVICE_PORT and answer its
health path with 200 once it can serve.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from gpufleet.cli.jobs import parse_mem, parse_pairs, parse_time, read_script
from gpufleet.cli.output import Format, OutputOpt, fields, print_json, table
from gpufleet.cli.state import state
from gpufleet.core.errors import InvalidInput

app = typer.Typer(help="Inference services: model servers with replicas, health checks and rolling updates.")
Name = Annotated[str, typer.Argument(help="the service's name")]


def _stat(row: dict[str, Any], key: str, unit: str = "") -> str:
    value = row.get("stats", {}).get(key)
    return "" if value is None else f"{value}{unit}"


@app.command(
    "create", context_settings={"allow_extra_args": True, "ignore_unknown_options": True}, no_args_is_help=True
)
def create(
    ctx: typer.Context,
    name: Name,
    replicas: Annotated[int, typer.Option(min=1, help="replicas to keep running")] = 1,
    project: Annotated[str | None, typer.Option(help="project to charge (default: your only one)")] = None,
    user: Annotated[str | None, typer.Option(help="run as this user (job admins only)")] = None,
    gpus_per_node: Annotated[int, typer.Option("--gpus", min=0, help="GPUs per replica")] = 1,
    cpus: Annotated[int, typer.Option(min=0, help="CPUs per replica (0: no limit)")] = 0,
    mem: Annotated[str | None, typer.Option(help="memory per replica, e.g. 16G")] = None,
    environment: Annotated[str | None, typer.Option("--env", help="runtime environment NAME[:VERSION]")] = None,
    model: Annotated[str | None, typer.Option(help="registered model NAME[:VERSION]: $GPUFLEET_MODEL_PATH")] = None,
    container: Annotated[str | None, typer.Option(help="container image to run in")] = None,
    export: Annotated[list[str] | None, typer.Option("--export", help="variable NAME=VALUE, repeatable")] = None,
    category: Annotated[str | None, typer.Option(help="run only on nodes of this category")] = None,
    health_path: Annotated[str, typer.Option(help="the path that answers 200 once a replica can serve")] = "/health",
    startup: Annotated[str, typer.Option(help="how long a new replica may take to become healthy")] = "10m",
    time_limit: Annotated[
        str | None,
        typer.Option("--time", help="each replica's time limit (default: the cluster's longest); it is then replaced"),
    ] = None,
    script: Annotated[Path | None, typer.Option(help="a script file to run with /bin/sh")] = None,
    output: Format = OutputOpt,
) -> None:
    """Create a service: gpufleet service create NAME [OPTIONS] -- COMMAND [ARGS]..."""
    argv = list(ctx.args)
    if argv and argv[0].startswith("-"):
        raise InvalidInput(f"unknown option {argv[0]}; put the command after --")
    replica: dict[str, Any] = {
        "project": project,
        "user": user,
        "gpus_per_node": gpus_per_node,
        "cpus_per_node": cpus,
        "mem_per_node_mib": parse_mem(mem) if mem else 0,
        "time_limit_s": parse_time(time_limit) if time_limit else None,
        "argv": argv,
        "script": read_script(script) if script else None,
        "env": parse_pairs(export or []),
        "container": container,
        "category": category,
        "environment": environment,
        "model": model,
    }
    body = {
        "name": name,
        "replicas": replicas,
        "health_path": health_path,
        "startup_s": parse_time(startup),
        "replica": replica,
    }
    client = state(ctx).client()
    found = client.create_service(body)
    if output is Format.json:
        print_json(found)
    else:
        typer.echo(f"created service {found['name']}: {found['replicas']} replica(s), at {found['endpoint']}")


@app.command("list")
def list_(ctx: typer.Context, output: Format = OutputOpt) -> None:
    """Every service: replicas ready of wanted, revision, restarts, and calls through this head."""
    rows = state(ctx).client().list_services()
    if output is Format.json:
        print_json(rows)
        return
    shown = [
        r
        | {
            "ready_of": f"{r['ready']}/{r['replicas']}",
            "rate": _stat(r, "requests_per_s", "/s"),
            "p50": _stat(r, "p50_ms", " ms"),
        }
        for r in rows
    ]
    columns = [("name", "Service"), ("project", "Project"), ("model", "Model"), ("ready_of", "Ready")]
    columns += [("revision", "Rev"), ("restarts", "Restarts"), ("rate", "Requests"), ("p50", "p50"), ("endpoint", "At")]
    table(shown, columns, title=f"{len(rows)} service(s)")


@app.command("show")
def show(ctx: typer.Context, name: Name, output: Format = OutputOpt) -> None:
    """One service and its replicas."""
    found = state(ctx).client().show_service(name)
    if output is Format.json:
        print_json(found)
        return
    shown = found | {
        "ready_of": f"{found['ready']} of {found['replicas']}",
        "rate": _stat(found, "requests_per_s", "/s"),
        "latency": f"p50 {_stat(found, 'p50_ms', ' ms')}, p99 {_stat(found, 'p99_ms', ' ms')}",
    }
    keys = [("name", "service"), ("endpoint", "at"), ("project", "project"), ("user", "runs as")]
    keys += [("model", "model"), ("environment", "environment"), ("ready_of", "ready"), ("revision", "revision")]
    keys += [("restarts", "restarts"), ("rate", "requests"), ("latency", "latency"), ("message", "problem")]
    fields(shown, keys)
    replicas = found["replica_list"]
    columns = [("job_id", "Job"), ("revision", "Rev"), ("state", "State"), ("node", "Node"), ("address", "Address")]
    columns += [("healthy", "Healthy"), ("failures", "Failed checks")]
    table(replicas, columns, title=f"{len(replicas)} replica(s)")


@app.command("scale")
def scale(
    ctx: typer.Context, name: Name, replicas: Annotated[int, typer.Argument(min=0, help="replicas to keep")]
) -> None:
    """Set the replica count (0 pauses the service)."""
    found = state(ctx).client().scale_service(name, replicas)
    typer.echo(f"service {found['name']}: {found['replicas']} replica(s) wanted, {found['ready']} ready")


@app.command("update")
def update(
    ctx: typer.Context,
    name: Name,
    model: Annotated[str | None, typer.Option(help="the new model NAME[:VERSION]")] = None,
    environment: Annotated[str | None, typer.Option("--env", help="the new runtime environment")] = None,
    export: Annotated[list[str] | None, typer.Option("--export", help="replace the variables: NAME=VALUE")] = None,
) -> None:
    """Roll the replicas to a new revision, one at a time (an old one stops once a new one is healthy)."""
    change: dict[str, Any] = {"model": model, "environment": environment}
    if export:
        change["env"] = parse_pairs(export)
    if not any(change.values()):
        raise InvalidInput("nothing to change: give --model, --env or --export")
    found = state(ctx).client().update_service(name, change)
    typer.echo(f"service {found['name']}: rolling to revision {found['revision']}")


@app.command("delete")
def delete(ctx: typer.Context, name: Name) -> None:
    """Stop every replica and remove the service."""
    state(ctx).client().delete_service(name)
    typer.echo(f"deleted service {name}")


@app.command("logs")
def logs(ctx: typer.Context, name: Name) -> None:
    """Each live replica's output so far (follow one with gpufleet job output JOB --follow)."""
    pages = state(ctx).client().service_logs(name)
    for job_id, page in pages.items():
        typer.echo(f"==> replica job {job_id} <==")
        for chunk in page["chunks"]:
            typer.echo(chunk["data"], nl=False, err=chunk["stream"] == "stderr")
