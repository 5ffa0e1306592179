"""Networks, node addresses and MACs, and the network-boot configuration rendered from them."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.orm import Session

from gpufleet.api.deps import Ctx, allow, tx
from gpufleet.auth.policy import Permission
from gpufleet.auth.schemas import Principal
from gpufleet.inventory import service as inventory
from gpufleet.provisioning import boot, networks
from gpufleet.provisioning.models import Network
from gpufleet.provisioning.networks import NetworkSpec

router = APIRouter(tags=["provisioning"])
Address = Annotated[str, Field(max_length=64)]


class NetworkIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(max_length=64)
    cidr: str = Field(max_length=64, description="e.g. 10.141.0.0/16")
    range_start: Address | None = Field(None, description="first address given to nodes (default: the second)")
    range_end: Address | None = Field(None, description="last address given to nodes (default: the last)")
    gateway: Address | None = None
    domain: str | None = Field(None, max_length=253)
    boot_server: Address | None = Field(None, description="the TFTP/iPXE server: the head's address here")
    boot_file: str | None = Field(None, max_length=256, description="what PXE clients fetch first")


class NetworkOut(NetworkIn):
    free: int


class HostOut(BaseModel):
    node: str
    address: str
    mac: str | None
    interface: str


def _out(session: Session, network: Network) -> NetworkOut:
    return NetworkOut(
        name=network.name,
        cidr=network.cidr,
        range_start=network.range_start,
        range_end=network.range_end,
        gateway=network.gateway,
        domain=network.domain,
        boot_server=network.boot_server,
        boot_file=network.boot_file,
        free=networks.free_count(session, network),
    )


@router.post("/networks", status_code=201)
def create_network(body: NetworkIn, _: Annotated[Principal, allow(Permission.NODES_WRITE)], ctx: Ctx) -> NetworkOut:
    with tx(ctx) as db:
        return _out(db, networks.create_network(db, NetworkSpec(**body.model_dump())))


@router.get("/networks")
def list_networks(_: Annotated[Principal, allow(Permission.NODES_READ)], ctx: Ctx) -> list[NetworkOut]:
    with tx(ctx, readonly=True) as db:
        return [_out(db, n) for n in networks.list_networks(db)]


@router.get("/networks/{name}/hosts")
def network_hosts(name: str, _: Annotated[Principal, allow(Permission.NODES_READ)], ctx: Ctx) -> list[HostOut]:
    """Every node with an address on the network, by address."""
    with tx(ctx, readonly=True) as db:
        return [HostOut(**vars(h)) for h in networks.hosts(db, networks.get_network(db, name))]


class MacIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mac: str = Field(max_length=32, description="e.g. 52:54:00:aa:bb:01")
    interface: str | None = Field(None, max_length=32, description="the interface's name on the node, e.g. eno1")


@router.put("/nodes/{name}/interfaces/{network}")
def set_mac(
    name: str,
    network: str,
    body: MacIn,
    _: Annotated[Principal, allow(Permission.NODES_WRITE)],
    ctx: Ctx,
    request: Request,
) -> HostOut:
    """Record the MAC of a node's interface on a network (the node must have an address there)."""
    request.state.audit_target = f"{name} on {network}"
    with tx(ctx) as db:
        row = networks.set_mac(
            db, inventory.get_node(db, name), networks.get_network(db, network), body.mac, body.interface
        )
        return HostOut(node=name, address=row.address, mac=row.mac, interface=row.name)


@router.get("/provision/dhcp-config", response_class=PlainTextResponse)
def dhcp_config(_: Annotated[Principal, allow(Permission.NODES_READ)], ctx: Ctx, tftp_root: str | None = None) -> str:
    """dnsmasq's DHCP and TFTP configuration for every network: MAC -> address, name and boot file."""
    with tx(ctx, readonly=True) as db:
        return boot.dnsmasq_config(db, tftp_root)


@router.get("/provision/boot-files")
def boot_files(_: Annotated[Principal, allow(Permission.NODES_READ)], ctx: Ctx) -> dict[str, str]:
    """The TFTP root's iPXE scripts by relative path: each network's chain script and one per node."""
    with tx(ctx, readonly=True) as db:
        return boot.tftp_files(db)
