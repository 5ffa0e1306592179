"""gpufleet slurm accounts sync [--dry-run]: gpufleet's projects as Slurm accounts (needs slurmdbd)."""

from __future__ import annotations

import shlex
from typing import Annotated, Any

import typer

from gpufleet.cli.output import Format, OutputOpt, print_json
from gpufleet.cli.state import state
from gpufleet.client import HeadClient

app = typer.Typer(help="Slurm accounts: projects, members and GPU quotas in slurmdbd.", no_args_is_help=True)
SYNC_PATH = "/api/v1/slurm/accounts/sync"


@app.callback()
def accounts() -> None:
    """Slurm accounts: projects, members and GPU quotas in slurmdbd."""
    # A callback keeps `sync` a subcommand: a Typer app with one command would otherwise become that command.


def request_sync(client: HeadClient, dry_run: bool) -> dict[str, Any]:
    return client.sync_slurm_accounts(dry_run)


def render(result: dict[str, Any]) -> None:
    """The plan (or what was done): one command a line, whole, so it can be copied and run by hand; then
    what was left alone and what keeps quotas from working."""
    steps = result["steps"]
    verb = "would run" if result["dry_run"] else "ran"
    if steps:
        typer.echo(f"Slurm cluster {result['cluster']}: {verb} {len(steps)} sacctmgr commands")
    else:
        typer.echo(f"Slurm cluster {result['cluster']}: accounts already match gpufleet's projects")
    for step in steps:
        typer.echo(f"{step['status']:<9} {shlex.join(step['argv'])}")
        typer.echo(f"          # {step['why']}")
        if step["error"]:
            typer.echo(f"          ! {step['error']}")
    for note in result["notes"]:
        typer.echo(f"left alone: {note}")
    for warning in result["warnings"]:
        typer.echo(f"warning: {warning}")


@app.command("sync")
def sync(
    ctx: typer.Context,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print the sacctmgr commands, run none")] = False,
    output: Format = OutputOpt,
) -> None:
    """Make Slurm's accounts match gpufleet's projects: an account per project, an association per member,
    GrpTRES=gres/gpu=N per GPU quota. Accounts gpufleet did not make are left alone."""
    result = request_sync(state(ctx).client(), dry_run)
    if output is Format.json:
        print_json(result)
    else:
        render(result)
    if result["failed"]:
        raise typer.Exit(1)
