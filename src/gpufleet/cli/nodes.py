"""gpufleet node add|list|show|remove|clone|drain|resume|burn-in (node set|unset: cli.categories)"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from gpufleet.cli import burnin
from gpufleet.cli.categories import settings_table
from gpufleet.cli.output import Format, OutputOpt, fields, print_json, table
from gpufleet.cli.state import state
from gpufleet.core import hostlist
from gpufleet.core.errors import InvalidInput

app = typer.Typer(help="Nodes: add, list, show, set, unset, remove, clone, drain, resume.", no_args_is_help=True)

LIST_COLUMNS = [
    ("name", "Node"),
    ("state", "State"),
    ("health", "Health"),
    ("gpu_count", "GPUs"),
    ("gpu_model", "GPU model"),
    ("hostname", "Hostname"),
    ("category", "Category"),
    ("last_seen", "Last heartbeat"),
    ("drain", "Drained"),
]
WLM_COLUMN = ("wlm_state", "Slurm")  # shown when the workload manager is Slurm
POWER_COLUMN = ("power_state", "Power")  # shown when a listed node has a BMC
Names = Annotated[list[str], typer.Argument(help="node names or hostlist expressions, e.g. gpu[001-016]")]
DryRun = Annotated[bool, typer.Option("--dry-run", help="print what would change and change nothing")]


def _labels(items: list[str]) -> dict[str, str]:
    labels: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InvalidInput(f"invalid label {item!r}: use KEY=VALUE")
        labels[key] = value
    return labels


@app.command("add")
def add(
    ctx: typer.Context,
    names: Names,
    category: Annotated[str | None, typer.Option(help="category to put the nodes in")] = None,
    label: Annotated[list[str] | None, typer.Option(help="KEY=VALUE label (repeatable)")] = None,
    network: Annotated[str | None, typer.Option(help="give each node the next free address on this network")] = None,
    dry_run: DryRun = False,
    output: Format = OutputOpt,
) -> None:
    """Pre-register nodes (state `new`) before their agents join."""
    labels = _labels(label or [])
    if dry_run:
        expanded = hostlist.expand(names)
        typer.echo(f"would add {len(expanded)} node(s): {hostlist.collect(expanded)}")
        return
    added = state(ctx).client().add_nodes(names, category, labels, network)
    if output is Format.json:
        print_json(added)
    else:
        typer.echo(f"added {len(added)} node(s): {hostlist.collect([n['name'] for n in added])}")


@app.command("list")
def list_(
    ctx: typer.Context,
    names: Annotated[str | None, typer.Argument(help="hostlist filter, e.g. gpu[001-004]")] = None,
    output: Format = OutputOpt,
) -> None:
    """List nodes with their state and GPU count."""
    nodes = state(ctx).client().list_nodes(names)
    if output is Format.json:
        print_json(nodes)
        return
    columns = list(LIST_COLUMNS)
    if any(n.get("wlm_state") for n in nodes):
        columns.insert(3, WLM_COLUMN)
    if any(n.get("power_state") for n in nodes):
        columns.insert(3, POWER_COLUMN)
    table([_list_row(n) for n in nodes], columns, title=f"{len(nodes)} nodes")


def _list_row(node: dict[str, Any]) -> dict[str, Any]:
    """The drain, with who set it: "gpufleet: GPU 3: Xid 79 (gpufleet)", "bad fan (slurm:root)"."""
    reason = node.get("drain_reason")
    drain = f"{reason} ({node['drained_by']})" if reason and node.get("drained_by") else reason
    return node | {"drain": drain or ""}


@app.command("show")
def show(ctx: typer.Context, name: str, output: Format = OutputOpt) -> None:
    """Show one node: inventory, GPUs, settings with their origin, and state history."""
    node = state(ctx).client().show_node(name)
    if output is Format.json:
        print_json(node)
        return
    fields(
        node,
        [
            ("name", "Name"),
            ("state", "State"),
            ("state_since", "Since"),
            ("power_state", "Power"),
            ("last_seen", "Last heartbeat"),
            ("hostname", "Hostname"),
            ("category", "Category"),
            ("labels", "Labels"),
            ("cpus", "CPUs"),
            ("cpu_model", "CPU model"),
            ("memory_total_mib", "Memory (MiB)"),
            ("os_name", "OS"),
            ("kernel", "Kernel"),
            ("arch", "Arch"),
            ("agent_version", "Agent"),
            ("gpu_source", "GPU source"),
        ],
    )
    table(
        node["gpus"],
        [
            ("index", "#"),
            ("model", "Model"),
            ("uuid", "UUID"),
            ("pci_bus_id", "PCI bus"),
            ("memory_total_mib", "Memory (MiB)"),
            ("driver_version", "Driver"),
            ("cuda_version", "CUDA"),
            ("vbios_version", "VBIOS"),
            ("ecc_mode", "ECC"),
            ("mig_mode", "MIG"),
        ],
        title="GPUs",
    )
    if node.get("settings"):  # heads before categories have none
        settings_table(node["settings"], "Settings (defaults < category < node)")
    if node.get("hold"):
        typer.echo(f"Held out of service: {node['hold']}")
    if node.get("burn_in"):
        run = node["burn_in"]
        title = f"Burn-in {run['id']} ({run['profile']}): {run['state']}"
        table(
            burnin.step_rows(run["steps"]),
            burnin.STEP_COLUMNS,
            title=title + (f": {run['reason']}" if run["reason"] else ""),
        )
    table(
        node["transitions"],
        [("at", "At"), ("from_state", "From"), ("to_state", "To"), ("reason", "Reason")],
        title="State history",
    )


@app.command("remove")
def remove(ctx: typer.Context, names: Names, dry_run: DryRun = False) -> None:
    """Remove nodes with their GPUs, history and credentials. All or nothing."""
    client = state(ctx).client()
    expression = ",".join(names)
    if dry_run:
        found = [n["name"] for n in client.list_nodes(expression)]
        missing = [n for n in hostlist.expand(names) if n not in set(found)]
        typer.echo(f"would remove {len(found)} node(s): {hostlist.collect(found) if found else '-'}")
        if missing:
            typer.echo(f"unknown (the command would fail): {hostlist.collect(missing)}")
        return
    removed = client.remove_nodes(expression)
    typer.echo(f"removed {len(removed)} node(s): {hostlist.collect(removed)}")


@app.command("clone")
def clone(
    ctx: typer.Context,
    source: Annotated[str, typer.Argument(help="node whose settings to copy")],
    names: Names,
    dry_run: DryRun = False,
    output: Format = OutputOpt,
) -> None:
    """Create new nodes with the settings (category, labels, its own setting values) of SOURCE."""
    client = state(ctx).client()
    if dry_run:
        src = client.show_node(source)
        expanded = hostlist.expand(names)
        typer.echo(
            f"would add {len(expanded)} node(s) {hostlist.collect(expanded)} with category={src['category']} "
            f"labels={src['labels']}"
        )
        return
    added = client.clone_node(source, names)
    if output is Format.json:
        print_json(added)
    else:
        typer.echo(f"cloned {source} to {len(added)} node(s): {hostlist.collect([n['name'] for n in added])}")


@app.command("drain")
def drain(
    ctx: typer.Context,
    name: str,
    reason: Annotated[str, typer.Option(help="why; shown with the node, and kept in the audit log")],
    output: Format = OutputOpt,
) -> None:
    """Keep new work off a node. gpufleet never undoes a drain made here."""
    result = state(ctx).client().drain(name, reason)
    if output is Format.json:
        print_json(result)
    else:
        typer.echo(f"node {name} drained: {result['drain_reason']}")


@app.command("burn-in")
def burn_in(
    ctx: typer.Context,
    names: Names,
    profile: Annotated[str, typer.Option(help="the burn-in profile (gpufleet burn-in profiles)")] = "quick",
    resume: Annotated[
        bool, typer.Option("--resume/--no-resume", help="put each node back in service when it passes")
    ] = True,
    wait: Annotated[bool, typer.Option("--wait", help="wait for the runs to end; exit 1 unless all passed")] = False,
    output: Format = OutputOpt,
) -> None:
    """Hold nodes out of service and run a burn-in profile on them, together (pair steps pair within
    them). A node that passes is resumed; one that fails stays out with the failing step as its reason."""
    burnin.start(ctx, names, profile, resume, wait, output)


@app.command("resume")
def resume(ctx: typer.Context, name: str, output: Format = OutputOpt) -> None:
    """Let work land on a drained node again."""
    result = state(ctx).client().resume(name)
    if output is Format.json:
        print_json(result)
    else:
        typer.echo(f"node {name} resumed (health: {result['health']})")
