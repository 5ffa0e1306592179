"""Health, drains, alerts, silences and receivers over HTTP: shapes, refusals, secrets."""

import pytest
from fastapi.testclient import TestClient

from gpufleet.core.db import transaction
from gpufleet.inventory import service as inventory
from gpufleet.protocol.metrics import EntityValues, Sample

# One database: HTTP translation (tests/monitoring runs both).
pytestmark = pytest.mark.one_database


def test_a_manual_drain_is_shown_and_resumed(client: TestClient) -> None:
    client.post("/api/v1/nodes", json={"names": ["n1"]})
    drained = client.post("/api/v1/nodes/n1/drain", json={"reason": "swapping a fan"})
    assert drained.status_code == 200
    assert drained.json()["drained"] is True
    assert drained.json()["drained_by"] == "token:initial admin#1"
    assert client.get("/api/v1/nodes/n1/health").json()["drain_reason"] == "swapping a fan"
    assert client.get("/api/v1/nodes").json()[0]["drain_reason"] == "swapping a fan"
    posing = client.post("/api/v1/nodes/n1/drain", json={"reason": "gpufleet: fake"})
    assert posing.status_code == 400
    assert client.post("/api/v1/nodes/n1/resume").json()["drained"] is False
    assert client.post("/api/v1/nodes/n1/resume").status_code == 409
    assert client.post("/api/v1/nodes/nope/drain", json={"reason": "x"}).status_code == 404


def test_health_lists_every_node(client: TestClient) -> None:
    client.post("/api/v1/nodes", json={"names": ["n[1-3]"]})
    rows = client.get("/api/v1/health", params={"names": "n[1-2]"}).json()
    assert [(r["node"], r["health"], r["reasons"]) for r in rows] == [("n1", "unknown", []), ("n2", "unknown", [])]


def test_metrics_sent_on_the_channel_are_stored_and_queried(client: TestClient) -> None:
    join = client.post("/api/v1/tokens/join", json={"expires_in_s": 60}).json()["token"]
    client.post("/api/v1/agent/join", json={"name": "n1"}, headers={"Authorization": f"Bearer {join}"})
    ctx = client.app.state.ctx  # type: ignore[attr-defined]
    now = ctx.clock.now()
    samples = [
        Sample(ts=now - 30 + i, entities=[EntityValues(entity="gpu:0", values={"gpu_util": float(i)})])
        for i in range(10)
    ]
    ctx.monitoring.ingest(_id(client, "n1"), samples)
    assert ctx.monitoring.flush_metrics_once() == 10  # one row per sample
    series = client.get(
        "/api/v1/nodes/n1/metrics", params={"entity": "gpu:0", "metric": "gpu_util", "since": "1m", "step": "1m"}
    ).json()
    assert [p["value"] for p in series["points"]] == [4.5]
    bad = client.get("/api/v1/nodes/n1/metrics", params={"metric": "gpu_util", "since": "soon"})
    assert bad.status_code == 400


def _id(client: TestClient, name: str) -> int:
    with transaction(client.app.state.ctx.sessions, readonly=True) as s:  # type: ignore[attr-defined]
        return inventory.get_node(s, name).id


def test_a_fault_for_a_node_without_a_channel_is_a_conflict(client: TestClient) -> None:
    client.post("/api/v1/nodes", json={"names": ["n1"]})
    response = client.post("/api/v1/nodes/n1/faults", json={"action": "inject", "kind": "xid79"})
    assert response.status_code == 409
    assert "no open channel" in response.json()["detail"]
    assert client.post("/api/v1/nodes/n1/faults", json={"action": "inject"}).status_code == 400
    assert client.post("/api/v1/nodes/n1/faults", json={"kind": "meteor"}).status_code == 422


def test_alerts_ack_and_silences(client: TestClient) -> None:
    assert client.get("/api/v1/alerts").json() == []
    assert client.post("/api/v1/alerts/99/ack").status_code == 404
    created = client.post(
        "/api/v1/silences", json={"rule": "NodeDown", "node": "n1", "duration_s": 3600, "comment": "rack work"}
    )
    assert created.status_code == 201
    assert created.json()["author"] == "token:initial admin#1"
    assert [s["comment"] for s in client.get("/api/v1/silences").json()] == ["rack work"]
    nothing = client.post("/api/v1/silences", json={"duration_s": 3600, "comment": "everything"})
    assert nothing.status_code == 400


def test_receivers_keep_their_secrets(client: TestClient) -> None:
    slack = {"type": "slack", "name": "ops", "url": "https://hooks.slack.com/services/T000/B000/very-secret"}
    created = client.post("/api/v1/alert-receivers", json=slack)
    assert created.status_code == 201
    assert "very-secret" not in created.text
    assert client.post("/api/v1/alert-receivers", json=slack).status_code == 409
    listed = client.get("/api/v1/alert-receivers")
    assert "very-secret" not in listed.text
    assert [r["name"] for r in listed.json()] == ["ops"]
    bad = client.post("/api/v1/alert-receivers", json={"type": "webhook", "name": "x", "url": "ftp://nope"})
    assert bad.status_code == 400
    assert client.delete("/api/v1/alert-receivers/ops").status_code == 204
    assert client.delete("/api/v1/alert-receivers/ops").status_code == 404


def test_alert_rules_are_checked_and_builtins_stay(client: TestClient) -> None:
    names = [r["name"] for r in client.get("/api/v1/alert-rules").json()]
    assert "GpuTemperatureHigh" in names
    rule = {"name": "GpuPowerLow", "metric": "power_w", "entity_kind": "gpu", "op": "<", "threshold": 50, "for_s": 600}
    created = client.post("/api/v1/alert-rules", json=rule)
    assert created.status_code == 201
    assert created.json()["created_by"] == "token:initial admin#1"
    assert client.post("/api/v1/alert-rules", json=rule).status_code == 409
    typo = client.post("/api/v1/alert-rules", json=rule | {"name": "X", "metric": "gpu_temperature"})
    assert typo.status_code == 400
    assert "no metric 'gpu_temperature'" in typo.json()["detail"]
    assert client.delete("/api/v1/alert-rules/GpuTemperatureHigh").status_code == 409
    assert client.delete("/api/v1/alert-rules/GpuPowerLow").status_code == 204
    assert client.delete("/api/v1/alert-rules/GpuPowerLow").status_code == 404


def test_health_policies_per_category(client: TestClient) -> None:
    policy = {"disabled": ["pcie"], "gpu_temp_c": 80}
    saved = client.put("/api/v1/health-policies/hgx", json=policy)
    assert saved.status_code == 200
    assert saved.json()["policy"]["gpu_temp_c"] == 80
    assert saved.json()["policy"]["disabled"] == ["pcie"]
    assert client.put("/api/v1/health-policies/hgx", json={"gpu_temp_c": "hot"}).status_code == 422
    assert client.put("/api/v1/health-policies/hgx", json={"xid_actions": {"31": "boom"}}).status_code == 422
    strict = client.put("/api/v1/health-policies/hgx", json=policy | {"xid_actions": {"31": "drain"}})
    assert strict.json()["policy"]["xid_actions"] == {"31": "drain"}
    assert client.put("/api/v1/health-policies/bad%20name", json=policy).status_code == 422
    assert [p["category"] for p in client.get("/api/v1/health-policies").json()] == ["hgx"]
    assert client.delete("/api/v1/health-policies/hgx").status_code == 204
    assert client.delete("/api/v1/health-policies/hgx").status_code == 404


def test_an_id_past_64_bits_is_refused_not_a_server_error(client: TestClient) -> None:
    for path in ("/api/v1/alerts/167763365706924781035585536/ack", "/api/v1/tokens/167763365706924781035585536"):
        method = client.post if path.endswith("/ack") else client.delete
        assert method(path).status_code == 422, path
