"""Job arrays over the API: submit answers with the first task, one audit record per array, the list
collapsed and expanded, and cancelling a whole array by whom the single cancel allows."""

from typing import Any

from fastapi.testclient import TestClient

from gpufleet.jobs.tick import run_tick
from tests.api.dashboard_helpers import up_node
from tests.jobs.helpers import TICK


def _user_token(client: TestClient, username: str, role: str = "member") -> dict[str, str]:
    assert client.post("/api/v1/users", json={"username": username, "role": role}).status_code == 201
    token = client.post("/api/v1/tokens/user", json={"user": username}).json()["token"]
    return {"Authorization": f"Bearer {token}"}


def _tick(client: TestClient) -> None:
    ctx = client.app.state.ctx  # type: ignore[attr-defined]
    run_tick(ctx.sessions, ctx.clock, TICK)


def _listed(client: TestClient, **params: Any) -> list[dict[str, Any]]:
    answer = client.get("/api/v1/jobs", params=params)
    assert answer.status_code == 200, answer.text
    rows: list[dict[str, Any]] = answer.json()
    return rows


def test_submit_list_and_cancel_an_array(client: TestClient) -> None:
    up_node(client, "n1", gpus=2)
    alice = _user_token(client, "alice")
    bob = _user_token(client, "bob")
    viewer = _user_token(client, "vic", role="viewer")
    answer = client.post("/api/v1/jobs", json={"argv": ["train"], "array": "0-9%2"}, headers=alice)
    assert answer.status_code == 201, answer.text
    first = answer.json()
    array = first["id"]
    assert (first["array_job_id"], first["array_task_id"], first["array_tasks"], first["array_throttle"]) == (
        array,
        0,
        10,
        2,
    )
    assert first["env"]["GPUFLEET_ARRAY_TASK_ID"] == "0"
    audit = client.get("/api/v1/audit", params={"action": "jobs.submit_job"}).json()
    assert [r["target"] for r in audit] == [f"job array {array} (10 tasks of 1x1 GPUs, project None)"]

    _tick(client)
    rows = _listed(client)
    assert [(r["array_task_id"], r["state"], r["array_pending"], r["array_pending_count"]) for r in rows] == [
        (1, "running", None, None),
        (0, "running", None, None),
        (2, "pending", "2-9", 8),
    ]
    assert all(r["array_tasks"] == 10 for r in rows)
    assert len(_listed(client, expand="true")) == 10
    assert [r["array_task_id"] for r in _listed(client, array_job_id=array, array_task_id=7)] == [7]
    assert client.get("/api/v1/jobs", params={"array_task_id": 7}).status_code == 400

    path = f"/api/v1/jobs/arrays/{array}/cancel"
    assert client.post(path, headers=viewer).status_code == 403
    assert client.post(path, headers=bob).status_code == 403
    assert client.post("/api/v1/jobs/arrays/999999/cancel", headers=alice).status_code == 404
    done = client.post(path, headers=alice)
    assert done.json() == {"array_job_id": array, "cancelled": 10, "tasks": 10}
    assert {r["state"] for r in _listed(client, expand="true", state="cancelled")} == {"cancelled"}
    assert client.post(path, headers=alice).status_code == 409
    assert _listed(client, state=["running", "pending"]) == []


def test_a_job_admin_cancels_one_task_or_anyones_array(client: TestClient) -> None:
    up_node(client, "n1", gpus=2)
    alice = _user_token(client, "alice")
    array = client.post("/api/v1/jobs", json={"argv": ["x"], "array": "1,3,5-7"}, headers=alice).json()["id"]
    task_5 = _listed(client, array_job_id=array, array_task_id=5)[0]["id"]
    assert client.post(f"/api/v1/jobs/{task_5}/cancel").json()["state"] == "cancelled"
    assert [r["array_pending"] for r in _listed(client, state="pending")] == ["1,3,6-7"]
    assert client.post(f"/api/v1/jobs/arrays/{array}/cancel").json()["cancelled"] == 4


def test_bad_arrays_are_a_400_and_queue_nothing(client: TestClient) -> None:
    up_node(client, "n1", gpus=2)
    client.post("/api/v1/users", json={"username": "alice"})
    for spec in ["", "5-1", "0-9%0", "0-1000000", "x"]:
        answer = client.post("/api/v1/jobs", json={"user": "alice", "argv": ["x"], "array": spec})
        assert answer.status_code == 400, (spec, answer.text)
    assert client.post("/api/v1/jobs", json={"user": "alice", "argv": ["x"], "array": "1" * 2000}).status_code == 422
    assert _listed(client, expand="true", state=["pending", "cancelled"]) == []
