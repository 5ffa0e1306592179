"""gpufleet audit list"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated

import typer

from gpufleet.cli.output import Format, OutputOpt, print_json, table
from gpufleet.cli.state import state
from gpufleet.core.durations import parse_duration

app = typer.Typer(help="Audit log: who did what, when, from where.", no_args_is_help=True)


@app.command("list")
def list_(
    ctx: typer.Context,
    since: Annotated[str | None, typer.Option(help="how far back, e.g. 1h, 7d")] = None,
    actor: Annotated[str | None, typer.Option(help="only this actor, e.g. token:bootstrap#1, node:gpu001")] = None,
    limit: Annotated[int, typer.Option(min=1, max=10_000)] = 1000,
    output: Format = OutputOpt,
) -> None:
    """List audit records, newest first."""
    start = datetime.now(UTC) - timedelta(seconds=parse_duration(since)) if since else None
    records = state(ctx).client().list_audit(start, actor, limit)
    if output is Format.json:
        print_json(records)
        return
    table(
        records,
        [
            ("at", "At"),
            ("actor", "Actor"),
            ("action", "Action"),
            ("target", "Target"),
            ("source", "From"),
            ("result", "Result"),
        ],
        title=f"{len(records)} audit records",
    )
