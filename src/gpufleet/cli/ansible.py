"""gpufleet ansible: the dynamic inventory (also as Ansible's inventory script) and playbook runs."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Annotated, Any

import typer

from gpufleet.cli.output import Format, OutputOpt, fields, print_json, table
from gpufleet.cli.state import state
from gpufleet.cli.tasks import follow
from gpufleet.core import hostlist
from gpufleet.core.errors import InvalidInput

app = typer.Typer(help="Ansible over the inventory: dynamic inventory and playbook runs.", no_args_is_help=True)
PLAYBOOK_MAX_BYTES = 1024 * 1024  # the head refuses more (provisioning.ansible.PLAYBOOK_MAX_BYTES)


@app.command("inventory")
def inventory(
    ctx: typer.Context,
    list_: Annotated[bool, typer.Option("--list", help="the whole inventory as JSON (what Ansible asks for)")] = False,
    host: Annotated[str | None, typer.Option("--host", help="one host's variables as JSON")] = None,
    output: Format = OutputOpt,
) -> None:
    """The nodes as Ansible's dynamic inventory (groups per category and state, host variables).

    Ansible runs it as an inventory script through a two-line wrapper (docs/ansible.md) and calls
    it with --list; people get a table of the groups and hosts."""
    client = state(ctx).client()
    if host is not None:
        print_json(client.ansible_inventory(host))
        return
    script = client.ansible_inventory()
    if list_ or output is Format.json:
        print_json(script)
        return
    hostvars: dict[str, Any] = script["_meta"]["hostvars"]
    groups = [
        {"group": name, "count": len(group["hosts"]), "hosts": hostlist.collect(group["hosts"])}
        for name, group in script.items()
        if name not in ("_meta", "all")
    ]
    table(groups, [("group", "Group"), ("count", "Hosts"), ("hosts", "Names")], title="Groups")
    rows = [
        {
            "host": name,
            "address": hv.get("ansible_host"),
            "category": hv.get("gpufleet_category"),
            "state": hv.get("gpufleet_state"),
        }
        for name, hv in hostvars.items()
    ]
    table(rows, [("host", "Host"), ("address", "ansible_host"), ("category", "Category"), ("state", "State")])


def _extra_vars(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InvalidInput(f"invalid extra variable {item!r}: use KEY=VALUE")
        out[key] = value
    return out


def _read_playbook(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InvalidInput(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > PLAYBOOK_MAX_BYTES:
        raise InvalidInput(f"{path} is larger than {PLAYBOOK_MAX_BYTES // 1024} KiB")
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise InvalidInput(f"{path} is not UTF-8 text") from None


@app.command("run")
def run(
    ctx: typer.Context,
    playbook: Annotated[Path, typer.Argument(help="the playbook file (one file: a YAML list of plays)")],
    category: Annotated[str | None, typer.Option(help="run on every node of this category")] = None,
    nodes: Annotated[str | None, typer.Option(help="or on these nodes, e.g. 'node[001-004]'")] = None,
    check: Annotated[bool, typer.Option("--check", help="Ansible's check mode: change nothing")] = False,
    extra_var: Annotated[
        list[str] | None, typer.Option("--extra-var", "-e", help="KEY=VALUE for every play (repeatable)")
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="show the hosts and the command that would run; run nothing")
    ] = False,
    output: Format = OutputOpt,
) -> None:
    """Run a playbook on a category's nodes or a node list, as a task with each host's result.

    The head runs it through ansible-runner; the command follows the task to its end and exits 1
    if any host failed."""
    if (category is None) == (nodes is None):
        raise InvalidInput("name the hosts with exactly one of --category and --nodes")
    name = re.sub(r"[^A-Za-z0-9._-]", "_", playbook.name).lstrip("._-") or "playbook.yml"
    spec = {
        "playbook": _read_playbook(playbook),
        "name": name,
        "category": category,
        "nodes": nodes,
        "check": check,
        "extra_vars": _extra_vars(extra_var or []),
    }
    client = state(ctx).client()
    if dry_run:
        plan = client.ansible_plan(spec)
        if output is Format.json:
            print_json(plan)
            return
        plan["count"] = len(plan["hosts"])
        plan["hosts"] = hostlist.collect(plan["hosts"])
        fields(
            plan,
            [("playbook", "Playbook"), ("sha256", "SHA-256"), ("plays", "Plays"), ("count", "Hosts"), ("hosts", "On")],
        )
        # whole, on a line of its own (never wrapped by a table): what ansible-runner would start
        typer.echo(f"command: {shlex.join(plan['argv'])}")
        typer.echo("dry run: nothing was started")
        return
    follow(client, client.ansible_run(spec), output)
