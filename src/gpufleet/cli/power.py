"""gpufleet power and gpufleet bmc: power nodes through their BMCs, and tell gpufleet how to reach them.

A BMC password is never a plain argument (it would sit in the shell's history and in `ps` for every
user to read): `bmc set` reads it from standard input or from a named environment variable.
"""

from __future__ import annotations

import getpass
import os
import sys
from typing import Annotated, Any

import typer

from gpufleet.cli.output import Format, OutputOpt, fields, print_json, table
from gpufleet.cli.state import state
from gpufleet.cli.tasks import follow
from gpufleet.core.errors import InvalidInput

power_app = typer.Typer(help="Power nodes on, off, cycle or reset them through their BMCs.", no_args_is_help=True)
bmc_app = typer.Typer(help="Nodes' BMCs (Redfish or IPMI); their passwords are kept encrypted.", no_args_is_help=True)

Nodes = Annotated[str, typer.Argument(help="node names or a hostlist, e.g. gpu[001-032]")]
Force = Annotated[bool, typer.Option("--force", help="also nodes that run jobs (off, cycle, reset)")]
Limit = Annotated[int | None, typer.Option("--limit", min=1, max=1024, help="BMCs at once (default: power_fanout)")]
Stagger = Annotated[
    float | None,
    typer.Option("--stagger", min=0, max=60, help="seconds between power-ons (default: power_stagger_s)"),
]
DryRun = Annotated[bool, typer.Option("--dry-run", help="print what would be sent to each BMC; do nothing")]


def _request(nodes: str, force: bool, limit: int | None, stagger: float | None) -> dict[str, Any]:
    return {"nodes": nodes, "force": force, "limit": limit, "stagger_s": stagger}


def _act(
    ctx: typer.Context,
    action: str,
    nodes: str,
    force: bool,
    limit: int | None,
    stagger: float | None,
    dry_run: bool,
    output: Format,
) -> None:
    client = state(ctx).client()
    request = _request(nodes, force, limit, stagger)
    if dry_run:
        plan = client.power_plan(action, request)
        if output is Format.json:
            print_json(plan)
            return
        at_once = f"{plan['limit']} at a time" + (
            f", power-ons {plan['stagger_s']:g} s apart" if plan["stagger_s"] else ""
        )
        typer.echo(f"would power {action} {plan['hostlist']} ({len(plan['nodes'])} nodes, {at_once}):")
        for step in plan["steps"]:
            typer.echo(f"  {step}")
        for node, jobs in plan["forced"].items():
            typer.echo(f"  {node} runs jobs {', '.join(map(str, jobs))}: --force takes them down")
        return
    follow(client, client.power_action(action, request), output)


@power_app.command("status")
def status(
    ctx: typer.Context,
    nodes: Annotated[str | None, typer.Argument(help="node names or a hostlist; with --cached, default all")] = None,
    cached: Annotated[bool, typer.Option("--cached", help="what the BMCs said last; ask none of them")] = False,
    limit: Limit = None,
    dry_run: DryRun = False,
    output: Format = OutputOpt,
) -> None:
    """Ask the nodes' BMCs for their power state, or show what they said last (--cached).

    Asking is a task with one result per node; each state read is kept for --cached and the dashboard.
    """
    if cached or nodes is None:
        if not cached:
            raise InvalidInput("name the nodes whose BMCs to ask, or use --cached")
        rows = state(ctx).client().power_states(nodes)
        if output is Format.json:
            print_json(rows)
            return
        table(
            rows,
            [
                ("node", "Node"),
                ("node_state", "State"),
                ("bmc", "BMC"),
                ("address", "Address"),
                ("power_state", "Power"),
                ("power_read_at", "Read at"),
                ("last_error", "Last error"),
            ],
        )
        return
    _act(ctx, "status", nodes, False, limit, None, dry_run, output)


@power_app.command("on")
def on(
    ctx: typer.Context,
    nodes: Nodes,
    limit: Limit = None,
    stagger: Stagger = None,
    dry_run: DryRun = False,
    output: Format = OutputOpt,
) -> None:
    """Power nodes on, a few at a time and spaced out (inrush); each node's result once it is on."""
    _act(ctx, "on", nodes, False, limit, stagger, dry_run, output)


@power_app.command("off")
def off(
    ctx: typer.Context,
    nodes: Nodes,
    force: Force = False,
    limit: Limit = None,
    dry_run: DryRun = False,
    output: Format = OutputOpt,
) -> None:
    """Power nodes off at once (no OS shutdown). Refused for nodes that run jobs unless --force."""
    _act(ctx, "off", nodes, force, limit, None, dry_run, output)


@power_app.command("cycle")
def cycle(
    ctx: typer.Context,
    nodes: Nodes,
    force: Force = False,
    limit: Limit = None,
    stagger: Stagger = None,
    dry_run: DryRun = False,
    output: Format = OutputOpt,
) -> None:
    """Power nodes off and on again (an off node is powered on). Refused for nodes that run jobs unless --force."""
    _act(ctx, "cycle", nodes, force, limit, stagger, dry_run, output)


@power_app.command("reset")
def reset(
    ctx: typer.Context,
    nodes: Nodes,
    force: Force = False,
    limit: Limit = None,
    dry_run: DryRun = False,
    output: Format = OutputOpt,
) -> None:
    """Hard-reset nodes (an off node is powered on). Refused for nodes that run jobs unless --force."""
    _act(ctx, "reset", nodes, force, limit, None, dry_run, output)


BMC_FIELDS = [
    ("node", "Node"),
    ("protocol", "Protocol"),
    ("address", "Address"),
    ("port", "Port"),
    ("system_id", "System id"),
    ("username", "Username"),
    ("password_set", "Password set"),
    ("verify_tls", "Verify TLS"),
    ("power_state", "Power"),
    ("power_read_at", "Read at"),
    ("last_error", "Last error"),
    ("updated_at", "Updated"),
]


def _password(from_stdin: bool, env: str | None) -> str:
    if from_stdin == (env is not None):
        raise InvalidInput("give the BMC password with exactly one of --password-stdin and --password-env VAR")
    if env is not None:
        value = os.environ.get(env)
        if not value:
            raise InvalidInput(f"the environment variable {env} is not set or empty")
        return value
    # At a terminal, ask without echoing it; from a pipe or file, the first line.
    value = getpass.getpass("BMC password: ") if sys.stdin.isatty() else sys.stdin.readline().rstrip("\r\n")
    if not value:
        raise InvalidInput("no password on standard input")
    return value


@bmc_app.command("set")
def set_(
    ctx: typer.Context,
    node: Annotated[str, typer.Argument(help="the node")],
    protocol: Annotated[str, typer.Option(help="redfish or ipmi")],
    address: Annotated[str, typer.Option(help="Redfish: the BMC's URL (https://10.140.0.12); IPMI: host or address")],
    username: Annotated[str, typer.Option(help="the BMC user")],
    password_stdin: Annotated[bool, typer.Option("--password-stdin", help="read the password from stdin")] = False,
    password_env: Annotated[
        str | None, typer.Option("--password-env", metavar="VAR", help="read the password from this variable")
    ] = None,
    port: Annotated[int | None, typer.Option(min=1, max=65535, help="IPMI's UDP port (default 623)")] = None,
    system_id: Annotated[str | None, typer.Option(help="Redfish system id (default: the BMC's only one)")] = None,
    insecure: Annotated[bool, typer.Option("--insecure", help="do not check a Redfish BMC's certificate")] = False,
    output: Format = OutputOpt,
) -> None:
    """Tell gpufleet how to reach a node's BMC. The password is stored encrypted and never shown."""
    spec = {
        "protocol": protocol,
        "address": address,
        "port": port,
        "system_id": system_id,
        "username": username,
        "password": _password(password_stdin, password_env),
        "verify_tls": not insecure,
    }
    bmc = state(ctx).client().set_bmc(node, spec)
    if output is Format.json:
        print_json(bmc)
    else:
        typer.echo(f"{bmc['node']}: {bmc['protocol']} BMC at {bmc['address']} as {bmc['username']}")


@bmc_app.command("show")
def show(ctx: typer.Context, node: Annotated[str, typer.Argument()], output: Format = OutputOpt) -> None:
    """A node's BMC and the power state it reported last (never its password)."""
    bmc = state(ctx).client().get_bmc(node)
    if output is Format.json:
        print_json(bmc)
    else:
        fields(bmc, BMC_FIELDS)


@bmc_app.command("remove")
def remove(ctx: typer.Context, node: Annotated[str, typer.Argument()], output: Format = OutputOpt) -> None:
    """Forget a node's BMC and its credentials."""
    state(ctx).client().remove_bmc(node)
    if output is Format.json:
        print_json({"node": node, "removed": True})
    else:
        typer.echo(f"{node}: BMC removed")
