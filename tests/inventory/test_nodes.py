import pytest
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.core.clock import FakeClock
from gpufleet.core.db import transaction
from gpufleet.core.errors import Conflict, InvalidInput, NotFound
from gpufleet.inventory import service as inventory
from gpufleet.inventory.schemas import NodeSettings
from gpufleet.inventory.states import NodeState
from gpufleet.protocol.inventory import GpuInfo, NodeInventory


def _inventory(gpus: int, model: str = "NVIDIA H200") -> NodeInventory:
    return NodeInventory(
        hostname="n1",
        cpus=128,
        memory_total_mib=1024,
        gpu_source="nvml",
        gpus=[
            GpuInfo(index=i, uuid=f"GPU-{i}", model=model, pci_bus_id=f"00000000:{i:02x}:00.0", memory_total_mib=143771)
            for i in range(gpus)
        ],
    )


def test_add_expands_hostlists_and_rejects_duplicates_atomically(
    sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    with transaction(sessions) as s:
        added = inventory.add_nodes(s, clock, ["gpu[001-004]"], NodeSettings(category="h200", labels={"rack": "r1"}))
    assert [n.name for n in added] == ["gpu001", "gpu002", "gpu003", "gpu004"]
    assert all(n.state is NodeState.NEW for n in added)
    with pytest.raises(Conflict, match="gpu004"), transaction(sessions) as s:
        inventory.add_nodes(s, clock, ["gpu[004-006]"], NodeSettings())
    with transaction(sessions) as s:
        assert [n.name for n in inventory.list_nodes(s)] == ["gpu001", "gpu002", "gpu003", "gpu004"]


@pytest.mark.parametrize("bad", ["gpu[1-", "bad name", "-leading-dash", "x" * 64])
def test_invalid_names_change_nothing(sessions: sessionmaker[Session], clock: FakeClock, bad: str) -> None:
    with pytest.raises(InvalidInput), transaction(sessions) as s:
        inventory.add_nodes(s, clock, ["ok1", bad], NodeSettings())
    with transaction(sessions) as s:
        assert inventory.list_nodes(s) == []


def test_remove_is_all_or_nothing(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    with transaction(sessions) as s:
        inventory.add_nodes(s, clock, ["n[1-3]"], NodeSettings())
    with pytest.raises(NotFound, match="n9"), transaction(sessions) as s:
        inventory.remove_nodes(s, ["n1", "n9"])
    with transaction(sessions) as s:
        assert len(inventory.list_nodes(s)) == 3
        assert list(inventory.remove_nodes(s, ["n[1-2]"])) == ["n1", "n2"]
    with transaction(sessions) as s:
        assert [n.name for n in inventory.list_nodes(s)] == ["n3"]


def test_clone_copies_settings_not_inventory(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    with transaction(sessions) as s:
        src = inventory.add_nodes(s, clock, ["src"], NodeSettings(category="h200", labels={"rack": "r7"}))[0]
        inventory.apply_inventory(s, clock, src, _inventory(8))
    with transaction(sessions) as s:
        clones = inventory.clone_node(s, clock, "src", ["c[1-2]"])
        assert [(c.name, c.category, c.labels, len(c.gpus)) for c in clones] == [
            ("c1", "h200", {"rack": "r7"}, 0),
            ("c2", "h200", {"rack": "r7"}, 0),
        ]
    with pytest.raises(NotFound), transaction(sessions) as s:
        inventory.clone_node(s, clock, "nope", ["c3"])


def test_inventory_replaces_gpus_and_reports_change(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    with transaction(sessions) as s:
        node = inventory.add_nodes(s, clock, ["n1"], NodeSettings())[0]
        assert inventory.apply_inventory(s, clock, node, _inventory(8))
        assert not inventory.apply_inventory(s, clock, node, _inventory(8))  # same content: no write
        assert inventory.apply_inventory(s, clock, node, _inventory(7))  # a GPU fell off
    with transaction(sessions) as s:
        detail = inventory.to_detail(s, inventory.get_node(s, "n1"))
    assert detail.gpu_count == 7
    assert [g.index for g in detail.gpus] == list(range(7))


def test_transition_is_conditional_and_recorded(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    with transaction(sessions) as s:
        node = inventory.add_nodes(s, clock, ["n1"], NodeSettings())[0]
        assert inventory.transition(s, clock, node.id, NodeState.NEW, NodeState.UP, "first heartbeat")
        assert not inventory.transition(s, clock, node.id, NodeState.NEW, NodeState.UP, "stale")
    with pytest.raises(Conflict), transaction(sessions) as s:
        inventory.transition(s, clock, node.id, NodeState.NEW, NodeState.DOWN, "not allowed")
    with transaction(sessions) as s:
        detail = inventory.to_detail(s, inventory.get_node(s, "n1"))
    assert detail.state is NodeState.UP
    assert [(t.from_state, t.to_state, t.reason) for t in detail.transitions] == [
        (NodeState.NEW, NodeState.UP, "first heartbeat")
    ]
