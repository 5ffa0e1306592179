"""gpufleet switch: switches polled over SNMP, their ports and the nodes behind them.

A community or v3 key is never a plain argument (it would sit in the shell's history and in `ps` for every
user to read): `switch add` reads each from a named environment variable, or the community from standard
input.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated, Any

import typer

from gpufleet.cli.output import Format, OutputOpt, fields, print_json, table
from gpufleet.cli.state import state
from gpufleet.core.errors import InvalidInput

switch_app = typer.Typer(help="Switches polled over SNMP: ports, errors, and which node is behind which port.")

SWITCH_FIELDS = [
    ("name", "Name"),
    ("address", "Address"),
    ("port", "UDP port"),
    ("version", "SNMP"),
    ("v3_user", "v3 user"),
    ("sys_name", "sysName"),
    ("sys_descr", "Description"),
    ("uptime_s", "Up (s)"),
    ("ports_up", "Ports up"),
    ("ports_total", "Ports"),
    ("nodes", "Nodes behind"),
    ("expected_speed_mbps", "Expected speed (Mb/s)"),
    ("polled_at", "Polled at"),
    ("last_error", "Last error"),
]


def _from_env(env: str | None, what: str) -> str | None:
    if env is None:
        return None
    value = os.environ.get(env)
    if not value:
        raise InvalidInput(f"the environment variable {env} ({what}) is not set or empty")
    return value


def _community(from_stdin: bool, env: str | None) -> str | None:
    if from_stdin and env is not None:
        raise InvalidInput("give the community with one of --community-stdin and --community-env VAR")
    if from_stdin:
        value = sys.stdin.readline().rstrip("\r\n")
        if not value:
            raise InvalidInput("no community on standard input")
        return value
    return _from_env(env, "the community")


@switch_app.command("add")
def add(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="gpufleet's name for the switch, e.g. leaf01")],
    address: Annotated[str, typer.Argument(help="the switch's SNMP agent: host name or address")],
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="UDP port")] = 161,
    version: Annotated[str, typer.Option("--version", help="2c or 3")] = "2c",
    community_stdin: Annotated[bool, typer.Option("--community-stdin", help="v2c: read it from stdin")] = False,
    community_env: Annotated[str | None, typer.Option("--community-env", help="v2c: from this variable")] = None,
    user: Annotated[str | None, typer.Option("--v3-user", help="v3: the user")] = None,
    auth: Annotated[str | None, typer.Option("--auth", help="v3: md5, sha, sha256 or sha512")] = None,
    auth_key_env: Annotated[str | None, typer.Option("--auth-key-env", help="v3: the auth key's variable")] = None,
    priv: Annotated[str | None, typer.Option("--priv", help="v3: des, aes or aes256")] = None,
    priv_key_env: Annotated[str | None, typer.Option("--priv-key-env", help="v3: the privacy key's variable")] = None,
    expected_speed: Annotated[
        int | None, typer.Option("--expected-speed", min=1, help="Mb/s a port with a node behind it should run at")
    ] = None,
    output: Format = OutputOpt,
) -> None:
    """Register a switch for the head to poll. Its community or keys are stored encrypted, never shown."""
    spec: dict[str, Any] = {
        "name": name,
        "address": address,
        "port": port,
        "version": version,
        "community": _community(community_stdin, community_env),
        "v3_user": user,
        "v3_auth_protocol": auth,
        "v3_auth_key": _from_env(auth_key_env, "the v3 auth key"),
        "v3_priv_protocol": priv,
        "v3_priv_key": _from_env(priv_key_env, "the v3 privacy key"),
        "expected_speed_mbps": expected_speed,
    }
    switch = state(ctx).client().add_switch({k: v for k, v in spec.items() if v is not None})
    if output is Format.json:
        print_json(switch)
    else:
        typer.echo(f"{switch['name']}: SNMP v{switch['version']} at {switch['address']}:{switch['port']}")


@switch_app.command("list")
def list_(ctx: typer.Context, output: Format = OutputOpt) -> None:
    """Every switch: its last poll, ports up, nodes behind it."""
    rows = state(ctx).client().list_switches()
    if output is Format.json:
        print_json(rows)
        return
    table(rows, [SWITCH_FIELDS[i] for i in (0, 1, 5, 8, 9, 10, 12, 13)])


def _rate(rates: dict[str, float], key: str, scale: float = 1.0) -> str:
    value = rates.get(key)
    return "" if value is None else f"{value / scale:.3g}"


@switch_app.command("show")
def show(ctx: typer.Context, name: Annotated[str, typer.Argument()], output: Format = OutputOpt) -> None:
    """One switch and every port: state, speed, traffic and errors per second, the node behind it."""
    switch = state(ctx).client().get_switch(name)
    if output is Format.json:
        print_json(switch)
        return
    fields(switch, SWITCH_FIELDS)
    rows = [
        {
            **p,
            "state": p["oper_status"] + ("" if p["admin_up"] else " (shut)"),
            "in": _rate(p["rates"], "in_bps", 1e6),
            "out": _rate(p["rates"], "out_bps", 1e6),
            "errors": _rate(p["rates"], "in_errors_per_s"),
            "behind": " ".join(x for x in (p["node"], p["node_interface"]) if x) or p["neighbor_system"] or "",
        }
        for p in switch["ports"]
    ]
    table(
        rows,
        [
            ("name", "Port"),
            ("state", "State"),
            ("speed_mbps", "Mb/s"),
            ("in", "In Mb/s"),
            ("out", "Out Mb/s"),
            ("errors", "In errors/s"),
            ("behind", "Behind"),
        ],
    )


@switch_app.command("remove")
def remove(ctx: typer.Context, name: Annotated[str, typer.Argument()], output: Format = OutputOpt) -> None:
    """Stop polling a switch and forget it and its secrets."""
    state(ctx).client().remove_switch(name)
    if output is Format.json:
        print_json({"switch": name, "removed": True})
    else:
        typer.echo(f"{name}: removed")
