"""What network boot serves, read from the inventory: the DHCP configuration and the TFTP root's iPXE scripts."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpufleet.inventory import categories
from gpufleet.inventory.models import Node
from gpufleet.provisioning import networks
from gpufleet.provisioning.dhcp import render_dnsmasq
from gpufleet.provisioning.ipxe import BootTarget, boot_files

DEFAULT_CHAIN = "gpufleet.ipxe"  # the first script's name when a network names no boot file of iPXE's


def dnsmasq_config(session: Session, tftp_root: str | None) -> str:
    return render_dnsmasq(networks.boot_plan(session), tftp_root=tftp_root)


def tftp_files(session: Session) -> dict[str, str]:
    """The iPXE scripts by path under the TFTP root: each network's chain script and one per node
    with a MAC, booting the image its settings name. A network without a boot server is skipped
    for node scripts: the kernel would have nowhere to come from."""
    plan = networks.boot_plan(session)
    names = {entry.node for _, entries in plan for entry in entries if entry.mac}
    nodes = list(session.scalars(select(Node).where(Node.name.in_(names)))) if names else []
    settings = categories.resolve_many(session, nodes)
    chains: list[str] = []
    targets: list[tuple[BootTarget, str]] = []
    for network, entries in plan:
        chain = network.boot_file if network.boot_file and network.boot_file.endswith(".ipxe") else DEFAULT_CHAIN
        chains.append(chain)
        if not network.boot_server:
            continue
        for entry in entries:
            if entry.mac is None:
                continue
            resolved = settings[entry.node]
            target = BootTarget(
                node=entry.node,
                mac=entry.mac,
                address=entry.address,
                cidr=network.cidr,
                gateway=network.gateway,
                interface=entry.interface,
                image=resolved["software_image"].value,
                kernel_params=resolved["kernel_params"].value or "",
            )
            targets.append((target, network.boot_server))
    return boot_files(chains, targets)
