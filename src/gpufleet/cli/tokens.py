"""gpufleet token create|list"""

from __future__ import annotations

from typing import Annotated

import typer

from gpufleet.cli.output import Format, OutputOpt, print_json, table
from gpufleet.cli.state import state
from gpufleet.core.durations import parse_duration

app = typer.Typer(help="Tokens: join tokens for new nodes.", no_args_is_help=True)


@app.command("create")
def create(
    ctx: typer.Context,
    expires: Annotated[str, typer.Option(help="lifetime, e.g. 30m, 1h, 7d")] = "1h",
    uses: Annotated[int, typer.Option(min=1, help="how many nodes may join with it")] = 1,
    output: Format = OutputOpt,
) -> None:
    """Create a node join token. Agents trade it for their own credential on first start."""
    created = state(ctx).client().create_join_token(parse_duration(expires), uses)
    if output is Format.json:
        print_json({"token": created["token"], "expires_at": created["expires_at"], "uses": created["uses"]})
        return
    typer.echo(created["token"])
    typer.echo(f"expires {created['expires_at']}; may join {created['uses']} node(s)", err=True)


@app.command("list")
def list_(ctx: typer.Context, output: Format = OutputOpt) -> None:
    """List admin and join tokens (never their secrets)."""
    tokens = state(ctx).client().list_tokens()
    if output is Format.json:
        print_json(tokens)
        return
    table(
        tokens,
        [
            ("id", "ID"),
            ("kind", "Kind"),
            ("name", "Name"),
            ("created_at", "Created"),
            ("expires_at", "Expires"),
            ("uses", "Uses"),
            ("max_uses", "Max uses"),
            ("revoked", "Revoked"),
            ("last_used_at", "Last used"),
        ],
    )
