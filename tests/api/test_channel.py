"""The agent channel over a real WebSocket: hello, heartbeats, acks after the flush, protocol errors."""

import json
import threading
import time

import pytest
from fastapi.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from gpufleet.core.errors import Unavailable
from gpufleet.inventory.states import NodeState
from gpufleet.protocol.messages import CLOSE_BAD_MESSAGE, CLOSE_NODE_GONE, CLOSE_TRY_AGAIN, CLOSE_UNAUTHORIZED


def _credential(client: TestClient, name: str) -> str:
    join = client.post("/api/v1/tokens/join", json={"expires_in_s": 600}).json()["token"]
    response = client.post("/api/v1/agent/join", json={"name": name}, headers={"Authorization": f"Bearer {join}"})
    token: str = response.json()["credential"]
    return token


def test_heartbeats_are_acked_only_after_they_are_durable(client: TestClient) -> None:
    loops = client.app.state.ctx.loops  # type: ignore[attr-defined]
    credential = _credential(client, "n1")
    with client.websocket_connect("/api/v1/agent/channel", headers={"Authorization": f"Bearer {credential}"}) as ws:
        ws.send_text(json.dumps({"type": "hello", "heartbeat_interval_s": 1.0}))
        welcome = ws.receive_json()
        assert welcome == {"type": "welcome", "node": "n1", "inventory_wanted": True}
        ws.send_text(json.dumps({"type": "heartbeat", "seq": 7}))
        # Nothing is durable yet: the node is still `new` and no ack has been sent.
        assert client.get("/api/v1/nodes/n1").json()["state"] == NodeState.NEW
        deadline = time.monotonic() + 5
        while (loops.book.latest.get(1) is None or loops.book.latest[1].seq != 7) and time.monotonic() < deadline:
            time.sleep(0.01)  # the server thread records the heartbeat asynchronously
        changes = loops.flush_once()
        assert [(c.name, c.to_state) for c in changes] == [("n1", NodeState.UP)]
        assert ws.receive_json() == {"type": "ack", "seq": 7}
        node = client.get("/api/v1/nodes/n1").json()
        assert node["state"] == "up"
        assert node["last_seen"] is not None


def test_channel_rejects_bad_credentials_and_messages(client: TestClient) -> None:
    with (
        pytest.raises(WebSocketDisconnect) as closed,
        client.websocket_connect("/api/v1/agent/channel", headers={"Authorization": "Bearer gfn_bad"}) as ws,
    ):
        ws.receive_text()
    assert closed.value.code == CLOSE_UNAUTHORIZED
    admin = client.headers["authorization"]
    with (
        pytest.raises(WebSocketDisconnect) as closed,
        client.websocket_connect("/api/v1/agent/channel", headers={"Authorization": admin}) as ws,
    ):
        ws.receive_text()
    assert closed.value.code == CLOSE_UNAUTHORIZED  # an admin token is not a node

    credential = _credential(client, "n1")
    for first in ('{"type": "heartbeat", "seq": 1}', '{"type": "hello"}', "garbage", '{"type": "x"}'):
        with (
            pytest.raises(WebSocketDisconnect) as closed,
            client.websocket_connect("/api/v1/agent/channel", headers={"Authorization": f"Bearer {credential}"}) as ws,
        ):
            ws.send_text(first)
            ws.receive_text()
        assert closed.value.code == CLOSE_BAD_MESSAGE, first
    assert client.get("/api/v1/nodes/n1").json()["state"] == "new"  # nothing was stored


def test_removing_a_node_closes_its_channel(client: TestClient) -> None:
    credential = _credential(client, "n1")
    with client.websocket_connect("/api/v1/agent/channel", headers={"Authorization": f"Bearer {credential}"}) as ws:
        ws.send_text(json.dumps({"type": "hello", "heartbeat_interval_s": 1.0}))
        ws.receive_json()
        assert client.delete("/api/v1/nodes", params={"names": "n1"}).status_code == 200
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_text()
        assert closed.value.code == CLOSE_NODE_GONE


@pytest.mark.parametrize(
    ("error", "said"),
    [
        # The database stayed locked (a join storm): close with 1013, try again later, rather than let an
        # error escape to an HTTP handler that cannot answer on a WebSocket.
        (Unavailable("database error: database is locked"), "database is locked"),
        # A bug: the channel must not stay open with nobody recording its reports.
        (RuntimeError("a bug"), "head error"),
    ],
)
def test_a_report_the_head_cannot_record_closes_the_channel_for_a_retry(
    client: TestClient, monkeypatch: pytest.MonkeyPatch, error: Exception, said: str
) -> None:
    """The agent reconnects and re-sends what was not acknowledged."""
    jobs = client.app.state.ctx.jobs  # type: ignore[attr-defined]

    def failing(*_: object) -> list[object]:
        raise error

    monkeypatch.setattr(jobs, "record_held", failing)
    credential = _credential(client, "n1")
    with client.websocket_connect("/api/v1/agent/channel", headers={"Authorization": f"Bearer {credential}"}) as ws:
        ws.send_text(json.dumps({"type": "hello", "heartbeat_interval_s": 1.0}))
        ws.receive_json()
        ws.send_text(json.dumps({"type": "job_held", "ranks": []}))
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_text()
    assert closed.value.code == CLOSE_TRY_AGAIN
    assert said in (closed.value.reason or "")


def test_a_report_refused_for_a_moment_is_retried_without_closing_the_channel(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deadlock or a lock held by a process that just died: retried in place, the channel stays open
    (a closed one costs a reconnect, whose handshake needs the same busy database)."""
    ctx = client.app.state.ctx  # type: ignore[attr-defined]
    record_held = ctx.jobs.record_held
    calls: list[int] = []

    def once_refused(node_id: int, message: object) -> object:
        calls.append(node_id)
        if len(calls) == 1:
            raise Unavailable("database error: deadlock detected")
        return record_held(node_id, message)

    monkeypatch.setattr(ctx.jobs, "record_held", once_refused)
    credential = _credential(client, "n1")
    with client.websocket_connect("/api/v1/agent/channel", headers={"Authorization": f"Bearer {credential}"}) as ws:
        ws.send_text(json.dumps({"type": "hello", "heartbeat_interval_s": 1.0}))
        ws.receive_json()
        ws.send_text(json.dumps({"type": "job_held", "ranks": []}))
        deadline = time.monotonic() + 5
        while len(calls) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(calls) == 2  # refused once, recorded on the second try
        ws.send_text(json.dumps({"type": "heartbeat", "seq": 9}))
        while ctx.loops.book.latest[1].seq != 9 and time.monotonic() < deadline:
            time.sleep(0.01)
        ctx.loops.flush_once()
        assert ws.receive_json() == {"type": "ack", "seq": 9}  # the channel stayed open throughout


def test_heartbeats_are_read_while_a_report_waits_for_the_database(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a join storm a node's job report can queue for the database for seconds; its heartbeats must be
    read meanwhile, or a live node is marked down with its beats sitting unread (the storm's false downs)."""
    ctx = client.app.state.ctx  # type: ignore[attr-defined]
    release, entered = threading.Event(), threading.Event()
    record_held = ctx.jobs.record_held

    def slow_held(node_id: int, message: object) -> object:
        entered.set()
        assert release.wait(10), "the test never released the report"
        return record_held(node_id, message)

    monkeypatch.setattr(ctx.jobs, "record_held", slow_held)
    credential = _credential(client, "n1")
    with client.websocket_connect("/api/v1/agent/channel", headers={"Authorization": f"Bearer {credential}"}) as ws:
        ws.send_text(json.dumps({"type": "hello", "heartbeat_interval_s": 1.0}))
        ws.receive_json()
        ws.send_text(json.dumps({"type": "job_held", "ranks": []}))
        assert entered.wait(5)
        ws.send_text(json.dumps({"type": "heartbeat", "seq": 3}))
        deadline = time.monotonic() + 5
        while ctx.loops.book.latest[1].seq != 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        seen = ctx.loops.book.latest[1].seq
        release.set()
        assert seen == 3  # read while job_held was still being recorded
        ws.send_text(json.dumps({"type": "heartbeat", "seq": 4}))
        while ctx.loops.book.latest[1].seq != 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert ctx.loops.book.latest[1].seq == 4


def test_a_database_that_cannot_answer_at_the_handshake_is_try_again_not_a_refused_credential(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """4401 sends an agent to join again with its join token: a busy or absent database during a reconnect
    storm must not make a whole fleet do that."""
    from gpufleet.api.routers import agent

    credential = _credential(client, "n1")

    def busy(*_args: object) -> None:
        raise Unavailable("database is locked")

    monkeypatch.setattr(agent.inventory, "channel_identity", busy)
    with (
        pytest.raises(WebSocketDisconnect) as closed,
        client.websocket_connect("/api/v1/agent/channel", headers={"Authorization": f"Bearer {credential}"}) as ws,
    ):
        ws.receive_text()
    assert closed.value.code == CLOSE_TRY_AGAIN
