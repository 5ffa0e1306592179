"""gpufleet node deploy-agent: install, configure and start the agent on nodes over SSH (an Ansible run on
the head, followed here to its end with each node's result; docs/deploy-agents.md)."""

from __future__ import annotations

import enum
import json
import shlex
from typing import Annotated

import typer

from gpufleet.cli.output import Format, OutputOpt, print_json
from gpufleet.cli.state import state
from gpufleet.cli.tasks import follow
from gpufleet.core import hostlist
from gpufleet.deploy import units


class StartHow(enum.StrEnum):
    systemd = "systemd"
    detached = "detached"
    none = "none"


def deploy_agent(
    ctx: typer.Context,
    names: Annotated[list[str], typer.Argument(help="the nodes, e.g. 'gpu[001-016]' (the head must know them)")],
    ssh_user: Annotated[
        str | None, typer.Option(help="the SSH user (default: each node's ansible/user label, else the head's user)")
    ] = None,
    become: Annotated[
        bool | None, typer.Option("--become/--no-become", help="sudo to root (default: when --ssh-user is not root)")
    ] = None,
    head_url: Annotated[
        str | None, typer.Option(help="the head's URL as the nodes reach it (default: the one this CLI uses)")
    ] = None,
    join_token: Annotated[
        str | None, typer.Option(help="the join token for the agents (default: the head mints one, a use per node)")
    ] = None,
    zipapp: Annotated[
        str | None,
        typer.Option(help=f"the agent's zipapp, a path on the head (default: DATA_DIR/agent/{units.zipapp_name()})"),
    ] = None,
    python: Annotated[str, typer.Option(help="the nodes' Python 3 that runs the zipapp")] = units.DEFAULT_PYTHON,
    start: Annotated[
        StartHow,
        typer.Option(help="systemd (enable --now), detached (no systemd: a session of its own), none (install only)"),
    ] = StartHow.systemd,
    root: Annotated[
        str | None,
        typer.Option(help="install under DIR instead of / ({node} in it: the node's name); with --start detached|none"),
    ] = None,
    wait: Annotated[float, typer.Option(min=0, max=600, help="seconds each agent may take to join")] = 60.0,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="show the hosts, the command and the first node's unit; start nothing")
    ] = False,
    output: Format = OutputOpt,
) -> None:
    """Install the agent on existing nodes over SSH: its zipapp, unit and settings, then start it.

    The head runs it through Ansible as a task; this follows the task and exits 1 if any node failed,
    each node's result (and a failed one's reason) in the table."""
    client = state(ctx).client()
    spec = {
        "nodes": ",".join(names),
        "server": head_url or state(ctx).settings().server,
        "ssh_user": ssh_user,
        "become": become,
        "join_token": join_token,
        "zipapp": zipapp,
        "python": python,
        "start": start.value,
        "root": root,
        "wait_s": wait,
    }
    if dry_run:
        plan = client.agent_deploy_plan(spec)
        if output is Format.json:
            print_json(plan)
            return
        typer.echo(f"hosts: {hostlist.collect(plan['hosts'])} ({len(plan['hosts'])})")
        typer.echo(f"zipapp: {plan['zipapp']} (on the head)")
        typer.echo(f"command: {shlex.join(plan['argv'])}")
        typer.echo(f"\n{plan['hosts'][0]}'s unit:\n{plan['unit']}")
        typer.echo(f"{plan['hosts'][0]}'s control spec:\n{json.dumps(plan['spec'], indent=2)}")
        typer.echo("dry run: nothing was started, no join token was made")
        return
    follow(client, client.agent_deploy(spec), output)
