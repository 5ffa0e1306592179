"""gpufleet config show, gpufleet login"""

from __future__ import annotations

from typing import Annotated

import typer

from gpufleet.cli.output import Format, OutputOpt, print_json, table
from gpufleet.cli.state import state
from gpufleet.client import HeadClient
from gpufleet.core.config import default_client_file, write_client_file

app = typer.Typer(help="Configuration.", no_args_is_help=True)


@app.command("show")
def show(ctx: typer.Context, output: Format = OutputOpt) -> None:
    """Print the effective configuration, secrets masked."""
    shown = state(ctx).settings().shown()
    if output is Format.json:
        print_json(shown)
        return
    table([{"key": k, "value": v} for k, v in shown.items()], [("key", "Setting"), ("value", "Value")])


def login(
    ctx: typer.Context,
    server: Annotated[str | None, typer.Option(help="head node URL")] = None,
    token: Annotated[str | None, typer.Option(help="API token", envvar="GPUFLEET_TOKEN")] = None,
) -> None:
    """Check a server URL and token, then save them for later commands (mode 0600)."""
    cli = state(ctx)
    settings = cli.settings(server=server)
    # Only a token given now (option, GPUFLEET_TOKEN or the root --token) is sent: a token saved by an
    # earlier login belongs to that login's server and must never be presented to another one.
    secret = token or cli.overrides.get("token") or typer.prompt("API token", hide_input=True)
    client = HeadClient(settings.server, secret)
    try:
        who = client.whoami()
    finally:
        client.close()
    path = default_client_file()
    write_client_file(path, settings.server, secret)
    typer.echo(f"logged in to {settings.server} as {who['kind']} token {who['token_id']}; saved to {path}")
