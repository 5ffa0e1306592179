"""gpufleet project create|list|show|add-member|remove-member|set-quota"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from gpufleet.cli.output import Format, OutputOpt, fields, print_json, table
from gpufleet.cli.state import state
from gpufleet.core.errors import InvalidInput

app = typer.Typer(help="Projects: who shares GPUs, and how many they may use.", no_args_is_help=True)
FIELDS = [
    ("name", "Project"),
    ("description", "Description"),
    ("members", "Members"),
    ("max_gpus", "Max GPUs"),
    ("gpu_hours_budget", "GPU-hour budget"),
    ("budget_period", "Per"),
    ("created_at", "Created"),
]


def _show(project: dict[str, Any], output: Format) -> None:
    if output is Format.json:
        print_json(project)
    else:
        fields(project | {"members": ", ".join(project["members"]) or "-"}, FIELDS)


def _limit(text: str | None) -> float | None:
    """'none' or 'unlimited' lifts a quota; a number sets it."""
    if text is None or text.lower() in {"none", "unlimited"}:
        return None
    try:
        return float(text)
    except ValueError:
        raise InvalidInput(f"invalid quota {text!r}: a number, or 'none'") from None


@app.command("create")
def create(
    ctx: typer.Context, name: str, description: Annotated[str, typer.Option()] = "", output: Format = OutputOpt
) -> None:
    """Create a project."""
    _show(state(ctx).client().create_project(name, description), output)


@app.command("list")
def list_(ctx: typer.Context, output: Format = OutputOpt) -> None:
    """List projects with their quotas."""
    projects = state(ctx).client().list_projects()
    if output is Format.json:
        print_json(projects)
        return
    rows = [p | {"members": len(p["members"])} for p in projects]
    table(rows, [f for f in FIELDS if f[0] != "created_at"], title=f"{len(projects)} projects")


@app.command("show")
def show(ctx: typer.Context, name: str, output: Format = OutputOpt) -> None:
    """Show one project."""
    _show(state(ctx).client().show_project(name), output)


@app.command("add-member")
def add_member(ctx: typer.Context, name: str, user: str, output: Format = OutputOpt) -> None:
    """Add a user to a project."""
    _show(state(ctx).client().add_project_member(name, user), output)


@app.command("remove-member")
def remove_member(ctx: typer.Context, name: str, user: str, output: Format = OutputOpt) -> None:
    """Remove a user from a project."""
    _show(state(ctx).client().remove_project_member(name, user), output)


@app.command("set-quota")
def set_quota(
    ctx: typer.Context,
    name: str,
    max_gpus: Annotated[str | None, typer.Option(help="GPUs in use at once, or 'none'")] = None,
    gpu_hours: Annotated[str | None, typer.Option(help="GPU-hours per period, or 'none'")] = None,
    period: Annotated[str | None, typer.Option(help="week, month or quarter")] = None,
    output: Format = OutputOpt,
) -> None:
    """Set a project's quotas (what is not given stays as it is); the scheduler enforces them."""
    client = state(ctx).client()
    current = client.show_project(name)
    gpus = _limit(max_gpus) if max_gpus is not None else current["max_gpus"]
    if gpus is not None and gpus != int(gpus):
        raise InvalidInput("max GPUs must be a whole number")
    quota = {
        "max_gpus": int(gpus) if gpus is not None else None,
        "gpu_hours_budget": _limit(gpu_hours) if gpu_hours is not None else current["gpu_hours_budget"],
        "budget_period": period,
    }
    _show(client.set_project_quota(name, quota), output)
