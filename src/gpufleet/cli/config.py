"""gpufleet config show, gpufleet login"""

from __future__ import annotations

import os
from typing import Annotated

import typer

from gpufleet.cli.output import Format, OutputOpt, print_json, table
from gpufleet.cli.sso_device import DeviceLoginError, device_login
from gpufleet.cli.state import CliState, state
from gpufleet.core.config import default_client_file, write_client_file
from gpufleet.core.durations import parse_duration
from gpufleet.core.errors import Unauthorized

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
    user: Annotated[
        str | None, typer.Option("--user", "-u", help="log in with this user's password instead of a token")
    ] = None,
    sso: Annotated[bool, typer.Option("--sso", help="sign in through the site's single sign-on (device code)")] = False,
    expires: Annotated[str, typer.Option(help="with --user or --sso: how long the new token lasts")] = "30d",
) -> None:
    """Check a server URL and token (or a user's password), then save them for later commands (mode 0600).

    With --user, the password (prompted, or GPUFLEET_PASSWORD) is traded for a new API token of that
    user; the password itself is never saved. With --sso, you sign in at the single sign-on provider in a
    browser anywhere (the command shows where and the code to enter), and the head trades the proof for a
    new API token of yours.
    """
    cli = state(ctx)
    settings = cli.settings(server=server)
    if sso:
        secret = _sso_token(cli, parse_duration(expires))
    elif user is not None:
        password = os.environ.get("GPUFLEET_PASSWORD") or typer.prompt(f"password for {user}", hide_input=True)
        anonymous = cli.client(anonymous=True)
        try:
            secret = anonymous.password_login(user, password, parse_duration(expires))["token"]
        finally:
            anonymous.close()
    else:
        # Only a token given now (option, GPUFLEET_TOKEN or the root --token) is sent: a token saved by an
        # earlier login belongs to that login's server and must never be presented to another one.
        secret = token or cli.overrides.get("token") or typer.prompt("API token", hide_input=True)
    client = cli.client(secret)
    try:
        who = client.whoami()
    finally:
        client.close()
    path = default_client_file()
    write_client_file(path, settings.server, secret)
    as_whom = f"user {who['user']}" if who.get("user") else f"{who['kind']} token {who['token_id']}"
    typer.echo(f"logged in to {settings.server} as {as_whom}; saved to {path}")


def _sso_token(cli: CliState, expires_in_s: int) -> str:
    """A new API token for whoever signs in at the head's single sign-on provider (the device grant)."""
    anonymous = cli.client(anonymous=True)
    try:
        info = anonymous.sso_info()

        def show(uri: str, code: str, complete: str | None) -> None:
            where = f"Open {complete} in a browser and sign in" if complete else f"Open {uri}, sign in, enter {code}"
            typer.echo(where)
            typer.echo("waiting for the sign-in...", err=True)

        try:
            tokens = device_login(info["issuer"], info["client_id"], show, scopes=tuple(info["scopes"]))
        except DeviceLoginError as exc:
            raise Unauthorized(f"single sign-on: {exc}") from exc
        secret: str = anonymous.sso_login(tokens["id_token"], expires_in_s)["token"]
        return secret
    finally:
        anonymous.close()
