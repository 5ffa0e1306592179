"""The model and dataset registries over HTTP (/api/v1/models, /api/v1/datasets): who may register, what a
listing shows (with the nodes whose cache holds each, as their agents reported it on the channel), bad
input answered 4xx, and a job refused another project's dataset."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.api.dashboard_helpers import up_node
from tests.api.test_channel import _credential

# One database: HTTP translation (tests/jobs/test_artifacts' service tests).
pytestmark = pytest.mark.one_database

SHA = "0123456789abcdef" * 4


def _user_token(client: TestClient, username: str, role: str = "member") -> dict[str, str]:
    assert client.post("/api/v1/users", json={"username": username, "role": role}).status_code == 201
    token = client.post("/api/v1/tokens/user", json={"user": username}).json()["token"]
    return {"Authorization": f"Bearer {token}"}


def _body(**kw: Any) -> dict[str, Any]:
    body = {
        "kind": "dataset",
        "name": "imagenet",
        "version": "1",
        "location": "/shared/datasets/imagenet",
        "sha256": SHA,
        "size_bytes": 1234,
        "licence": "custom",
    }
    return body | kw


def test_register_list_show_and_remove(client: TestClient) -> None:
    client.post("/api/v1/projects", json={"name": "alpha"})
    made = client.post("/api/v1/datasets", json=_body(project="alpha", shared_with=["alpha"]))
    assert made.status_code == 201, made.text
    shown = made.json()
    assert (shown["ref"], shown["project"], shown["shared_with"], shown["nodes"]) == ("imagenet:1", "alpha", [], [])
    assert shown["created_by"].startswith("token:")
    model = client.post("/api/v1/models", json=_body(kind="model", name="llama", framework="pytorch"))
    assert model.status_code == 201, model.text

    assert [d["ref"] for d in client.get("/api/v1/datasets").json()] == ["imagenet:1"]
    assert [m["ref"] for m in client.get("/api/v1/models").json()] == ["llama:1"]
    assert client.get("/api/v1/datasets/imagenet").json()["sha256"] == SHA
    assert client.get("/api/v1/datasets/imagenet:1").json()["size_bytes"] == 1234
    assert client.get("/api/v1/models/imagenet").status_code == 404  # each registry its own

    bare = client.delete("/api/v1/datasets/imagenet")
    assert bare.status_code == 400
    assert "imagenet:VERSION" in bare.json()["detail"]
    assert client.delete("/api/v1/datasets/imagenet:1").status_code == 204
    assert client.get("/api/v1/datasets").json() == []
    assert client.delete("/api/v1/datasets/imagenet:1").status_code == 404
    audited = [(r["target"], r["result"]) for r in client.get("/api/v1/audit").json()]
    assert ("dataset imagenet:1", 201) in audited
    assert ("dataset imagenet:1", 204) in audited
    assert ("model llama:1", 201) in audited


def test_bad_registrations_are_4xx(client: TestClient) -> None:
    client.post("/api/v1/datasets", json=_body())
    cases = [
        (_body(), 409),  # the same version again
        (_body(version="2", kind="model"), 400),  # a model posted to the dataset registry
        (_body(version="2", location="s3://bucket/imagenet"), 400),
        (_body(version="2", location="relative/path"), 400),
        (_body(version="2", project="nope"), 404),
        (_body(version="2", sha256="XYZ"), 422),
        (_body(version="2", name="Bad Name"), 422),
        (_body(version="2", size_bytes=-1), 422),
        (_body(version="2", description="a\x00b"), 422),
    ]
    for body, status in cases:
        answer = client.post("/api/v1/datasets", json=body)
        assert answer.status_code == status, (body, answer.text)
    assert [d["ref"] for d in client.get("/api/v1/datasets").json()] == ["imagenet:1"]


def test_members_read_the_registries_but_cannot_change_them(client: TestClient) -> None:
    client.post("/api/v1/datasets", json=_body())
    member = _user_token(client, "alice")
    viewer = _user_token(client, "vic", role="viewer")
    for who in (member, viewer):
        assert client.post("/api/v1/datasets", json=_body(version="2"), headers=who).status_code == 403
        assert client.post("/api/v1/models", json=_body(kind="model"), headers=who).status_code == 403
        assert client.delete("/api/v1/datasets/imagenet:1", headers=who).status_code == 403
        assert client.get("/api/v1/datasets", headers=who).status_code == 200
        assert client.get("/api/v1/datasets/imagenet:1", headers=who).status_code == 200
    operator = _user_token(client, "olga", role="operator")
    assert client.post("/api/v1/datasets", json=_body(version="2"), headers=operator).status_code == 201
    assert client.get("/api/v1/datasets", headers={"Authorization": ""}).status_code == 401


def test_show_names_the_nodes_whose_cache_holds_it_as_reported_on_the_channel(client: TestClient) -> None:
    client.post("/api/v1/datasets", json=_body())
    credential = _credential(client, "n1")
    entry = {"sha256": SHA, "size_bytes": 1234, "copied_at": 100.0, "last_used_at": 200.0, "uses": 2}
    with client.websocket_connect("/api/v1/agent/channel", headers={"Authorization": f"Bearer {credential}"}) as ws:
        ws.send_text(json.dumps({"type": "hello", "heartbeat_interval_s": 1.0}))
        ws.receive_json()
        ws.send_text(json.dumps({"type": "node_cache", "limit_bytes": 10**9, "entries": [entry]}))
        deadline = time.monotonic() + 10
        while client.get("/api/v1/datasets/imagenet").json()["nodes"] != ["n1"]:  # recorded on a worker thread
            assert time.monotonic() < deadline, "the node's cache was never recorded"
            time.sleep(0.02)
        assert [d["nodes"] for d in client.get("/api/v1/datasets").json()] == [["n1"]]
        ws.send_text(json.dumps({"type": "node_cache", "limit_bytes": 10**9, "entries": []}))  # evicted
        deadline = time.monotonic() + 10
        while client.get("/api/v1/datasets/imagenet").json()["nodes"] != []:
            assert time.monotonic() < deadline, "the eviction was never recorded"
            time.sleep(0.02)


def test_a_job_of_another_project_is_refused_the_dataset(client: TestClient) -> None:
    up_node(client, "n1", gpus=2)
    alice = _user_token(client, "alice")
    bob = _user_token(client, "bob")
    for name, member in (("alpha", "alice"), ("beta", "bob")):
        assert client.post("/api/v1/projects", json={"name": name}).status_code == 201
        assert client.post(f"/api/v1/projects/{name}/members", json={"user": member}).status_code in (200, 201, 204)
    assert client.post("/api/v1/datasets", json=_body(project="alpha")).status_code == 201

    mine = client.post("/api/v1/jobs", json={"argv": ["train"], "datasets": ["imagenet"]}, headers=alice)
    assert mine.status_code == 201, mine.text
    assert mine.json()["project"] == "alpha"
    theirs = client.post("/api/v1/jobs", json={"argv": ["train"], "datasets": ["imagenet:1"]}, headers=bob)
    assert theirs.status_code == 403
    assert "belongs to project alpha; project beta may not use it" in theirs.json()["detail"]
    unknown = client.post("/api/v1/jobs", json={"argv": ["train"], "model": "nope"}, headers=alice)
    assert unknown.status_code == 404
    assert [j["user"] for j in client.get("/api/v1/jobs").json()] == ["alice"]


def test_a_location_is_shown_only_to_readers_whose_projects_may_use_it(client: TestClient) -> None:
    alice = _user_token(client, "alice")
    bob = _user_token(client, "bob")
    for name, member in (("alpha", "alice"), ("beta", "bob")):
        assert client.post("/api/v1/projects", json={"name": name}).status_code == 201
        assert client.post(f"/api/v1/projects/{name}/members", json={"user": member}).status_code in (200, 201, 204)
    presigned = "https://store.example/imagenet.tar?X-Amz-Signature=secret"
    assert client.post("/api/v1/datasets", json=_body(project="alpha", location=presigned)).status_code == 201
    assert client.post("/api/v1/datasets", json=_body(name="open", location="/shared/open")).status_code == 201

    owner = client.get("/api/v1/datasets/imagenet", headers=alice).json()
    assert (owner["location"], owner["location_hidden"]) == (presigned, False)
    other = client.get("/api/v1/datasets/imagenet", headers=bob).json()
    assert (other["location"], other["location_hidden"]) == ("", True)
    assert "secret" not in client.get("/api/v1/datasets", headers=bob).text
    assert client.get("/api/v1/datasets/open", headers=bob).json()["location"] == "/shared/open"  # open to all
    assert client.get("/api/v1/datasets/imagenet").json()["location"] == presigned  # the admin sees all
