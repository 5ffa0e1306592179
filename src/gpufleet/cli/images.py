"""gpufleet image: software images (create, clone, install, history) and image sync (sync, drift)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from gpufleet.cli.output import Format, OutputOpt, fields, print_json, size_mb, table
from gpufleet.cli.state import state
from gpufleet.cli.tasks import follow
from gpufleet.client import HeadClient
from gpufleet.core.errors import InvalidInput

app = typer.Typer(help="Software images and bringing nodes in line with them (image sync).", no_args_is_help=True)

DryRun = Annotated[bool, typer.Option("--dry-run", help="print the programs that would run; run nothing")]
SHOWN_CHANGES = 50  # per node in a dry run's table output; -o json has all the head kept


def _plan(client: HeadClient, spec: dict[str, Any], output: Format) -> None:
    plan = client.plan_image_change(spec)
    if output is Format.json:
        print_json(plan)
        return
    for step in plan["steps"]:
        typer.echo(step)  # whole, one per line: never wrapped by a table
    typer.echo("dry run: nothing was run")


@app.command("create")
def create(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="the new image, e.g. hgx-base")],
    debootstrap: Annotated[
        str | None, typer.Option("--debootstrap", help="a Debian or Ubuntu release: bookworm, noble, ...")
    ] = None,
    mirror: Annotated[str | None, typer.Option(help="the package mirror (default: the head's image_mirror)")] = None,
    tarball: Annotated[
        str | None, typer.Option("--tarball", help="a tar file on the head (e.g. from podman export)")
    ] = None,
    dry_run: DryRun = False,
    output: Format = OutputOpt,
) -> None:
    """Create an image on the head from a release (debootstrap --variant=minbase) or a tarball, as a
    task; follows it to the end."""
    if (debootstrap is None) == (tarball is None):
        raise InvalidInput("give exactly one of --debootstrap RELEASE and --tarball FILE")
    if tarball is not None:
        tarball = str(Path(tarball).absolute())  # the head reads it: say which file exactly
    spec = {"name": name, "debootstrap": debootstrap, "mirror": mirror, "tarball": tarball}
    client = state(ctx).client()
    if dry_run:
        _plan(client, spec, output)
        return
    follow(client, client.create_image(spec), output)


@app.command("list")
def list_(ctx: typer.Context, output: Format = OutputOpt) -> None:
    """Every image with its current revision and size."""
    rows = state(ctx).client().list_images()
    if output is Format.json:
        print_json(rows)
        return
    for row in rows:
        row["size"] = size_mb(row["bytes"])
        row["used"] = ", ".join(row["used_by"])
    table(
        rows,
        [
            ("name", "Name"),
            ("state", "State"),
            ("revision", "Revision"),
            ("files", "Files"),
            ("size", "Size"),
            ("source", "Source"),
            ("used", "Used by"),
        ],
    )


@app.command("show")
def show(ctx: typer.Context, name: Annotated[str, typer.Argument()], output: Format = OutputOpt) -> None:
    """One image: where it is, what it came from, its size, who uses it and its last changes."""
    image = state(ctx).client().get_image(name)
    if output is Format.json:
        print_json(image)
        return
    image["size"] = size_mb(image["bytes"])
    image["used"] = ", ".join(image["used_by"]) or "-"
    image["exclude"] = ", ".join(image["excludes"]) or "-"
    fields(
        image,
        [
            ("name", "Name"),
            ("path", "Path"),
            ("source", "Source"),
            ("state", "State"),
            ("revision", "Revision"),
            ("digest", "Digest"),
            ("files", "Files"),
            ("size", "Size"),
            ("used", "Used by"),
            ("exclude", "Also excluded"),
            ("created_at", "Created"),
            ("created_by", "By"),
        ],
    )
    _history(image["history"][:5])


def _history(rows: list[dict[str, Any]]) -> None:
    for row in rows:
        row["size"] = size_mb(row["bytes"])
        row["digest"] = row["digest"][:12]
    table(
        rows,
        [
            ("number", "Revision"),
            ("at", "When"),
            ("actor", "Who"),
            ("change", "Change"),
            ("files", "Files"),
            ("size", "Size"),
            ("digest", "Digest"),
        ],
    )


@app.command("history")
def history(ctx: typer.Context, name: Annotated[str, typer.Argument()], output: Format = OutputOpt) -> None:
    """Every revision of an image, newest first: what changed it, who, when."""
    rows = state(ctx).client().get_image(name)["history"]
    if output is Format.json:
        print_json(rows)
        return
    _history(rows)


@app.command("clone")
def clone(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="the image to copy")],
    new_name: Annotated[str, typer.Argument(help="the copy")],
    dry_run: DryRun = False,
    output: Format = OutputOpt,
) -> None:
    """Copy an image to a new name (cp -a --reflink=auto), as a task."""
    client = state(ctx).client()
    if dry_run:
        _plan(client, {"name": new_name, "clone_of": name}, output)
        return
    follow(client, client.clone_image(name, new_name), output)


@app.command("install")
def install(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="the image")],
    packages: Annotated[list[str], typer.Argument(help="Debian packages, e.g. curl jq")],
    dry_run: DryRun = False,
    output: Format = OutputOpt,
) -> None:
    """Install packages into an image with chroot + apt, as a task; the change is a new revision."""
    client = state(ctx).client()
    if dry_run:
        _plan(client, {"name": name, "packages": packages}, output)
        return
    follow(client, client.install_into_image(name, packages), output)


@app.command("remove")
def remove(ctx: typer.Context, name: Annotated[str, typer.Argument()]) -> None:
    """Remove an image and its tree (refused while a category or node uses it)."""
    state(ctx).client().remove_image(name)
    typer.echo(f"image {name} removed")


@app.command("sync")
def sync(
    ctx: typer.Context,
    nodes: Annotated[str | None, typer.Argument(help="a hostlist, e.g. 'node[001-016]'")] = None,
    category: Annotated[str | None, typer.Option(help="every node of this category")] = None,
    image: Annotated[str | None, typer.Option(help="the image (default: each node's software_image)")] = None,
    target: Annotated[
        str | None, typer.Option(help="where to write (default: each node's sync_target); {node}, {address}")
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", "-n", help="list what would change on each node; change nothing")
    ] = False,
    limit: Annotated[int | None, typer.Option(min=1, max=1000, help="nodes written at once")] = None,
    output: Format = OutputOpt,
) -> None:
    """Bring nodes in line with their image by rsync (--delete, local state excluded), at most
    --limit at once, with progress and each node's result; exits 1 if any node failed."""
    if (nodes is None) == (category is None):
        raise InvalidInput("name the nodes (a hostlist) or --category, not both")
    spec: dict[str, Any] = {"nodes": nodes, "category": category, "image": image, "target": target, "dry_run": dry_run}
    spec |= {"limit": limit} if limit is not None else {}
    client = state(ctx).client()
    task = client.sync_images(spec)
    if not dry_run or output is Format.json:
        follow(client, task, output)
        return
    try:
        follow(client, task, output)
    finally:
        _changes(client.get_task(task["id"]))


def _changes(task: dict[str, Any]) -> None:
    """A dry run's changes per node, as Bright's imageupdate -n lists them."""
    for target in task["targets"]:
        data = target.get("data") or {}
        listed = data.get("changes") or []
        if not listed:
            continue
        typer.echo(f"\n{target['target']} ({data.get('target', '')}): {data.get('changes_total', len(listed))} changes")
        for kind, path in listed[:SHOWN_CHANGES]:
            typer.echo(f"  {kind:<7} {path}")
        more = data.get("changes_total", len(listed)) - min(len(listed), SHOWN_CHANGES)
        if more > 0:
            typer.echo(f"  ... and {more} more (-o json lists up to 500 per node)")


@app.command("drift")
def drift(
    ctx: typer.Context,
    node: Annotated[str, typer.Argument(help="the node")],
    image: Annotated[
        str | None, typer.Option(help="compare with this image (default: the node's); needs images:write")
    ] = None,
    target: Annotated[
        str | None, typer.Option(help="where the node's tree is (default: its sync_target); needs images:write")
    ] = None,
    output: Format = OutputOpt,
) -> None:
    """Files on a node that differ from its image (by content), are missing or extra, or differ in
    mode or owner; exits 1 when there is drift. The head runs the comparison while the command
    waits, for at most its image_drift_timeout_s (120 s by default)."""
    report = state(ctx).client().node_drift(node, image, target)
    if output is Format.json:
        print_json(report)
    else:
        typer.echo(f"{report['node']} against image {report['image']} revision {report['revision']}:")
        kinds = (("differs", "differs"), ("missing", "missing"), ("extra", "extra"), ("attributes", "mode/owner"))
        for key, title in kinds:
            for path in report[key]:
                typer.echo(f"  {title:<10} {path}")
        if report["in_line"]:
            typer.echo("  in line with the image")
    if not report["in_line"]:
        raise typer.Exit(1)
