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
    tftp_root: Annotated[str | None, typer.Option(help="serve TFTP from here (dnsmasq's own TFTP server)")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="show what would change; write nothing")] = False,
) -> None:
    """Render dnsmasq's DHCP and TFTP configuration from the inventory (MAC -> address, name, boot file)
    and write it (atomically), or with --dry-run print how it differs from the file there now."""
    text = state(ctx).client().dhcp_config(tftp_root)
    current = output_file.read_text() if output_file.exists() else ""
    if dry_run:
        diff = difflib.unified_diff(current.splitlines(True), text.splitlines(True), str(output_file), "rendered")
        changes = "".join(diff)
        typer.echo(changes or f"{output_file} is up to date", nl=not changes)
        return
    if current == text:
        typer.echo(f"{output_file} is up to date")
        return
    try:
        output_file.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=output_file.parent, prefix=".gpufleet-")
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, output_file)
    except OSError as exc:
        raise InvalidInput(f"cannot write {output_file}: {exc.strerror or exc}") from None
    typer.echo(f"wrote {output_file} ({text.count('dhcp-host=')} hosts); reload dnsmasq to apply it")
