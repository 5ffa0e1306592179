"""The switches API: register a switch (secrets write-only, bad credentials refused with the reason), list,
show and remove it, and where a node is plugged; the Network pages and the CLI over the same routes."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.core.clock import FakeClock
from gpufleet.core.db import transaction
from gpufleet.inventory import service as inventory
from gpufleet.inventory.schemas import NodeSettings
from gpufleet.protocol.inventory import NodeInventory
from gpufleet.protocol.topology import LinkNeighbor
from tests.api.dashboard_helpers import logged_in

# One database: HTTP translation (tests/network/test_switch_service.py runs both).
pytestmark = pytest.mark.one_database

V3 = {
    "name": "spine01",
    "address": "fd00::2",
    "version": "3",
    "v3_user": "gpufleet",
    "v3_auth_protocol": "sha256",
    "v3_auth_key": "auth-key-1234",
    "v3_priv_protocol": "aes",
    "v3_priv_key": "priv-key-5678",
}


def test_a_switch_is_registered_listed_shown_and_removed_without_its_secrets(client: TestClient) -> None:
    created = client.post("/api/v1/switches", json={"name": "leaf01", "address": "10.0.0.2", "community": "s3cret"})
    assert created.status_code == 201, created.text
    assert (created.json()["name"], created.json()["version"], created.json()["ports"]) == ("leaf01", "2c", [])
    assert client.post("/api/v1/switches", json=V3).status_code == 201
    listed = client.get("/api/v1/switches")
    assert [s["name"] for s in listed.json()] == ["leaf01", "spine01"]
    shown = client.get("/api/v1/switches/spine01").json()
    assert (shown["v3_user"], shown["v3_auth_protocol"], shown["v3_priv_protocol"]) == ("gpufleet", "sha256", "aes")
    for body in (listed.text, created.text, client.get("/api/v1/switches/spine01").text):
        assert "s3cret" not in body
        assert "key-" not in body
    again = client.post("/api/v1/switches", json={"name": "leaf01", "address": "10.0.0.9", "community": "x"})
    assert again.status_code == 409
    assert client.delete("/api/v1/switches/leaf01").status_code == 204
    assert client.get("/api/v1/switches/leaf01").status_code == 404
    audit = client.get("/api/v1/audit").json()
    assert any(r["target"] == "leaf01: 10.0.0.2:161 v2c" for r in audit)


def test_a_credential_that_cannot_work_is_refused_with_the_reason(client: TestClient) -> None:
    answer = client.post("/api/v1/switches", json={"name": "leaf01", "address": "10.0.0.2", "version": "3"})
    assert answer.status_code == 422
    assert "SNMP v3 needs a user" in answer.text
    mixed = client.post(
        "/api/v1/switches", json={"name": "leaf01", "address": "10.0.0.2", "community": "c", "v3_user": "u"}
    )
    assert mixed.status_code == 422
    assert client.get("/api/v1/switches").json() == []


def test_a_nodes_links_and_the_network_pages(
    client: TestClient, sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    with transaction(sessions) as s:
        inventory.add_nodes(s, clock, ["gpu001"], NodeSettings())
    assert client.get("/api/v1/nodes/gpu001/links").json() == []
    assert client.get("/api/v1/nodes/nope/links").status_code == 404
    client.post("/api/v1/switches", json={"name": "leaf01", "address": "10.0.0.2", "community": "s3cret"})
    browser = logged_in(client)  # a viewer: reads nodes, so switches
    page = browser.get("/switches")
    assert page.status_code == 200
    assert 'id="switch-leaf01"' in page.text
    assert 'href="/switches"' in page.text  # the Network item in the top bar
    one = browser.get("/switches/leaf01")
    assert one.status_code == 200
    assert "No port polled yet." in one.text
    assert "s3cret" not in page.text + one.text
    assert browser.get("/switches/nope").status_code == 404
    node = browser.get("/nodes/gpu001")
    assert "not known (no LLDP from the node or its switch)" in node.text


def test_a_node_says_where_its_own_ports_are_plugged(client: TestClient) -> None:
    client.post("/api/v1/switches", json={"name": "leaf01", "address": "10.0.0.2", "community": "s3cret"})
    join = client.post("/api/v1/tokens/join", json={"expires_in_s": 600, "uses": 2}).json()["token"]
    neighbor = LinkNeighbor(local_interface="eth0", system_name="leaf01.lab", port_id="swp1", port_id_type="ifname")
    report = NodeInventory(hostname="gpu001", cpus=8, memory_total_mib=1000, neighbors=[neighbor])
    joined = client.post(
        "/api/v1/agent/join",
        json={"name": "gpu001", "inventory": report.model_dump(mode="json")},
        headers={"Authorization": f"Bearer {join}"},
    )
    assert joined.status_code == 200, joined.text
    links = client.get("/api/v1/nodes/gpu001/links").json()
    assert [(ln["interface"], ln["switch"], ln["switch_port"], ln["seen_by"]) for ln in links] == [
        ("eth0", "leaf01", "swp1", ["node"])
    ]
    # a later report replaces the earlier one: eth0 unplugged, eth1 now on swp3
    headers = {"Authorization": f"Bearer {joined.json()['credential']}"}
    moved = report.model_copy(
        update={"neighbors": [neighbor.model_copy(update={"local_interface": "eth1", "port_id": "swp3"})]}
    )
    assert client.put("/api/v1/agent/inventory", content=moved.model_dump_json(), headers=headers).status_code == 204
    links = client.get("/api/v1/nodes/gpu001/links").json()
    assert [(ln["interface"], ln["switch_port"]) for ln in links] == [("eth1", "swp3")]
    # the node names only itself: another node's links are untouched by its report
    other = client.post("/api/v1/agent/join", json={"name": "gpu002"}, headers={"Authorization": f"Bearer {join}"})
    assert other.status_code == 200
    assert client.get("/api/v1/nodes/gpu002/links").json() == []
