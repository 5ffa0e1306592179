"""gpufleet env list|show|add|remove|check: the runtime environments jobs run in (`job submit --env NAME`),
and which nodes' NVIDIA drivers can run each."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from gpufleet.cli.output import Format, OutputOpt, print_json, table
from gpufleet.cli.state import state
from gpufleet.core.errors import InvalidInput

app = typer.Typer(
    help="Runtime environments: container images or Python environments with the CUDA and frameworks they carry.",
    no_args_is_help=True,
)
Ref = Annotated[str, typer.Argument(help="NAME[:VERSION] (no version: the one added last)", metavar="NAME[:VERSION]")]


def _runtime(env: dict[str, Any]) -> str:
    return str(env["image"] or f"python {env['python_prefix']}")


def _frameworks(env: dict[str, Any]) -> str:
    parts = [f"CUDA {env['cuda']}" if env["cuda"] else "CPU only"]
    parts += [f"{label} {env[key]}" for key, label in (("pytorch", "PyTorch"), ("cudnn", "cuDNN"), ("nccl", "NCCL"))]
    return ", ".join(p for p in parts if not p.endswith(" None"))


@app.command("list")
def list_(ctx: typer.Context, output: Format = OutputOpt) -> None:
    """Environments, what they carry, the driver they need and how many nodes can run them."""
    rows = state(ctx).client().list_environments()
    if output is Format.json:
        print_json(rows)
        return
    shown = [row | {"runtime": _runtime(row), "frameworks": _frameworks(row)} for row in rows]
    columns = [("ref", "Environment"), ("runtime", "Runs in"), ("frameworks", "Carries")]
    columns += [("min_driver", "Needs driver"), ("compatible_nodes", "Nodes")]
    table(shown, columns, title=f"{len(rows)} environment(s)")


@app.command("show")
def show(ctx: typer.Context, ref: Ref, output: Format = OutputOpt) -> None:
    """One environment."""
    env = state(ctx).client().show_environment(ref)
    if output is Format.json:
        print_json(env)
        return
    source = "given" if env["driver_given"] else f"what CUDA {env['cuda']} needs"
    typer.echo(f"environment {env['ref']}: {_runtime(env)}")
    typer.echo(f"carries: {_frameworks(env)}")
    nodes = env["compatible_nodes"]
    if env["min_driver"] is None:
        typer.echo(f"needs no NVIDIA driver; {nodes} node(s) take jobs")
    else:
        typer.echo(f"needs NVIDIA driver {env['min_driver']} or newer ({source}); {nodes} node(s) have it")
    if env["description"]:
        typer.echo(env["description"])


@app.command("add")
def add(
    ctx: typer.Context,
    ref: Annotated[str, typer.Argument(help="NAME:VERSION, e.g. pytorch:24.05", metavar="NAME:VERSION")],
    cuda: Annotated[str | None, typer.Option(help="the CUDA runtime it carries, e.g. 12.4 (none: CPU only)")] = None,
    image: Annotated[str | None, typer.Option(help="container image reference")] = None,
    python: Annotated[str | None, typer.Option(help="prefix of a venv or conda environment on the nodes")] = None,
    pytorch: Annotated[str | None, typer.Option(help="PyTorch version it carries")] = None,
    cudnn: Annotated[str | None, typer.Option(help="cuDNN version")] = None,
    nccl: Annotated[str | None, typer.Option(help="NCCL version")] = None,
    min_driver: Annotated[
        str | None, typer.Option(help="the NVIDIA driver it needs (default: its CUDA version's, from NVIDIA's table)")
    ] = None,
    description: Annotated[str, typer.Option(help="what it is for")] = "",
    output: Format = OutputOpt,
) -> None:
    """Add an environment: a container image (--image) or a Python environment on the nodes (--python)."""
    name, _, version = ref.partition(":")
    if not version:
        raise InvalidInput(f"give the version too, NAME:VERSION, e.g. {name or 'pytorch'}:24.05")
    body = {
        "name": name,
        "version": version,
        "image": image,
        "python_prefix": python,
        "cuda": cuda,
        "pytorch": pytorch,
        "cudnn": cudnn,
        "nccl": nccl,
        "min_driver": min_driver,
        "description": description,
    }
    env = state(ctx).client().add_environment(body)
    if output is Format.json:
        print_json(env)
    else:
        nodes = env["compatible_nodes"]
        needs = f"needs driver {env['min_driver']}" if env["min_driver"] else "CPU only, needs no driver"
        typer.echo(f"added environment {env['ref']}: {needs}, {nodes} node(s) can run it")


@app.command("remove")
def remove(ctx: typer.Context, ref: Annotated[str, typer.Argument(metavar="NAME:VERSION")]) -> None:
    """Remove one version of an environment. Queued jobs keep what they were given."""
    state(ctx).client().remove_environment(ref)
    typer.echo(f"removed environment {ref}")


@app.command("check")
def check(ctx: typer.Context, ref: Ref, output: Format = OutputOpt) -> None:
    """Which nodes can run jobs in the environment, and why the others cannot. Exit 1 if none can."""
    found = state(ctx).client().check_environment(ref)
    if output is Format.json:
        print_json(found)
    else:
        env = found["environment"]
        rows = [fit | {"can": _can(fit)} for fit in found["nodes"]]
        needs = f"needs NVIDIA driver {env['min_driver']}" if env["min_driver"] else "needs no NVIDIA driver"
        title = f"{env['ref']} {needs}: {env['compatible_nodes']} of {len(rows)} can"
        table(rows, [("node", "Node"), ("driver", "Driver"), ("can", "Can run"), ("reason", "Why")], title=title)
    if not any(fit["ok"] and fit["takes_jobs"] for fit in found["nodes"]):
        raise typer.Exit(1)


def _can(fit: dict[str, Any]) -> str:
    if not fit["ok"]:
        return "no"
    return "yes" if fit["takes_jobs"] else "not now"
