"""gpufleet category create|list|show|set|unset|remove, and gpufleet node set|unset: settings inherited
defaults < category < node. The keys' help below is written from the one registry the head validates
with (gpufleet.protocol.settings)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from gpufleet.cli.output import Format, OutputOpt, cell, print_json, table
from gpufleet.cli.state import state
from gpufleet.core.errors import InvalidInput
from gpufleet.protocol.settings import SETTINGS, parse_assignments, settings_help

KEYS_HELP = "Settings (KEY=VALUE; an empty value means none where a key allows it):\n\n" + settings_help()
app = typer.Typer(
    help="Categories: named groups of nodes whose settings the nodes inherit (defaults < category < node).",
    no_args_is_help=True,
)
Assignments = Annotated[list[str], typer.Argument(help="KEY=VALUE settings", metavar="KEY=VALUE...")]
Keys = Annotated[list[str], typer.Argument(help="settings to unset (inherit again)", metavar="KEY...")]
DryRun = Annotated[bool, typer.Option("--dry-run", help="print what would change and change nothing")]


def assignments(items: list[str]) -> dict[str, Any]:
    try:
        return parse_assignments(items)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None


def _describe(set_: dict[str, Any], unset: list[str]) -> str:
    parts = [f"{k}={'none' if v is None else v}" for k, v in set_.items()] + [f"{k} unset" for k in unset]
    return ", ".join(parts)


def settings_table(settings: dict[str, dict[str, Any]], title: str) -> None:
    """Resolved settings: key, value, origin (default, category or node)."""
    rows = [{"key": key, "value": _value(key, s["value"]), "origin": s["origin"]} for key, s in settings.items()]
    table(rows, [("key", "Setting"), ("value", "Value"), ("origin", "Origin")], title=title)


def _value(key: str, value: Any) -> str:
    if key == "health_policy":  # the thresholds that differ from the built-in ones
        return cell(value) if value else "(built in)"
    if value is None:
        return "-"
    return str(value) if value != "" else '""'


@app.command("create")
def create(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="e.g. h200")],
    description: Annotated[str, typer.Option(help="what the category is for")] = "",
    set_: Annotated[list[str] | None, typer.Option("--set", help="KEY=VALUE setting (repeatable)")] = None,
    dry_run: DryRun = False,
    output: Format = OutputOpt,
) -> None:
    """Create a category."""
    values = assignments(set_ or [])
    if dry_run:
        typer.echo(f"would create category {name}" + (f" with {_describe(values, [])}" if values else ""))
        return
    made = state(ctx).client().create_category(name, description, values)
    if output is Format.json:
        print_json(made)
    else:
        typer.echo(f"created category {made['name']}" + (f": {_describe(made['settings'], [])}" if values else ""))


create.__doc__ = f"Create a category.\n\n{KEYS_HELP}"


@app.command("list")
def list_(ctx: typer.Context, output: Format = OutputOpt) -> None:
    """Categories with their node counts and the settings set on them."""
    rows = state(ctx).client().list_categories()
    if output is Format.json:
        print_json(rows)
        return
    table(
        rows,
        [("name", "Category"), ("nodes", "Nodes"), ("settings", "Settings"), ("description", "Description")],
        title=f"{len(rows)} categories",
    )


@app.command("show")
def show(ctx: typer.Context, name: str, output: Format = OutputOpt) -> None:
    """One category: what its nodes inherit (and from where) and its nodes."""
    found = state(ctx).client().show_category(name)
    if output is Format.json:
        print_json(found)
        return
    about = f" — {found['description']}" if found["description"] else ""
    typer.echo(f"category {found['name']}: {found['nodes']} node(s){about}")
    settings_table(found["resolved"], "Settings its nodes inherit")
    if found["node_names"]:
        typer.echo("nodes: " + ", ".join(found["node_names"]))


@app.command("set")
def set_(
    ctx: typer.Context,
    name: str,
    values: Assignments,
    description: Annotated[str | None, typer.Option(help="a new description")] = None,
    dry_run: DryRun = False,
    output: Format = OutputOpt,
) -> None:
    """Set settings on a category (all or nothing)."""
    parsed = assignments(values)
    if dry_run:
        _dry_run(state(ctx).client().show_category(name)["resolved"], parsed, [], f"category {name}")
        return
    done = state(ctx).client().update_category(name, parsed, [], description)
    _done(done, output, f"category {name}: {_describe(parsed, [])}")


set_.__doc__ = f"Set settings on a category (all or nothing).\n\n{KEYS_HELP}"


@app.command("unset")
def unset(ctx: typer.Context, name: str, keys: Keys, dry_run: DryRun = False, output: Format = OutputOpt) -> None:
    """Unset settings of a category: its nodes get the defaults again (unless they set them)."""
    if dry_run:
        _dry_run(state(ctx).client().show_category(name)["resolved"], {}, keys, f"category {name}")
        return
    done = state(ctx).client().update_category(name, {}, keys)
    _done(done, output, f"category {name}: {_describe({}, keys)}")


@app.command("remove")
def remove(ctx: typer.Context, name: str, dry_run: DryRun = False) -> None:
    """Remove a category; refused while nodes are in it."""
    client = state(ctx).client()
    if dry_run:
        found = client.show_category(name)
        verdict = "would remove" if not found["nodes"] else f"would refuse ({found['nodes']} node(s) in it):"
        typer.echo(f"{verdict} category {name}")
        return
    client.remove_category(name)
    typer.echo(f"removed category {name}")


def _dry_run(current: dict[str, dict[str, Any]], set_: dict[str, Any], unset: list[str], what: str) -> None:
    """The keys that would change, from what is in force now (the head checks the values)."""
    unknown = [k for k in [*set_, *unset] if k not in SETTINGS]
    if unknown:
        raise InvalidInput(f"unknown setting {unknown[0]!r} (known: {', '.join(SETTINGS)})")
    typer.echo(f"would change {what}:")
    for key, value in set_.items():
        before = current[key]
        typer.echo(f"  {key}: {_value(key, before['value'])} ({before['origin']}) -> {_value(key, value)}")
    for key in unset:
        typer.echo(f"  {key}: {_value(key, current[key]['value'])} ({current[key]['origin']}) -> inherited")


def _done(result: dict[str, Any], output: Format, message: str) -> None:
    if output is Format.json:
        print_json(result)
    else:
        typer.echo(message)


# -- gpufleet node set | unset: a node's own values ---------------------------------------------------


def node_set(
    ctx: typer.Context,
    node: Annotated[str, typer.Argument(help="the node")],
    values: Annotated[list[str] | None, typer.Argument(help="KEY=VALUE settings", metavar="[KEY=VALUE...]")] = None,
    category: Annotated[str | None, typer.Option(help='move the node to this category ("": none)')] = None,
    dry_run: DryRun = False,
    output: Format = OutputOpt,
) -> None:
    """Set a node's own values, overriding its category's (all or nothing)."""
    parsed = assignments(values or [])
    if not parsed and category is None:
        raise InvalidInput("nothing to set: give KEY=VALUE settings or --category")
    client = state(ctx).client()
    if dry_run:
        shown = client.show_node(node)
        if category is not None:
            typer.echo(f"would move node {node} from category {shown['category'] or '-'} to {category or '-'}")
        if parsed:
            _dry_run(shown["settings"], parsed, [], f"node {node}")
        return
    done = client.update_node_settings(node, parsed, [], category)
    moved = [f"category={done['category'] or '-'}"] if category is not None else []
    _done(done, output, f"node {node}: " + ", ".join([*moved, *filter(None, [_describe(parsed, [])])]))


node_set.__doc__ = f"Set a node's own values, overriding its category's (all or nothing).\n\n{KEYS_HELP}"


def node_unset(ctx: typer.Context, node: str, keys: Keys, dry_run: DryRun = False, output: Format = OutputOpt) -> None:
    """Unset a node's own values: it inherits them from its category (or the defaults) again."""
    client = state(ctx).client()
    if dry_run:
        _dry_run(client.show_node(node)["settings"], {}, keys, f"node {node}")
        return
    done = client.update_node_settings(node, {}, keys)
    _done(done, output, f"node {node}: {_describe({}, keys)}")
