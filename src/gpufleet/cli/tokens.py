"""gpufleet token create|list"""

from __future__ import annotations

from typing import Annotated

import typer

from gpufleet.cli.output import Format, OutputOpt, print_json, table
from gpufleet.cli.state import state
from gpufleet.core.durations import parse_duration

app = typer.Typer(help="Tokens: join tokens for new nodes, API tokens for users.", no_args_is_help=True)


@app.command("create")
def create(
    ctx: typer.Context,
    expires: Annotated[str | None, typer.Option(help="lifetime, e.g. 30m, 1h, 30d (join: 1h, user: 30d)")] = None,
    uses: Annotated[int, typer.Option(min=1, help="join token: how many nodes may join with it")] = 1,
    user: Annotated[str | None, typer.Option(help="create an API token for this user instead of a join token")] = None,
    scope: Annotated[str, typer.Option(help="user token: read or write")] = "write",
    output: Format = OutputOpt,
) -> None:
    """Create a node join token, or with --user an API token acting as that user."""
    client = state(ctx).client()
    if user is not None:
        created = client.create_user_token(user, parse_duration(expires or "30d"), scope)
        summary = f"token {created['id']} for user {user}, scope {created['scope']}, expires {created['expires_at']}"
    else:
        created = client.create_join_token(parse_duration(expires or "1h"), uses)
        summary = f"expires {created['expires_at']}; may join {created['uses']} node(s)"
    if output is Format.json:
        print_json(created)
        return
    typer.echo(created["token"])
    typer.echo(summary, err=True)


@app.command("revoke")
def revoke(ctx: typer.Context, token_id: Annotated[int, typer.Argument(help="the id from `token list`")]) -> None:
    """Revoke an API or join token: it stops working at once."""
    state(ctx).client().revoke_token(token_id)
    typer.echo(f"revoked token {token_id}")


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
