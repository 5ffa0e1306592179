"""gpufleet task: slow actions over many nodes (bulk power, image sync, Ansible runs) and following them."""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from gpufleet.cli.output import Format, OutputOpt, fields, print_json, table
from gpufleet.cli.state import state
from gpufleet.client import HeadClient

app = typer.Typer(help="Slow actions over many nodes, recorded with each node's result.", no_args_is_help=True)

FINISHED = frozenset({"succeeded", "failed", "interrupted"})
POLL_S = 0.5


@app.command("list")
def list_(
    ctx: typer.Context,
    kind: Annotated[str | None, typer.Option(help="e.g. power.on, or power. for every power task")] = None,
    limit: Annotated[int, typer.Option(min=1, max=500)] = 50,
    output: Format = OutputOpt,
) -> None:
    """The newest tasks first."""
    rows = state(ctx).client().list_tasks(kind, limit)
    if output is Format.json:
        print_json(rows)
        return
    for row in rows:
        row["progress"] = f"{row['done']}/{row['total']}"
    table(
        rows,
        [
            ("id", "Id"),
            ("kind", "Kind"),
            ("state", "State"),
            ("progress", "Done"),
            ("failed", "Failed"),
            ("created_by", "By"),
            ("created_at", "Created"),
            ("summary", "Summary"),
        ],
    )


@app.command("show")
def show(ctx: typer.Context, task_id: int, output: Format = OutputOpt) -> None:
    """One task and each target's result."""
    task = state(ctx).client().get_task(task_id)
    if output is Format.json:
        print_json(task)
        return
    _print(task)


@app.command("wait")
def wait(ctx: typer.Context, task_id: int, output: Format = OutputOpt) -> None:
    """Follow a task until it ends; exit 1 if it failed."""
    client = state(ctx).client()
    follow(client, client.get_task(task_id), output)


def follow(client: HeadClient, task: dict[str, Any], output: Format) -> None:
    """Show a task's progress until it ends, then its per-target results. Exits 1 unless it succeeded."""
    if task["state"] not in FINISHED:
        console = Console(stderr=True)
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[failed]} failed"),
            TimeElapsedColumn(),
            console=console,
            transient=True,
            disable=output is Format.json or not console.is_terminal,
        ) as progress:
            bar = progress.add_task(f"task {task['id']} {task['kind']}", total=task["total"] or None, failed=0)
            while task["state"] not in FINISHED:
                time.sleep(POLL_S)
                task = client.get_task(task["id"])
                progress.update(bar, completed=task["done"], failed=task["failed"])
    if output is Format.json:
        print_json(task)
    else:
        _print(task)
    if task["state"] != "succeeded":
        raise typer.Exit(1)


def _print(task: dict[str, Any]) -> None:
    fields(
        task,
        [
            ("id", "Task"),
            ("kind", "Kind"),
            ("state", "State"),
            ("summary", "Summary"),
            ("created_by", "By"),
            ("created_at", "Created"),
            ("finished_at", "Finished"),
        ],
    )
    table(task["targets"], [("target", "Target"), ("state", "Result"), ("detail", "Detail")])
