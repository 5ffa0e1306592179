"""GET /api/v1/slurm/config: the inventory rendered as slurm.conf lines and gres.conf, over the real app."""

from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.auth import service as auth
from gpufleet.auth.policy import Role
from gpufleet.core.clock import FakeClock
from gpufleet.core.db import transaction
from gpufleet.inventory import service as inventory
from gpufleet.inventory.schemas import NodeSettings
from gpufleet.protocol.inventory import GpuInfo, NodeInventory


def _report(sessions: sessionmaker[Session], clock: FakeClock, names: str, category: str | None, gpus: int) -> None:
    with transaction(sessions) as s:
        for row in inventory.add_nodes(s, clock, [names], NodeSettings(category=category)):
            report = NodeInventory(
                hostname=row.name,
                cpus=224,
                memory_total_mib=2063937,
                gpu_source="simulated",
                gpus=[
                    GpuInfo(
                        index=i,
                        uuid=f"GPU-{row.name}-{i}",
                        model="NVIDIA H200",
                        pci_bus_id=f"0:{i}:0.0",
                        memory_total_mib=1,
                    )
                    for i in range(gpus)
                ],
            )
            inventory.apply_inventory(s, clock, row, report)


def test_the_inventory_rendered(client: TestClient, sessions: sessionmaker[Session], clock: FakeClock) -> None:
    _report(sessions, clock, "gpu[001-004]", "h200", 8)
    with transaction(sessions) as s:
        inventory.add_nodes(s, clock, ["gpu005"], NodeSettings(category="h200"))  # never reported
    response = client.get("/api/v1/slurm/config")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["slurm_conf"].splitlines()[1:] == [
        "NodeName=gpu[001-004] CPUs=224 RealMemory=2063360 Gres=gpu:h200:8",
        "PartitionName=all Nodes=gpu[001-004] Default=YES State=UP",
        "PartitionName=h200 Nodes=gpu[001-004] State=UP",
    ]
    assert body["gres_conf"].splitlines()[-1] == "NodeName=gpu[001-004] Name=gpu Type=h200 File=/dev/nvidia[0-7]"
    assert body["nodes"] == ["gpu001", "gpu002", "gpu003", "gpu004"]
    assert body["partitions"] == ["all", "h200"]
    assert body["skipped"] == [{"name": "gpu005", "reason": "no inventory reported yet (the agent has not joined)"}]
    assert body["warnings"] == []


def test_a_viewer_may_read_it(client: TestClient, sessions: sessionmaker[Session], clock: FakeClock) -> None:
    with transaction(sessions) as s:
        viewer = auth.create_api_token(s, clock, "viewer", Role.VIEWER, None)
    response = client.get("/api/v1/slurm/config", headers={"Authorization": f"Bearer {viewer}"})
    assert response.status_code == 200


def test_the_default_partition_is_chosen_and_checked(
    client: TestClient, sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    _report(sessions, clock, "gpu001", "h200", 1)
    renamed = client.get("/api/v1/slurm/config", params={"default_partition": "batch"}).json()
    assert "PartitionName=batch Nodes=gpu001 Default=YES State=UP" in renamed["slurm_conf"]
    for bad, message in [("h200", "has the default partition's name"), ("a b", "invalid partition name")]:
        response = client.get("/api/v1/slurm/config", params={"default_partition": bad})
        assert response.status_code == 400
        assert message in response.json()["detail"]
    assert client.get("/api/v1/slurm/config", params={"default_partition": "x" * 64}).status_code == 422
