"""gpufleet assets: what software runs on the nodes (as their agents report it), and how it differs."""

from __future__ import annotations

from typing import Annotated

import typer

from gpufleet.cli.output import Format, OutputOpt, print_json, table
from gpufleet.cli.state import state
from gpufleet.core.hostlist import collect

app = typer.Typer(help="Installed software: per node, between nodes, across the fleet.", no_args_is_help=True)

PACKAGE_COLUMNS = [("ecosystem", "Ecosystem"), ("name", "Name"), ("version", "Version"), ("location", "Where")]


@app.command("show")
def show(
    ctx: typer.Context,
    node: Annotated[str, typer.Argument(help="the node")],
    ecosystem: Annotated[str | None, typer.Option(help="only Ubuntu, PyPI, NVIDIA, firmware, ...")] = None,
    output: Format = OutputOpt,
) -> None:
    """A node's distribution, kernel and installed packages, drivers and firmware."""
    found = state(ctx).client().node_software(node, ecosystem)
    if output is Format.json:
        print_json(found)
        return
    typer.echo(f"{found['node']}: {found['distro'] or 'unknown distribution'}, kernel {found['kernel'] or '?'}")
    table(found["packages"], PACKAGE_COLUMNS)


@app.command("diff")
def diff(
    ctx: typer.Context,
    a: Annotated[str, typer.Argument(help="one node")],
    b: Annotated[str, typer.Argument(help="another node")],
    output: Format = OutputOpt,
) -> None:
    """What differs between two nodes' software."""
    found = state(ctx).client().software_diff(a, b)
    if output is Format.json:
        print_json(found)
        return
    rows = [{"what": f"{p['ecosystem']} {p['name']}", "a": p["version"], "b": ""} for p in found["only_a"]]
    rows += [{"what": f"{p['ecosystem']} {p['name']}", "a": "", "b": p["version"]} for p in found["only_b"]]
    rows += [{"what": f"{c['ecosystem']} {c['name']}", "a": c["a"], "b": c["b"]} for c in found["changed"]]
    table(sorted(rows, key=lambda r: r["what"]), [("what", "Package"), ("a", a), ("b", b)])


@app.command("where")
def where(
    ctx: typer.Context,
    package: Annotated[str, typer.Argument(help="a package (binary or source name), driver, library or firmware")],
    versions: Annotated[str | None, typer.Argument(help="a range: '<2.31.0', '>=535,<550.90.07'")] = None,
    ecosystem: Annotated[str | None, typer.Option(help="only this ecosystem")] = None,
    output: Format = OutputOpt,
) -> None:
    """The nodes that have a package, optionally only in a version range."""
    found = state(ctx).client().software_where(package, versions, ecosystem)
    if output is Format.json:
        print_json(found)
        return
    table([{"node": r["node"]} | r["package"] for r in found], [("node", "Node"), *PACKAGE_COLUMNS])


@app.command("matrix")
def matrix(ctx: typer.Context, output: Format = OutputOpt) -> None:
    """Which nodes run which kernel, driver, CUDA, cuDNN, NCCL and firmware version."""
    found = state(ctx).client().software_matrix()
    if output is Format.json:
        print_json(found)
        return
    rows = [
        {"software": software, "version": version, "count": len(nodes), "nodes": collect(nodes)}
        for software, versions in found.items()
        for version, nodes in versions.items()
    ]
    table(rows, [("software", "Software"), ("version", "Version"), ("count", "Nodes"), ("nodes", "Which")])


@app.command("drift")
def drift(ctx: typer.Context, output: Format = OutputOpt) -> None:
    """Nodes whose kernel, driver, CUDA or firmware differs from the rest of their category."""
    found = state(ctx).client().software_drift()
    if output is Format.json:
        print_json(found)
        return
    for item in found:
        typer.echo(item["summary"])
    if not found:
        typer.echo("no drift: every category's nodes run the same key software", err=True)
