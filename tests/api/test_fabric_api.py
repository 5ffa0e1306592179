"""The InfiniBand fabric at the head: a node's agent PUTs what its ibnetdiscover sees (real outputs, from
tests/fixtures/topology), `GET /api/v1/fabric` shows the newest report, a node's links name the IB switch
and port each of its HCAs is cabled to, and the Network pages show it. Only a node credential reports; a
malformed (400, as a malformed inventory) or oversize (413) report is refused and nothing is stored."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.agent.topology.ibnet import parse_ibnetdiscover
from gpufleet.core.db import transaction
from gpufleet.network.models import IbFabricReport
from gpufleet.protocol.inventory import NodeInventory
from gpufleet.protocol.topology import MAX_FABRIC_BYTES, IbFabric
from tests.api.dashboard_helpers import logged_in

# One database: HTTP translation (the ib_fabrics table is migrated and checked on both in tests/core/test_db.py).
pytestmark = pytest.mark.one_database

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "topology"
HDR = parse_ibnetdiscover((FIXTURES / "ibnetdiscover-44.0-ibsim-hdr-leaf-spine.txt").read_text())
LEAF01 = "MF0;leaf01:MQM8700/U1"
LEAF02 = "MF0;leaf02:MQM8700/U1"


def _join(client: TestClient, name: str, hostname: str | None = None) -> dict[str, str]:
    """A node joined through the agent route; its credential's header."""
    token = client.post("/api/v1/tokens/join", json={"expires_in_s": 600}).json()["token"]
    inventory = NodeInventory(hostname=hostname, cpus=8, memory_total_mib=1000) if hostname else None
    body = {"name": name, "inventory": inventory.model_dump(mode="json") if inventory else None}
    joined = client.post("/api/v1/agent/join", json=body, headers={"Authorization": f"Bearer {token}"})
    assert joined.status_code == 200, joined.text
    return {"Authorization": f"Bearer {joined.json()['credential']}", "Content-Type": "application/json"}


def _put(client: TestClient, headers: dict[str, str], fabric: IbFabric | bytes | str) -> int:
    body = fabric.model_dump_json() if isinstance(fabric, IbFabric) else fabric
    return int(client.put("/api/v1/agent/fabric", content=body, headers=headers).status_code)


def _stored(sessions: sessionmaker[Session]) -> int:
    with transaction(sessions, readonly=True) as s:
        return s.scalar(select(func.count()).select_from(IbFabricReport)) or 0


def test_a_node_reports_the_fabric_and_the_head_shows_it_and_where_nodes_are_plugged(client: TestClient) -> None:
    assert client.get("/api/v1/fabric").json()["reported_by"] is None
    gpu001 = _join(client, "gpu001")
    _join(client, "n3", hostname="gpu003.cluster.example")  # found by its host name, the domain ignored
    assert _put(client, gpu001, HDR) == 204

    shown = client.get("/api/v1/fabric").json()
    assert (shown["reported_by"], shown["digest"]) == ("gpu001", HDR.digest())
    assert (len(shown["switches"]), len(shown["cas"]), len(shown["links"])) == (3, 6, 10)
    assert IbFabric.model_validate({k: shown[k] for k in ("cas", "links")} | {"switches": HDR.switches}) == HDR
    leaf01 = next(s for s in shown["switches"] if s["description"] == LEAF01)
    assert (leaf01["guid"], leaf01["lid"], leaf01["port_count"]) == ("b8cef60300a0b001", 2, 40)
    ports = {p["number"]: p for p in leaf01["ports"]}
    assert sorted(ports) == [1, 2, 3, 4, 39, 40]
    assert ports[1]["peer"] | {"width": ports[1]["width"], "speed": ports[1]["speed"]} == {
        "guid": "0c42a10300d1e001",
        "port": 1,
        "kind": "ca",
        "description": "gpu001 mlx5_0",
        "host": "gpu001",
        "device": "mlx5_0",
        "node": "gpu001",
        "width": 4,
        "speed": "HDR",
    }
    assert ports[1]["rate_gbps"] == 200
    assert ports[3]["peer"]["node"] is None  # gpu002 is not a registered node
    assert (ports[39]["peer"]["kind"], ports[39]["peer"]["description"], ports[39]["peer"]["port"]) == (
        "switch",
        "MF0;spine01:MQM8700/U1",
        1,
    )
    assert [r["node"] for r in shown["reporters"]] == ["gpu001"]

    def links(name: str) -> list[tuple[object, ...]]:
        answer = client.get(f"/api/v1/nodes/{name}/links").json()
        return [(ln["interface"], ln["switch"], ln["switch_port"], ln["seen_by"], ln["rate"]) for ln in answer]

    assert links("gpu001") == [
        ("mlx5_0/1", LEAF01, "1", ["ibnetdiscover"], "4xHDR"),
        ("mlx5_1/1", LEAF01, "2", ["ibnetdiscover"], "4xHDR"),
    ]
    assert links("n3") == [
        ("mlx5_0/1", LEAF02, "1", ["ibnetdiscover"], "4xHDR"),
        ("mlx5_1/1", LEAF02, "2", ["ibnetdiscover"], "1xHDR"),  # the link running on one lane
    ]

    # the pages: the node's "Plugged into", the fabric page, linked from the Network page
    browser = logged_in(client)
    node_page = browser.get("/nodes/gpu001").text
    plugged = '<a href="/fabric#ibsw-b8cef60300a0b001">MF0;leaf01:MQM8700/U1</a> port 1 4xHDR'
    assert f'data-fabric="infiniband">mlx5_0/1 → {plugged}' in node_page
    assert 'href="/fabric"' in browser.get("/switches").text
    page = browser.get("/fabric")
    assert page.status_code == 200
    assert 'id="ibsw-b8cef60300a0b001"' in page.text
    assert '<a href="/nodes/gpu001">gpu001</a>' in page.text
    assert 'data-port="2" data-peer="gpu003"' in page.text
    assert 'Reported by</dt><dd><a href="/nodes/gpu001">gpu001</a>' in page.text


def test_the_newest_report_is_the_fabric_and_each_node_keeps_only_its_latest(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    gpu001, gpu002 = _join(client, "gpu001"), _join(client, "gpu002")
    assert _put(client, gpu001, HDR) == 204
    assert _put(client, gpu001, HDR) == 204  # unchanged: renewed, not duplicated
    assert _stored(sessions) == 1
    # gpu002's mlx5_1 cable pulled: gpu002 sees a smaller fabric, and its report is the newest
    pulled = HDR.model_copy(update={"links": [ln for ln in HDR.links if ln.a.guid != "0c42a10300d1e102"]})
    assert len(pulled.links) == 9
    assert _put(client, gpu002, pulled) == 204
    shown = client.get("/api/v1/fabric").json()
    assert (shown["reported_by"], len(shown["links"])) == ("gpu002", 9)
    assert {r["node"]: r["links"] for r in shown["reporters"]} == {"gpu002": 9, "gpu001": 10}
    assert _stored(sessions) == 2
    assert client.get("/api/v1/nodes/gpu002/links").json()[0]["interface"] == "mlx5_0/1"
    assert len(client.get("/api/v1/nodes/gpu002/links").json()) == 1
    audit = client.get("/api/v1/audit").json()
    assert any(r["action"] == "agent.put_fabric" and r["target"] == "3 switches, 6 CAs, 9 links" for r in audit)
    # the node removed: its report goes with it, the other is the fabric again
    assert client.delete("/api/v1/nodes", params={"names": "gpu002"}).json() == ["gpu002"]
    assert client.get("/api/v1/fabric").json()["reported_by"] == "gpu001"


@pytest.mark.parametrize(
    "fixture",
    [
        "ibnetdiscover-rdma-core-man-voltaire-sdr.txt",
        "ibnetdiscover-ibtopotool-sun-dcs36-qdr.txt",
        "ibnetdiscover-ibtopotool-bx900-two-switches-qdr.txt",
    ],
)
def test_every_real_output_goes_through_the_head_unchanged(client: TestClient, fixture: str) -> None:
    fabric = parse_ibnetdiscover((FIXTURES / fixture).read_text())
    assert _put(client, _join(client, "reporter"), fabric) == 204
    shown = client.get("/api/v1/fabric").json()
    assert shown["digest"] == fabric.digest()
    assert IbFabric.model_validate({"switches": fabric.switches, "cas": shown["cas"], "links": shown["links"]}) == (
        fabric
    )
    # every switch end of every cable is one of the switch ports shown
    switches = {s.guid for s in fabric.switches}
    cabled = {(s["guid"], p["number"]) for s in shown["switches"] for p in s["ports"]}
    assert cabled == {(e.guid, e.port) for ln in fabric.links for e in (ln.a, ln.b) if e.guid in switches}


def test_a_malformed_or_oversize_report_is_refused_and_nothing_stored(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    node = _join(client, "gpu001")
    bad_guid = HDR.model_dump(mode="json")
    bad_guid["switches"][0]["guid"] = "not-a-guid"
    for body, said in (
        (b"{not json", "malformed InfiniBand fabric"),
        (b'{"switches": [], "extra": 1}', "extra"),
        (IbFabric.model_validate(HDR).model_dump_json().replace('"port":1}', '"port":256}', 1), "port"),
        (str(bad_guid).replace("'", '"').replace("None", "null"), "guid"),
    ):
        answer = client.put("/api/v1/agent/fabric", content=body, headers=node)
        assert answer.status_code == 400, (body, answer.text)  # InvalidInput, as a malformed inventory
        assert "malformed InfiniBand fabric" in answer.text
        assert said in answer.text
    too_big = b" " * (MAX_FABRIC_BYTES + 1)
    answer = client.put("/api/v1/agent/fabric", content=too_big, headers=node)
    assert answer.status_code == 413
    assert f"larger than {MAX_FABRIC_BYTES} bytes" in answer.text
    assert _stored(sessions) == 0
    assert client.get("/api/v1/fabric").json()["reported_by"] is None


def test_only_a_node_credential_reports_a_fabric(client: TestClient, sessions: sessionmaker[Session]) -> None:
    body = HDR.model_dump_json()
    as_admin = client.put("/api/v1/agent/fabric", content=body)  # the client's admin token
    assert as_admin.status_code == 403
    anonymous = client.put("/api/v1/agent/fabric", content=body, headers={"Authorization": ""})
    assert anonymous.status_code == 401
    assert _stored(sessions) == 0
    assert client.get("/api/v1/fabric", headers={"Authorization": ""}).status_code == 401
