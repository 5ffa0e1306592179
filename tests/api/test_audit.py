"""Every mutating request and every login attempt leaves an audit record; none can be changed."""

from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Connection, event

from gpufleet.auth import audit
from gpufleet.core.db import READONLY


def _records(client: TestClient, **params: Any) -> list[dict[str, Any]]:
    response = client.get("/api/v1/audit", params=params)
    assert response.status_code == 200
    records: list[dict[str, Any]] = response.json()
    return records


def test_changes_and_refusals_are_recorded_with_actor_and_result(client: TestClient) -> None:
    assert client.post("/api/v1/nodes", json={"names": ["gpu[001-002]"]}).status_code == 201
    assert client.post("/api/v1/nodes", json={"names": ["gpu002"]}).status_code == 409
    assert client.post("/api/v1/nodes", json={"names": ["x"]}, headers={"Authorization": ""}).status_code == 401
    join = client.post("/api/v1/tokens/join", json={"expires_in_s": 60}).json()["token"]
    client.post("/api/v1/agent/join", json={"name": "n1"}, headers={"Authorization": f"Bearer {join}"})
    client.get("/api/v1/nodes")  # reads are not audited

    rows = [(r["actor"], r["action"], r["target"], r["result"]) for r in reversed(_records(client))]
    admin = "token:initial admin#1"
    assert rows == [
        (admin, "nodes.add_nodes", "gpu[001-002]", 201),
        (admin, "nodes.add_nodes", "gpu002", 409),
        ("anonymous", "nodes.add_nodes", "/api/v1/nodes", 401),  # refused before the body was read
        (admin, "tokens.create_join_token", "join token #2 (uses 1, expires in 60s)", 201),
        ("join-token#2", "agent.join", "n1", 200),
    ]
    assert all(r["source"] == "testclient" for r in _records(client))
    assert [r["action"] for r in _records(client, actor="anonymous")] == ["nodes.add_nodes"]


def test_the_audit_log_cannot_be_changed_or_read_by_a_node(client: TestClient) -> None:
    client.post("/api/v1/nodes", json={"names": ["n1"]})
    for method in ("POST", "PUT", "PATCH", "DELETE"):
        assert client.request(method, "/api/v1/audit").status_code == 405
    join = client.post("/api/v1/tokens/join", json={"expires_in_s": 60}).json()["token"]
    node = client.post("/api/v1/agent/join", json={"name": "n2"}, headers={"Authorization": f"Bearer {join}"})
    headers = {"Authorization": f"Bearer {node.json()['credential']}"}
    assert client.get("/api/v1/audit", headers=headers).status_code == 403


def test_a_change_and_its_record_are_one_commit(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """A submission costs one commit: the job and its audit record go in the same transaction. A request
    that changed nothing is still recorded, by the middleware, with the status it got."""
    client.post("/api/v1/users", json={"username": "alice"})
    ctx = client.app.state.ctx  # type: ignore[attr-defined]
    commits: list[int] = []

    def writing(conn: Connection) -> None:  # reads (authentication) commit a snapshot, not a write
        if not conn.get_execution_options().get(READONLY):
            commits.append(1)

    event.listen(ctx.sessions.kw["bind"], "commit", writing)
    job = {"argv": ["true"], "gpus_per_node": 0, "user": "alice"}
    client.post("/api/v1/nodes", json={"names": ["n1"]})
    commits.clear()
    submitted = client.post("/api/v1/jobs", json=job)
    assert submitted.status_code == 201
    assert len(commits) == 1
    refused = client.post("/api/v1/jobs", json=job | {"user": "nobody-here"})
    assert refused.status_code == 404
    rows = [(r["action"], r["target"], r["result"]) for r in _records(client)[:2]]
    assert rows == [
        ("jobs.submit_job", "/api/v1/jobs", 404),
        ("jobs.submit_job", f"job {submitted.json()['id']} (1x0 GPUs, project None)", 201),
    ]

    # A change whose record cannot be written is not made either: they commit together or not at all.
    def broken(*_a: object, **_k: object) -> None:
        raise RuntimeError("the audit table is gone")

    monkeypatch.setattr(audit, "record", broken)
    with pytest.raises(RuntimeError):
        client.post("/api/v1/jobs", json=job)
    monkeypatch.undo()
    assert [j["id"] for j in client.get("/api/v1/jobs").json()] == [submitted.json()["id"]]
