"""GET /metrics: authenticated like the API, the fleet under dcgm-exporter's names, labels from the
inventory, node state and alerts from the database, GPU values from this replica's tracker."""

from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import update

from gpufleet.core.clock import FakeClock, to_datetime
from gpufleet.core.db import transaction
from gpufleet.inventory import service as inventory
from gpufleet.inventory.models import Node
from gpufleet.inventory.states import NodeState
from gpufleet.jobs.models import Job, JobState
from gpufleet.monitoring import alerts
from gpufleet.protocol.metrics import EntityValues, GpuJob, Sample

# One database: exposition over stored rows.
pytestmark = pytest.mark.one_database


def _gpu(index: int) -> dict[str, Any]:
    return {
        "index": index,
        "uuid": f"GPU-{index:08d}-1111-2222-3333-444444444444",
        "model": "NVIDIA H200",
        "pci_bus_id": f"00000000:{0x18 + index:02X}:00.0",
        "memory_total_mib": 143771,
        "driver_version": "580.95.05",
    }


def _join(client: TestClient, name: str, gpus: int) -> tuple[int, str]:
    """A node that joined with an inventory of `gpus` GPUs: (node id, its credential)."""
    join = client.post("/api/v1/tokens/join", json={"expires_in_s": 60}).json()["token"]
    body = {"name": name, "inventory": {"hostname": f"{name}.lab", "cpus": 8, "memory_total_mib": 1024, "gpus": []}}
    body["inventory"]["gpus"] = [_gpu(i) for i in range(gpus)]
    joined = client.post("/api/v1/agent/join", json=body, headers={"Authorization": f"Bearer {join}"})
    assert joined.status_code == 200, joined.text
    with transaction(client.app.state.ctx.sessions, readonly=True) as s:  # type: ignore[attr-defined]
        return inventory.get_node(s, name).id, joined.json()["credential"]


def _scrape(client: TestClient, **headers: str) -> dict[str, Any]:
    response = client.get("/metrics", headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    return {f.name: f for f in text_string_to_metric_families(response.text)}


def _values(family: Any) -> dict[tuple[tuple[str, str], ...], float]:
    return {tuple(sorted(s.labels.items())): s.value for s in family.samples}


def test_metrics_needs_a_token_with_metrics_read(client: TestClient) -> None:
    _, credential = _join(client, "n1", 0)
    assert client.get("/metrics", headers={"Authorization": ""}).status_code == 401
    assert client.get("/metrics", headers={"Authorization": "Bearer gfa_wrong"}).status_code == 401
    assert client.get("/metrics", headers={"Authorization": f"Bearer {credential}"}).status_code == 403
    client.post("/api/v1/users", json={"username": "prometheus", "role": "viewer"})
    read = client.post("/api/v1/tokens/user", json={"user": "prometheus", "scope": "read"}).json()["token"]
    assert "gpufleet_node_up" in _scrape(client, Authorization=f"Bearer {read}")


def test_metrics_exposes_the_fleet_under_dcgm_names(client: TestClient, clock: FakeClock) -> None:
    ctx = client.app.state.ctx  # type: ignore[attr-defined]
    n1, _ = _join(client, "n1", 2)
    client.post("/api/v1/nodes", json={"names": ["n2"]})  # registered, never heard from
    sample = Sample(
        ts=clock.now(),
        entities=[
            EntityValues(entity="gpu:0", values={"gpu_util": 93.0, "gpu_temp_c": 71.0, "energy_mj": 5e9}),
            EntityValues(entity="gpu:1", values={"gpu_util": 12.0, "xid_last": 79.0}),
            EntityValues(entity="host", values={"load1": 3.0}),
            EntityValues(entity="ib:mlx5_0/1", values={"ib_state": 4.0}),
        ],
    )
    ctx.monitoring.ingest(n1, [sample])
    with transaction(ctx.sessions) as s:
        s.execute(
            update(Node)
            .where(Node.id == n1)
            .values(state=NodeState.UP, health="failed", drained_at=to_datetime(clock.now()))
        )
        alerts.fire(s, clock, "NodeFailed", n1, "n1", "GPU 1: Xid 79")

    families = _scrape(client)
    util = _values(families["DCGM_FI_DEV_GPU_UTIL"])
    gpu0 = {
        "gpu": "0",
        "UUID": _gpu(0)["uuid"],
        "pci_bus_id": "00000000:18:00.0",
        "device": "nvidia0",
        "modelName": "NVIDIA H200",
        "Hostname": "n1.lab",
        "DCGM_FI_DRIVER_VERSION": "580.95.05",
        "node": "n1",
    }
    assert util[tuple(sorted(gpu0.items()))] == 93.0
    assert len(util) == 2
    assert list(_values(families["DCGM_FI_DEV_XID_ERRORS"]).values()) == [79.0]
    assert families["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"].type == "counter"
    assert _values(families["gpufleet_load1"]) == {(("node", "n1"),): 3.0}
    assert _values(families["gpufleet_node_up"]) == {(("node", "n1"),): 1.0}  # n2: never heard from
    assert _values(families["gpufleet_node_health"]) == {(("node", "n1"),): 2.0}  # n2: not judged yet
    assert _values(families["gpufleet_node_drained"]) == {(("node", "n1"),): 1.0, (("node", "n2"),): 0.0}
    assert _values(families["gpufleet_node_gpus_expected"])[(("node", "n1"),)] == 2.0
    firing = _values(families["gpufleet_alerts_firing"])
    assert firing[(("alertname", "NodeFailed"), ("severity", "critical"))] == 1.0
    assert firing[(("alertname", "NodeDown"), ("severity", "critical"))] == 0.0


def test_a_node_held_by_another_replica_keeps_only_its_database_series(client: TestClient, clock: FakeClock) -> None:
    ctx = client.app.state.ctx  # type: ignore[attr-defined]
    n1, _ = _join(client, "n1", 1)
    ctx.monitoring.ingest(
        n1, [Sample(ts=clock.now(), entities=[EntityValues(entity="gpu:0", values={"gpu_util": 5.0})])]
    )
    assert "DCGM_FI_DEV_GPU_UTIL" in _scrape(client)
    ctx.monitoring.tracker.forget(n1)  # what closing its channel here does
    families = _scrape(client)
    assert "DCGM_FI_DEV_GPU_UTIL" not in families
    assert _values(families["gpufleet_node_drained"]) == {(("node", "n1"),): 0.0}


def test_metrics_are_gzipped_when_the_scraper_asks(client: TestClient) -> None:
    client.post("/api/v1/nodes", json={"names": ["n1"]})
    zipped = client.get("/metrics", headers={"Accept-Encoding": "gzip"})
    plain = client.get("/metrics", headers={"Accept-Encoding": "identity"})
    assert zipped.headers["content-encoding"] == "gzip"
    assert "content-encoding" not in plain.headers
    assert zipped.text == plain.text  # httpx decodes what it asked for
    assert 'gpufleet_node_drained{node="n1"} 0.0' in plain.text


def test_a_gpu_held_by_a_job_carries_its_id_and_the_job_its_user_and_project(
    client: TestClient, clock: FakeClock
) -> None:
    ctx = client.app.state.ctx  # type: ignore[attr-defined]
    n1, _ = _join(client, "n1", 2)
    with transaction(ctx.sessions) as s:
        s.execute(update(Node).where(Node.id == n1).values(state=NodeState.UP, health="healthy"))
    client.post("/api/v1/users", json={"username": "alice"})
    client.post("/api/v1/projects", json={"name": "vision"})
    client.post("/api/v1/projects/vision/members", json={"user": "alice"})
    submitted = client.post("/api/v1/jobs", json={"user": "alice", "gpus_per_node": 1, "argv": ["train"]})
    assert submitted.status_code == 201, submitted.text
    job_id = str(submitted.json()["id"])
    ctx.loops.lead_once()
    assert ctx.jobs.schedule_once().placed == [int(job_id)]
    values = {"gpu_util": 50.0}
    sample = Sample(ts=clock.now(), entities=[EntityValues(entity=f"gpu:{i}", values=values) for i in range(2)])
    ctx.monitoring.ingest(n1, [sample])

    families = _scrape(client)
    held = {
        labels: v for labels, v in _values(families["DCGM_FI_DEV_GPU_UTIL"]).items() if ("hpc_job", job_id) in labels
    }
    assert len(held) == 1  # the one GPU it holds; the other has no hpc_job label
    assert len(_values(families["DCGM_FI_DEV_GPU_UTIL"])) == 2
    info = _values(families["gpufleet_job_info"])
    assert info == {(("hpc_job", job_id), ("project", "vision"), ("user", "alice")): 1.0}


def test_a_gpu_held_by_a_slurm_job_carries_its_id_and_the_account_as_project(
    client: TestClient, clock: FakeClock
) -> None:
    ctx = client.app.state.ctx  # type: ignore[attr-defined]
    n1, _ = _join(client, "n1", 3)
    n2, _ = _join(client, "n2", 1)
    values = {"gpu_util": 50.0}
    mapped = [
        GpuJob(gpu=0, job="9001", user="alice", account="vision"),
        GpuJob(gpu=2, job="9001", user="alice", account="vision"),
    ]
    sample = Sample(
        ts=clock.now(), entities=[EntityValues(entity=f"gpu:{i}", values=values) for i in range(3)], gpu_jobs=mapped
    )
    ctx.monitoring.ingest(n1, [sample])
    # The same job's rank on another node, and a job without an account (Slurm without accounting).
    other = [GpuJob(gpu=0, job="9001", user="alice", account="vision"), GpuJob(gpu=0, job="9002", user="bob")]
    ctx.monitoring.ingest(
        n2, [Sample(ts=clock.now(), entities=[EntityValues(entity="gpu:0", values=values)], gpu_jobs=other)]
    )

    families = _scrape(client)
    util = {
        (labels["node"], labels["gpu"]): labels.get("hpc_job")
        for labels in (dict(s.labels) for s in families["DCGM_FI_DEV_GPU_UTIL"].samples)
    }
    assert util == {("n1", "0"): "9001", ("n1", "1"): None, ("n1", "2"): "9001", ("n2", "0"): "9001"}
    assert _values(families["gpufleet_job_info"]) == {
        (("hpc_job", "9001"), ("project", "vision"), ("user", "alice")): 1.0,
        (("hpc_job", "9002"), ("project", ""), ("user", "bob")): 1.0,
    }

    # The job ended: the next sample maps nothing, and the labels go with it.
    ctx.monitoring.ingest(n1, [Sample(ts=clock.now() + 5, entities=sample.entities)])
    ctx.monitoring.ingest(n2, [Sample(ts=clock.now() + 5, entities=[EntityValues(entity="gpu:0", values=values)])])
    families = _scrape(client)
    assert all("hpc_job" not in s.labels for s in families["DCGM_FI_DEV_GPU_UTIL"].samples)
    assert _values(families["gpufleet_job_info"]) == {}


def test_a_job_gpufleet_submitted_to_slurm_is_known_by_slurms_id(client: TestClient, clock: FakeClock) -> None:
    """Its GPUs carry Slurm's id (from the prolog's map), so its info series does too, with gpufleet's user
    and project: gpufleet's job 1 is Slurm's job 2, and Slurm's job 1 is gpufleet's job 2."""
    ctx = client.app.state.ctx  # type: ignore[attr-defined]
    n1, _ = _join(client, "n1", 1)
    with transaction(ctx.sessions) as s:
        for user, project, slurm_id in (("alice", "vision", "2"), ("bob", None, "1")):
            s.add(
                Job(
                    user=user,
                    project=project,
                    submitted_by="token:admin",
                    state=JobState.RUNNING,
                    time_limit_s=60,
                    argv=["true"],
                    env={},
                    backend="slurm",
                    external_id=slurm_id,
                    submitted_at=to_datetime(clock.now()),
                )
            )
            s.flush()
    mapped = [GpuJob(gpu=0, job="1", user="bob", account="")]
    entities = [EntityValues(entity="gpu:0", values={"gpu_util": 9.0})]
    ctx.monitoring.ingest(n1, [Sample(ts=clock.now(), entities=entities, gpu_jobs=mapped)])
    families = _scrape(client)
    assert [dict(s.labels)["hpc_job"] for s in families["DCGM_FI_DEV_GPU_UTIL"].samples] == ["1"]
    assert _values(families["gpufleet_job_info"]) == {
        (("hpc_job", "1"), ("project", ""), ("user", "bob")): 1.0,
        (("hpc_job", "2"), ("project", "vision"), ("user", "alice")): 1.0,
    }
