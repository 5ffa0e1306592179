"""The topology wire models: LLDP neighbours in the node inventory, compatible both ways with heads and
agents older than them, and the InfiniBand fabric's bounds and helpers."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from gpufleet.protocol.inventory import NodeInventory
from gpufleet.protocol.messages import JoinRequest
from gpufleet.protocol.topology import (
    MAX_NEIGHBORS,
    IbCa,
    IbEnd,
    IbFabric,
    IbLink,
    IbSwitch,
    LinkNeighbor,
)

BASE: dict[str, Any] = {"hostname": "gpu001", "cpus": 64, "memory_total_mib": 515_000, "gpu_source": "none"}
# The JSON an agent sent before the field existed (the field order of the model then).
OLD_JSON = (
    '{"hostname":"gpu001","cpus":64,"cpu_model":null,"memory_total_mib":515000,"os_name":null,"kernel":null,'
    '"arch":null,"agent_version":null,"gpu_source":"none","gpus":[]}'
)
LEAF = LinkNeighbor(
    local_interface="eth0",
    chassis_id="0c:42:a1:00:00:01",
    chassis_id_type="mac",
    system_name="leaf01",
    port_id="swp1",
    port_id_type="ifname",
    port_description="gpu001:eth0",
    management_addresses=["10.0.0.11"],
)


def _older_head_model() -> type[BaseModel]:
    """NodeInventory as a head older than the neighbours knows it: the same fields but those, unknown keys refused."""
    fields: dict[str, Any] = {
        name: (info.annotation, info) for name, info in NodeInventory.model_fields.items() if name != "neighbors"
    }
    return create_model("OldNodeInventory", __config__=ConfigDict(extra="forbid"), **fields)


def test_an_inventory_without_neighbours_is_sent_as_before_the_field_existed() -> None:
    inventory = NodeInventory.model_validate(BASE)
    assert inventory.model_dump_json() == OLD_JSON
    assert inventory.fingerprint() == hashlib.sha256(OLD_JSON.encode()).hexdigest()  # unchanged: no re-send storm
    assert "neighbors" not in JoinRequest(name="gpu001", inventory=inventory).model_dump(mode="json")["inventory"]
    _older_head_model().model_validate_json(inventory.model_dump_json())  # an older head takes it


def test_an_older_agents_inventory_is_taken_with_no_neighbours() -> None:
    assert NodeInventory.model_validate_json(OLD_JSON).neighbors == []


def test_neighbours_round_trip_and_an_older_head_refuses_them_as_unknown() -> None:
    inventory = NodeInventory.model_validate({**BASE, "neighbors": [LEAF.model_dump()]})
    sent = inventory.model_dump_json()
    assert json.loads(sent)["neighbors"][0]["system_name"] == "leaf01"
    assert NodeInventory.model_validate_json(sent) == inventory
    assert inventory.fingerprint() != NodeInventory.model_validate(BASE).fingerprint()
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        _older_head_model().model_validate_json(sent)  # why the agent falls back (agent.daemon._put_inventory)


def test_neighbour_bounds() -> None:
    with pytest.raises(ValidationError):
        NodeInventory.model_validate({**BASE, "neighbors": [LEAF.model_dump()] * (MAX_NEIGHBORS + 1)})
    with pytest.raises(ValidationError):
        LinkNeighbor(local_interface="eth0", system_name="x" * 256)
    with pytest.raises(ValidationError):
        LinkNeighbor(local_interface="eth0", management_addresses=["10.0.0.1"] * 5)
    with pytest.raises(ValidationError):
        LinkNeighbor(local_interface="")
    with pytest.raises(ValidationError):
        LinkNeighbor(local_interface="eth0", protocol="ospf")
    with pytest.raises(ValidationError):
        LinkNeighbor(local_interface="eth0", colour="blue")  # type: ignore[call-arg]
    assert LinkNeighbor(local_interface="eth0", system_name="leaf\x0001").system_name == "leaf\ufffd01"


@pytest.mark.parametrize(
    ("port_id", "port_id_type", "description", "name"),
    [
        ("swp1", "ifname", "gpu001:eth0", "swp1"),  # a switch naming its port
        ("42:ee:ae:08:52:c3", "mac", "eth0", "eth0"),  # a Linux host: its MAC as ID, the interface as description
        ("541", "local", "ge-0/0/17", "ge-0/0/17"),  # Junos: the ifIndex as ID
        ("Ethernet1/1", "local", None, "Ethernet1/1"),
        ("541", "local", None, "541"),
        (None, None, "uplink", "uplink"),
    ],
)
def test_the_port_name_an_operator_uses(
    port_id: str | None, port_id_type: str | None, description: str | None, name: str
) -> None:
    neighbor = LinkNeighbor(
        local_interface="eth0", port_id=port_id, port_id_type=port_id_type, port_description=description
    )
    assert neighbor.port_name() == name


def _fabric() -> IbFabric:
    return IbFabric(
        switches=[IbSwitch(guid="b8cef60300a0b001", description="MF0;leaf01:MQM8700/U1", lid=2, port_count=40)],
        cas=[
            IbCa(guid="0c42a10300d1e001", description="gpu001 mlx5_0", port_count=1),
            IbCa(guid="0c42a10300d1e0ff", description="MT4123 ConnectX6 Mellanox Technologies", port_count=1),
        ],
        links=[
            IbLink(
                a=IbEnd(guid="0c42a10300d1e001", port=1), b=IbEnd(guid="b8cef60300a0b001", port=1), width=4, speed="HDR"
            ),
            IbLink(a=IbEnd(guid="0c42a10300d1e0ff", port=1), b=IbEnd(guid="b8cef60300a0b001", port=2)),
        ],
    )


def test_the_fabric_says_where_each_hca_is_plugged() -> None:
    fabric = _fabric()
    first, second = fabric.attachments()
    assert (first.host, first.device, first.switch_description, first.switch_port) == (
        None,
        None,
        "MF0;leaf01:MQM8700/U1",
        2,
    )
    assert (second.host, second.device, second.switch_port, second.width, second.speed) == (
        "gpu001",
        "mlx5_0",
        1,
        4,
        "HDR",
    )
    assert fabric.links[0].rate_gbps() == 200.0
    assert fabric.links[1].rate_gbps() is None
    assert fabric.digest() == IbFabric.model_validate_json(fabric.model_dump_json()).digest()


def test_fabric_bounds() -> None:
    with pytest.raises(ValidationError):
        IbSwitch(guid="0x2c9020040c7a8")  # GUIDs travel as 16 lower-case hex digits
    with pytest.raises(ValidationError):
        IbSwitch(guid="b8cef60300a0b001", description="x" * 65)  # a NodeDescription is 64 bytes
    with pytest.raises(ValidationError):
        IbEnd(guid="b8cef60300a0b001", port=256)
    with pytest.raises(ValidationError):
        IbLink(a=IbEnd(guid="b8cef60300a0b001", port=1), b=IbEnd(guid="b8cef60300a0b002", port=1), speed="FAST")
