"""The list endpoints' answers: pages keyed by name, ETags, and 304 while nothing changed."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.api.conditional import not_modified
from gpufleet.cli.state import CliState
from gpufleet.core.clock import FakeClock
from gpufleet.core.db import transaction
from gpufleet.inventory import service as inventory
from gpufleet.inventory.schemas import NodeSettings
from gpufleet.inventory.states import NodeState
from gpufleet.protocol.inventory import GpuInfo, NodeInventory
from tests.conftest import cli_through


def _gpu(index: int, model: str = "NVIDIA H200") -> GpuInfo:
    return GpuInfo(
        index=index,
        uuid=f"GPU-{index:04d}-{model[-4:]}",
        model=model,
        pci_bus_id=f"00000000:{index + 0x18:02X}:00.0",
        memory_total_mib=143771,
    )


def _fleet(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    """n1: up, GPUs 1-3 only (GPU 0 fell off the bus), the lowest an H100; n2: up, 2 GPUs; n3: new, none."""
    with transaction(sessions) as session:
        nodes = inventory.add_nodes(session, clock, ["n[1-3]"], NodeSettings(category="c"))
        gpus = {"n1": [_gpu(1, "NVIDIA H100"), _gpu(2), _gpu(3)], "n2": [_gpu(0), _gpu(1)]}
        for node in nodes[:2]:
            info = NodeInventory(hostname=node.name, cpus=8, memory_total_mib=1024, gpus=gpus[node.name])
            inventory.apply_inventory(session, clock, node, info)
            inventory.transition(session, clock, node.id, NodeState.NEW, NodeState.UP, "joined")


@pytest.mark.parametrize(
    ("header", "tag", "matches"),
    [
        (None, '"a"', False),
        ('"a"', '"a"', True),
        ('W/"a"', '"a"', True),  # If-None-Match compares weakly
        ('"a"', 'W/"a"', True),
        ('"b", W/"a"', 'W/"a"', True),
        ("*", '"a"', True),
        ('"b"', '"a"', False),
        ("a", '"a"', False),  # not a quoted tag
    ],
)
def test_if_none_match(header: str | None, tag: str, matches: bool) -> None:
    assert not_modified(header, tag) is matches


def test_nodes_come_in_pages_keyed_by_name(
    client: TestClient, sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    _fleet(sessions, clock)
    first = client.get("/api/v1/nodes", params={"limit": 2})
    assert first.status_code == 200
    assert [n["name"] for n in first.json()] == ["n1", "n2"]
    assert first.headers["link"] == '</api/v1/nodes?after=n2&limit=2>; rel="next"'
    n1 = first.json()[0]
    # The GPUs present, and the model of the lowest-numbered one, as `node show` has them.
    assert (n1["gpu_count"], n1["gpu_model"], n1["state"], n1["category"]) == (3, "NVIDIA H100", "up", "c")
    assert n1 == {k: v for k, v in client.get("/api/v1/nodes/n1").json().items() if k in n1}
    last = client.get("/api/v1/nodes", params={"limit": 2, "after": "n2"})
    assert [(n["name"], n["gpu_count"], n["gpu_model"]) for n in last.json()] == [("n3", 0, None)]
    assert "link" not in last.headers
    filtered = client.get("/api/v1/nodes", params={"names": "n[1,3],nope", "limit": 1})
    assert [n["name"] for n in filtered.json()] == ["n1"]
    assert filtered.headers["link"].endswith('after=n1&limit=1>; rel="next"')
    assert client.get("/api/v1/nodes", params={"limit": 0}).status_code == 422
    assert client.get("/api/v1/nodes", params={"names": "n[1-"}).status_code == 400


def test_an_unchanged_node_list_answers_304(
    client: TestClient, sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    _fleet(sessions, clock)
    first = client.get("/api/v1/nodes")
    tag = first.headers["etag"]
    assert tag.startswith('W/"')
    assert first.headers["cache-control"] == "private, no-cache"
    again = client.get("/api/v1/nodes", headers={"If-None-Match": tag})
    assert (again.status_code, again.content, again.headers["etag"]) == (304, b"", tag)

    # Heartbeats of nodes that stay up are not a change worth a new copy...
    loops = client.app.state.ctx.loops  # type: ignore[attr-defined]
    clock.advance(5.0)
    loops.book.record(1, clock.now(), 1.0, 7)
    loops.flush_once()
    assert client.get("/api/v1/nodes/n1").json()["last_seen"] != first.json()[0]["last_seen"]
    assert client.get("/api/v1/nodes", headers={"If-None-Match": tag}).status_code == 304

    # ...a drain is.
    assert client.post("/api/v1/nodes/n2/drain", json={"reason": "swap a DIMM"}).status_code == 200
    changed = client.get("/api/v1/nodes", headers={"If-None-Match": tag})
    assert changed.status_code == 200
    assert changed.headers["etag"] != tag
    assert changed.json()[1]["drain_reason"] == "swap a DIMM"
    # The first page's tag does not stand for another page.
    assert client.get("/api/v1/nodes", params={"limit": 1}, headers={"If-None-Match": tag}).status_code == 200


def test_gpus_are_listed_by_node_and_index(
    client: TestClient, sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    _fleet(sessions, clock)
    every = client.get("/api/v1/gpus")
    assert [(g["node"], g["index"], g["node_state"]) for g in every.json()] == [
        ("n1", 1, "up"),
        ("n1", 2, "up"),
        ("n1", 3, "up"),
        ("n2", 0, "up"),
        ("n2", 1, "up"),
    ]
    assert every.json()[0]["model"] == "NVIDIA H100"
    assert every.json()[0]["memory_total_mib"] == 143771
    tag = every.headers["etag"]
    assert not tag.startswith("W/")  # nothing in a GPU's row moves by itself: the tag is the body's
    assert client.get("/api/v1/gpus", headers={"If-None-Match": tag}).status_code == 304

    page = client.get("/api/v1/gpus", params={"limit": 2, "after": "n1:1"})
    assert [(g["node"], g["index"]) for g in page.json()] == [("n1", 2), ("n1", 3)]
    assert page.headers["link"] == '</api/v1/gpus?after=n1%3A3&limit=2>; rel="next"'
    rest = client.get("/api/v1/gpus", params={"limit": 2, "after": "n1:3"})
    assert [(g["node"], g["index"]) for g in rest.json()] == [("n2", 0), ("n2", 1)]
    assert "link" not in rest.headers
    assert [g["index"] for g in client.get("/api/v1/gpus", params={"nodes": "n2"}).json()] == [0, 1]
    assert client.get("/api/v1/gpus", params={"after": "n1"}).status_code == 422


def test_the_client_follows_the_pages(
    client: TestClient, sessions: sessionmaker[Session], clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fleet(sessions, clock)
    cli_through(client, monkeypatch)
    head = CliState().client()  # the CLI's real HeadClient, each request answered by `client`
    assert [n["name"] for n in head.list_nodes(page=1)] == ["n1", "n2", "n3"]
    assert [n["name"] for n in head.list_nodes("n[2-3]", page=1)] == ["n2", "n3"]


def test_an_unchanged_job_list_answers_304(client: TestClient) -> None:
    client.post("/api/v1/users", json={"username": "alice"})
    client.post("/api/v1/nodes", json={"names": ["n1"]})
    job = {"argv": ["true"], "gpus_per_node": 0, "user": "alice"}
    first = client.post("/api/v1/jobs", json=job).json()["id"]
    listed = client.get("/api/v1/jobs")
    tag = listed.headers["etag"]
    assert [j["id"] for j in listed.json()] == [first]
    assert client.get("/api/v1/jobs", headers={"If-None-Match": tag}).status_code == 304
    client.post(f"/api/v1/jobs/{first}/cancel")
    changed = client.get("/api/v1/jobs", headers={"If-None-Match": tag})
    assert changed.status_code == 200
    assert changed.json()[0]["state"] == "cancelled"


def test_filtered_pages_follow_one_order_whatever_the_collation(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A collation such as en_US (PostgreSQL's usual one) sorts a-2, a1, B1 otherwise than Python: a
    filtered page must be keyed in the order it was sorted, or the next page skips a node. The test server
    runs with the C locale, so the column gets ICU's English collation here."""
    sessions = client.app.state.ctx.sessions  # type: ignore[attr-defined]
    if sessions.kw["bind"].dialect.name == "postgresql":
        with transaction(sessions) as session:
            session.execute(text('ALTER TABLE nodes ALTER COLUMN name TYPE varchar(64) COLLATE "en-x-icu"'))
    client.post("/api/v1/nodes", json={"names": ["a-2", "a1", "B1", "b-1"]})
    cli_through(client, monkeypatch)
    head = CliState().client()
    listed = [n["name"] for n in head.list_nodes("a-2,a1,B1,b-1", page=1)]
    assert sorted(listed) == sorted(["a-2", "a1", "B1", "b-1"])
    assert len(listed) == 4
    gpus_after = client.get("/api/v1/gpus", params={"nodes": "a-2,a1", "after": "a-2:0"})
    assert gpus_after.status_code == 200
