"""The jobs API: who may do what to whose jobs, and bad input answered with 4xx, never 5xx."""

from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import Engine, event

from tests.api.dashboard_helpers import up_node


def _user_token(client: TestClient, username: str, role: str = "member") -> dict[str, str]:
    assert client.post("/api/v1/users", json={"username": username, "role": role}).status_code == 201
    token = client.post("/api/v1/tokens/user", json={"user": username}).json()["token"]
    return {"Authorization": f"Bearer {token}"}


def test_members_run_their_own_jobs_and_nothing_of_anyone_elses(client: TestClient) -> None:
    up_node(client, "n1", gpus=2)
    alice = _user_token(client, "alice")
    bob = _user_token(client, "bob")
    viewer = _user_token(client, "vic", role="viewer")
    mine = client.post("/api/v1/jobs", json={"argv": ["train"], "env": {"SECRET": "s3"}}, headers=alice)
    assert mine.status_code == 201, mine.text
    job_id = mine.json()["id"]
    assert mine.json()["user"] == "alice"

    assert client.post("/api/v1/jobs", json={"argv": ["x"]}, headers=viewer).status_code == 403
    assert client.post("/api/v1/jobs", json={"argv": ["x"], "user": "alice"}, headers=bob).status_code == 403
    shown = client.get(f"/api/v1/jobs/{job_id}", headers=bob).json()
    assert shown["env"] is None
    assert shown["argv"] is None
    assert client.get(f"/api/v1/jobs/{job_id}", headers=alice).json()["env"] == {"SECRET": "s3"}
    assert client.get(f"/api/v1/jobs/{job_id}/output", headers=bob).status_code == 403
    assert client.post(f"/api/v1/jobs/{job_id}/cancel", headers=bob).status_code == 403
    assert client.post(f"/api/v1/jobs/{job_id}/cancel", headers=alice).json()["state"] == "cancelled"
    assert client.post(f"/api/v1/jobs/{job_id}/cancel", headers=alice).status_code == 409


def test_bad_input_is_a_4xx(client: TestClient) -> None:
    up_node(client, "n1", gpus=2)
    client.post("/api/v1/users", json={"username": "alice"})
    bad_submits = [
        {"user": "alice", "script": "echo \x00"},
        {"user": "alice", "argv": ["echo", "日" * 15000]},  # 45 KB once encoded: over the frame budget
        {"user": "alice", "argv": ["x"], "nodes": 10**12},
        {"user": "alice\n", "argv": ["x"]},
    ]
    for body in bad_submits:
        answer = client.post("/api/v1/jobs", json=body)
        assert 400 <= answer.status_code < 500, (body, answer.text)
    assert client.get("/api/v1/jobs", params={"user": "\x00"}).status_code == 422
    answer = client.get("/api/v1/reports/usage", params={"since": "0001-01-01T00:00:00+01:00"})
    assert answer.status_code == 400
    assert "year" in answer.json()["detail"]
    assert client.get("/api/v1/jobs/999999/output").status_code == 404
    long_name = client.post("/api/v1/jobs", json={"user": "alice", "argv": ["/opt/" + "x" * 300]})
    assert long_name.status_code == 201
    assert len(long_name.json()["name"]) == 128


def test_a_submission_is_one_short_transaction(client: TestClient, engine: Engine) -> None:
    """A user's own submission reads the token with its user, the user with their projects and the
    inventory's capacity, and writes the job and its audit record: five statements and one commit,
    whatever the numbers of nodes, projects or queued jobs (issue 22)."""
    for name in ("n1", "n2", "n3"):
        up_node(client, name, gpus=2)
    alice = _user_token(client, "alice")
    assert client.post("/api/v1/projects", json={"name": "vision"}).status_code == 201
    assert client.post("/api/v1/projects/vision/members", json={"user": "alice"}).status_code == 200
    for _ in range(3):  # a queue to ignore
        assert client.post("/api/v1/jobs", json={"argv": ["x"]}, headers=alice).status_code == 201
    seen: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        seen.append(" ".join(statement.split()[:2]).upper())

    event.listen(engine, "before_cursor_execute", record)
    try:
        answer = client.post("/api/v1/jobs", json={"argv": ["train"], "gpus_per_node": 1}, headers=alice)
    finally:
        event.remove(engine, "before_cursor_execute", record)
    assert answer.status_code == 201, answer.text
    assert answer.json()["project"] == "vision"
    work = [sql for sql in seen if not sql.startswith(("BEGIN", "COMMIT", "PRAGMA", "ROLLBACK", "SAVEPOINT"))]
    assert len(work) <= 5, seen
    assert sum(sql.startswith("INSERT INTO") for sql in work) == 2, seen  # the job and its audit record
