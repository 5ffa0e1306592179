"""gpufleet template list|show: the job templates the head offers (built in, and the admins' own in
`job_templates_dir`). `gpufleet job submit --template NAME --set KEY=VALUE` submits one."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from gpufleet.cli.output import Format, OutputOpt, print_json, table
from gpufleet.cli.state import state

app = typer.Typer(help="Job templates: parameterised jobs for the common workloads.", no_args_is_help=True)


@app.command("list")
def list_(ctx: typer.Context, output: Format = OutputOpt) -> None:
    """Templates, and the admins' template files that could not be read."""
    found = state(ctx).client().list_templates()
    if output is Format.json:
        print_json(found)
        return
    rows = [t | {"param_names": ", ".join(_param(p) for p in t["params"])} for t in found["templates"]]
    columns = [("name", "Template"), ("origin", "From"), ("description", "What"), ("param_names", "Params")]
    table(rows, columns, title=f"{len(rows)} template(s)")
    for problem in found["problems"]:
        typer.echo(f"not loaded: {problem}", err=True)


def _param(param: dict[str, Any]) -> str:
    return str(param["name"]) + ("" if param["required"] else "?")


@app.command("show")
def show(
    ctx: typer.Context, name: Annotated[str, typer.Argument(help="e.g. torchrun-ddp")], output: Format = OutputOpt
) -> None:
    """One template: its params (required ones have no default) and the job it gives."""
    found = state(ctx).client().show_template(name)
    if output is Format.json:
        print_json(found)
        return
    typer.echo(f"template {found['name']} ({found['origin']}): {found['description']}")
    rows = [p | {"default": "(required)" if p["required"] else p["default"], "kind": _kind(p)} for p in found["params"]]
    table(
        rows, [("name", "Param"), ("kind", "Type"), ("default", "Default"), ("help", "Help")], title="--set NAME=VALUE"
    )
    typer.echo(
        f"gpufleet job submit --template {found['name']}"
        + "".join(f" --set {p['name']}=..." for p in found["params"] if p["required"])
    )


def _kind(param: dict[str, Any]) -> str:
    if param["choices"]:
        return " | ".join(param["choices"])
    if param["min"] is not None or param["max"] is not None:
        low = "" if param["min"] is None else str(param["min"])
        high = "" if param["max"] is None else str(param["max"])
        return f"{param['type']} {low}..{high}"
    return str(param["type"])
