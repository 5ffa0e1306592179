"""Shared file systems at the head: three nodes' samples from the agent's real storage collector over
simulated NFS mounts, through the channel's ingest path to the fleet view (GET /api/v1/storage), the
dashboard's Storage page, /metrics under node_exporter's names, and the storage alerts."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.agent.metrics.sampler import Sampler
from gpufleet.agent.storage.collector import StorageCollector
from gpufleet.core.clock import FakeClock
from gpufleet.core.db import transaction
from gpufleet.inventory import service as inventory
from gpufleet.monitoring import alerts
from gpufleet.sim.storage import SimulatedStorage
from tests.api.dashboard_helpers import logged_in

NODES = ("n1", "n2", "n3")


def _join(client: TestClient, name: str) -> int:
    join = client.post("/api/v1/tokens/join", json={"expires_in_s": 60}).json()["token"]
    body = {"name": name, "inventory": {"hostname": f"{name}.lab", "cpus": 8, "memory_total_mib": 1024, "gpus": []}}
    joined = client.post("/api/v1/agent/join", json=body, headers={"Authorization": f"Bearer {join}"})
    assert joined.status_code == 200, joined.text
    with transaction(client.app.state.ctx.sessions, readonly=True) as s:  # type: ignore[attr-defined]
        return inventory.get_node(s, name).id


class Fleet:
    """Three nodes, each with the agent's Sampler over a simulated /shared, sampled on the fake clock."""

    def __init__(self, client: TestClient, clock: FakeClock) -> None:
        self.ctx = client.app.state.ctx  # type: ignore[attr-defined]
        self.clock = clock
        self.ids = {name: _join(client, name) for name in NODES}
        self.storage = {name: SimulatedStorage(["/shared"], node=name, clock=clock.now) for name in NODES}
        self.samplers = {
            name: Sampler(
                [StorageCollector(self.storage[name], shared_mounts=["/shared"], required=["/shared"])],
                clock=clock.now,
            )
            for name in NODES
        }

    def round(self, seconds: float = 5.0) -> None:
        self.clock.advance(seconds)
        for name in NODES:
            sample, _ = self.samplers[name].collect()
            self.ctx.monitoring.ingest(self.ids[name], [sample])
        self.ctx.monitoring.health_once()


def _storage(client: TestClient, **params: str) -> list[dict[str, Any]]:
    answer = client.get("/api/v1/storage", params=params)
    assert answer.status_code == 200, answer.text
    result: list[dict[str, Any]] = answer.json()
    return result


def test_one_hung_node_is_told_from_a_hung_server(client: TestClient, clock: FakeClock) -> None:
    fleet = Fleet(client, clock)
    for _ in range(3):
        fleet.round()
    (shared,) = _storage(client)
    assert (shared["source"], shared["fstype"], shared["mountpoints"]) == (
        "storage01:/export/shared",
        "nfs4",
        ["/shared"],
    )
    assert shared["status"] == "ok"
    assert shared["verdict"] == "ok on all 3 node(s)"
    assert [n["node"] for n in shared["nodes"]] == list(NODES)
    node = shared["nodes"][0]
    assert node["state"] == "ok"
    assert node["required"]
    assert 0.5 < node["latency_ms"] < 1.5  # the simulated server's 0.8 ms round trips
    assert node["ops_per_s"] > 100
    assert node["used_pct"] > 50

    fleet.storage["n2"].inject("mount-hang")
    fleet.round()
    (shared,) = _storage(client)
    assert shared["status"] == "degraded"
    assert shared["verdict"].startswith("hung on 1 of 3 nodes (n2), fine on the others")
    assert {n["node"]: n["state"] for n in shared["nodes"]} == {"n1": "ok", "n2": "hung", "n3": "ok"}
    assert _storage(client, status="ok") == []
    with transaction(fleet.ctx.sessions, readonly=True) as s:
        firing = [(a.rule, a.node_name, a.labels.get("entity")) for a in alerts.list_alerts(s, status="firing")]
    assert ("StorageMountHung", "n2", "fs:/shared") in firing

    for name in ("n1", "n3"):
        fleet.storage[name].inject("mount-hang")
    fleet.round()
    (shared,) = _storage(client)
    assert shared["status"] == "down"
    assert shared["verdict"] == "hung on all 3 node(s): the server or the storage network"

    for name in NODES:
        fleet.storage[name].heal()
    fleet.round()
    fleet.round()
    assert _storage(client)[0]["status"] == "ok"
    with transaction(fleet.ctx.sessions, readonly=True) as s:
        assert not [a for a in alerts.list_alerts(s, status="firing") if a.rule == "StorageMountHung"]


def test_slow_on_one_node_against_its_own_baseline(client: TestClient, clock: FakeClock) -> None:
    fleet = Fleet(client, clock)
    for _ in range(15):  # past the baselines' warm-up
        fleet.round()
    fleet.storage["n3"].inject("mount-slow")
    for _ in range(3):
        fleet.round()
    (shared,) = _storage(client)
    assert shared["status"] == "slow"
    assert shared["verdict"].startswith("slow on 1 of 3 nodes (n3)")
    slow = {n["node"]: n for n in shared["nodes"]}["n3"]
    assert slow["slow"]
    assert slow["latency_ms"] > 5 * slow["baseline_ms"]
    with transaction(fleet.ctx.sessions, readonly=True) as s:
        firing = {(a.rule, a.node_name) for a in alerts.list_alerts(s, status="firing")}
    assert ("StorageSlow", "n3") in firing
    assert ("StorageSlow", "n1") not in firing

    for name in ("n1", "n2"):
        fleet.storage[name].inject("mount-slow")
    fleet.round()
    (shared,) = _storage(client)
    assert "slow everywhere (3 of 3 nodes)" in shared["verdict"]


def test_metrics_and_page_name_the_mount(client: TestClient, clock: FakeClock) -> None:
    fleet = Fleet(client, clock)
    fleet.round()
    fleet.round()
    response = client.get("/metrics")
    assert response.status_code == 200
    families = {f.name: f for f in text_string_to_metric_families(response.text)}
    size = [s for s in families["node_filesystem_size_bytes"].samples if s.labels["node"] == "n1"]
    assert size[0].labels == {
        "device": "storage01:/export/shared",
        "fstype": "nfs4",
        "mountpoint": "/shared",
        "node": "n1",
    }
    assert size[0].value == 500 * 2**40
    reads = [
        s
        for s in families["node_mountstats_nfs_operations_requests"].samples
        if s.labels["node"] == "n1" and s.labels["operation"] == "READ"
    ]
    assert reads[0].labels["export"] == "storage01:/export/shared"
    assert reads[0].labels["protocol"] == "tcp"
    assert reads[0].labels["mountaddr"] == "10.0.0.1"
    assert reads[0].value > 0
    assert "node_mountstats_nfs_operations_response_time_seconds" in families
    assert families["gpufleet_storage_mount_state"].samples[0].value == 0

    fleet.storage["n1"].inject("mount-stale")
    fleet.round()
    page = logged_in(client).get("/storage")
    assert page.status_code == 200
    assert "storage01:/export/shared" in page.text
    assert 'data-node="n1" data-state="stale"' in page.text
    assert "stale on 1 of 3 nodes (n1)" in page.text
    assert 'href="/storage"' in page.text  # in the navigation


def test_fill_over_the_threshold_fires_and_resolves_below_it_less_two_points(
    client: TestClient, clock: FakeClock
) -> None:
    fleet = Fleet(client, clock)
    watch = fleet.ctx.monitoring.judge.storage
    fleet.round()
    (shared,) = _storage(client)
    used = shared["nodes"][0]["used_pct"]
    assert 60 < used < 62  # the simulated export: 60 % of its blocks used, 5 % reserved (df's Use%)
    assert "full" not in shared["verdict"]

    def full() -> set[str]:
        with transaction(fleet.ctx.sessions, readonly=True) as s:
            return {a.node_name for a in alerts.list_alerts(s, status="firing") if a.rule == "StorageAlmostFull"}

    assert full() == set()
    watch.fill_pct = 60.0  # storage_fill_alert_pct
    fleet.round()
    assert full() == set(NODES)
    (shared,) = _storage(client)
    assert shared["status"] == "ok"  # full is said, not a state of the mount
    assert shared["verdict"] == f"ok on all 3 node(s); {shared['used_pct']:.0f} % full"
    with transaction(fleet.ctx.sessions, readonly=True) as s:
        (alert,) = [a for a in alerts.list_alerts(s, status="firing") if a.node_name == "n1"]
    assert alert.summary == f"/shared (nfs4 from storage01:/export/shared) is {used:.0f} % full"
    assert alert.labels.get("entity") == "fs:/shared"
    watch.fill_pct = 62.0  # above the fill now, but not by 2 points: still firing
    fleet.round()
    assert full() == set(NODES)
    watch.fill_pct = 64.0
    fleet.round()
    assert full() == set()
