"""gpufleet network and gpufleet provision: networks, node addresses and MACs, network-boot config."""

from __future__ import annotations

import difflib
import os
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from gpufleet.cli.output import Format, OutputOpt, print_json, table
from gpufleet.cli.state import state
from gpufleet.core.errors import InvalidInput

network_app = typer.Typer(help="Networks and the addresses nodes get on them.", no_args_is_help=True)
provision_app = typer.Typer(help="What network boot serves: DHCP and TFTP configuration.", no_args_is_help=True)


@network_app.command("create")
def create(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="e.g. internal")],
    cidr: Annotated[str, typer.Option(help="e.g. 10.141.0.0/16")],
    range_: Annotated[
        str | None, typer.Option("--range", help="FIRST-LAST addresses given to nodes (default: the whole network)")
    ] = None,
    gateway: Annotated[str | None, typer.Option(help="the router's address (never given to a node)")] = None,
    domain: Annotated[str | None, typer.Option(help="DNS domain handed out by DHCP")] = None,
    boot_server: Annotated[str | None, typer.Option(help="the TFTP/iPXE server, usually the head")] = None,
    boot_file: Annotated[str | None, typer.Option(help="what PXE clients fetch first, e.g. gpufleet.ipxe")] = None,
    output: Format = OutputOpt,
) -> None:
    """Create a network nodes get addresses on."""
    start, end = None, None
    if range_ is not None:
        start, sep, end = range_.partition("-")
        if not sep:
            raise InvalidInput("--range is FIRST-LAST, e.g. 10.141.0.10-10.141.3.250")
    spec = {
        "name": name,
        "cidr": cidr,
        "range_start": start,
        "range_end": end,
        "gateway": gateway,
        "domain": domain,
        "boot_server": boot_server,
        "boot_file": boot_file,
    }
    made = state(ctx).client().create_network(spec)
    if output is Format.json:
        print_json(made)
    else:
        span = f"{made['range_start']}-{made['range_end']}"
        typer.echo(f"network {made['name']} {made['cidr']}: {made['free']} addresses free in {span}")


@network_app.command("list")
def list_(ctx: typer.Context, output: Format = OutputOpt) -> None:
    rows = state(ctx).client().list_networks()
    if output is Format.json:
        print_json(rows)
        return
    for row in rows:
        row["range"] = f"{row['range_start']}-{row['range_end']}"
    table(
        rows,
        [
            ("name", "Name"),
            ("cidr", "CIDR"),
            ("range", "Range"),
            ("free", "Free"),
            ("gateway", "Gateway"),
            ("boot_file", "Boot file"),
        ],
    )


@network_app.command("show")
def show(ctx: typer.Context, name: Annotated[str, typer.Argument()], output: Format = OutputOpt) -> None:
    """The nodes with an address on a network, and their MACs."""
    rows = state(ctx).client().network_hosts(name)
    if output is Format.json:
        print_json(rows)
        return
    table(rows, [("node", "Node"), ("address", "Address"), ("mac", "MAC"), ("interface", "Interface")])


def set_mac(
    ctx: typer.Context,
    node: Annotated[str, typer.Argument(help="the node")],
    mac: Annotated[str, typer.Argument(help="e.g. 52:54:00:aa:bb:01")],
    network: Annotated[str, typer.Option(help="the network the interface is on")],
    interface: Annotated[str | None, typer.Option(help="its name on the node, e.g. eno1")] = None,
) -> None:
    """Record the MAC of a node's interface (DHCP hands the node's address to it)."""
    row = state(ctx).client().set_mac(node, network, mac, interface)
    typer.echo(f"{row['node']}: {row['mac']} -> {row['address']} on {network}")


@provision_app.command("dhcp-config")
def dhcp_config(
    ctx: typer.Context,
    output_file: Annotated[Path, typer.Option("--output", help="where dnsmasq reads it")] = Path(
        "/etc/dnsmasq.d/gpufleet.conf"
    ),
    tftp_root: Annotated[
        Path | None,
        typer.Option(help="serve TFTP from here (dnsmasq's own TFTP server), and write the iPXE scripts into it"),
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="show what would change; write nothing")] = False,
) -> None:
    """Render dnsmasq's DHCP and TFTP configuration from the inventory (MAC -> address, name, boot file)
    and, with --tftp-root, each node's iPXE script; write them (atomically), or with --dry-run print
    how they differ from the files there now."""
    client = state(ctx).client()
    files = {output_file: client.dhcp_config(str(tftp_root) if tftp_root else None)}
    stale: list[Path] = []
    if tftp_root is not None:
        root = tftp_root.resolve()
        for relative, text in client.boot_files().items():
            path = tftp_root / relative
            if not path.resolve().is_relative_to(root):  # the head names files under the root, never above
                raise InvalidInput(f"the head asked to write {relative!r}, outside {tftp_root}: refused")
            files[path] = text
        stale = _stale_scripts(tftp_root, set(files))
    changed = {path: text for path, text in files.items() if _read(path) != text}
    if dry_run:
        for path, text in changed.items():
            diff = difflib.unified_diff(_read(path).splitlines(True), text.splitlines(True), str(path), "rendered")
            typer.echo("".join(diff), nl=False)
        for path in stale:
            typer.echo(f"would remove {path} (no such node any more)")
        if not changed and not stale:
            typer.echo("everything is up to date")
        return
    for path, text in changed.items():
        _write(path, text)
    for path in stale:
        path.unlink(missing_ok=True)
    hosts = files[output_file].count("dhcp-host=")
    scripts_note = f", {len(files) - 1} iPXE scripts in {tftp_root}" if tftp_root else ""
    if not changed and not stale:
        typer.echo(f"{output_file}{scripts_note}: up to date")
    else:
        typer.echo(
            f"wrote {output_file} ({hosts} hosts){scripts_note}: {len(changed)} changed, {len(stale)} removed; "
            "reload dnsmasq to apply the DHCP part"
        )


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""
    except OSError as exc:
        raise InvalidInput(f"cannot read {path}: {exc.strerror or exc}") from None


def _stale_scripts(tftp_root: Path, rendered: set[Path]) -> list[Path]:
    """Node scripts gpufleet wrote before for nodes (or MACs) that are gone; anything else is left alone."""
    nodes = tftp_root / "nodes"
    if not nodes.is_dir():
        return []
    return sorted(
        path
        for path in nodes.glob("*.ipxe")
        if path not in rendered and _read(path).startswith("#!ipxe\n# Generated by gpufleet")
    )


def _write(path: Path, text: str) -> None:
    """Write atomically (a reader never sees half a file), readable by dnsmasq's TFTP server."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".gpufleet-")
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError as exc:
        raise InvalidInput(f"cannot write {path}: {exc.strerror or exc}") from None
