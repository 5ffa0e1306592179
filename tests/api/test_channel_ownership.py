"""A node speaks only for itself: an answer, a report or a claim about another node's command, rank,
GPU or hostname is refused (the channel closed with 4403, or 409 over HTTP) and audited, and the other
node's records stay as they were."""

from __future__ import annotations

import json
import threading
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update
from starlette.websockets import WebSocketDisconnect

from gpufleet.core.db import transaction
from gpufleet.inventory.models import Node
from gpufleet.inventory.states import NodeState
from gpufleet.protocol.messages import CLOSE_FORBIDDEN
from tests.api.channel_helpers import (
    bring_up,
    channel,
    credential,
    rank_of,
    refusals,
    report_of,
    running_job,
    wait_until,
)

# One database: who may say what is checked above the database; test_channel_bounds runs both.
pytestmark = pytest.mark.one_database


@pytest.fixture
def pair(client: TestClient) -> tuple[str, str]:
    """Two joined nodes, both up: `victim` with a GPU, `evil` without. Their credentials."""
    victim, evil = credential(client, "victim"), credential(client, "evil")
    bring_up(client, "victim", gpus=1)
    bring_up(client, "evil", gpus=0)
    return victim, evil


def _closed_forbidden(ws: Any) -> None:
    with pytest.raises(WebSocketDisconnect) as closed:
        ws.receive_text()
    assert closed.value.code == CLOSE_FORBIDDEN


def test_a_fault_command_is_answered_only_by_the_node_it_was_sent_to(client: TestClient, pair: tuple[str, str]) -> None:
    victim, evil = pair
    answer: dict[str, httpx.Response] = {}

    def inject() -> None:
        answer["http"] = client.post("/api/v1/nodes/victim/faults", json={"action": "inject", "kind": "xid79"})

    with channel(client, victim) as victim_ws, channel(client, evil) as evil_ws:
        sender = threading.Thread(target=inject)
        sender.start()
        command = victim_ws.receive_json()
        assert command["type"] == "fault"
        forged = {"type": "fault_result", "id": command["id"], "ok": False, "message": "answered by evilnode"}
        evil_ws.send_text(json.dumps(forged))
        _closed_forbidden(evil_ws)
        victim_ws.send_text(json.dumps({"type": "fault_result", "id": command["id"], "ok": True, "message": "Xid 79"}))
        sender.join(15)
    assert answer["http"].status_code == 200, answer["http"].text
    assert answer["http"].json() == {"node": "victim", "ok": True, "message": "Xid 79"}
    [record] = refusals(client, "evil")
    assert record["action"] == "agent.channel.fault_result"
    assert "victim" in record["target"]
    assert refusals(client, "victim") == []


@pytest.mark.parametrize(
    "forged",
    [
        {"type": "job_update", "state": "exited", "outcome": "failed", "exit_code": 1},
        {"type": "job_update", "state": "running"},
        {"type": "job_held", "ranks": "the victim's"},
    ],
    ids=["exited", "running", "held"],
)
def test_a_node_cannot_report_on_or_hold_another_nodes_rank(
    client: TestClient, pair: tuple[str, str], forged: dict[str, Any]
) -> None:
    victim, evil = pair
    job_id = running_job(client)
    rank = {"job_id": job_id, "run": 1, "rank": 0}
    assert rank_of(client, job_id)["node"] == "victim"
    message = forged | ({"ranks": [rank]} if forged["type"] == "job_held" else rank)
    with channel(client, evil) as ws:
        ws.send_text(json.dumps(message))
        _closed_forbidden(ws)  # and no job_ack, no job_cancel for the victim's rank first
    held = rank_of(client, job_id)
    assert (held["node"], held["state"], held["outcome"]) == ("victim", "assigned", None)
    assert client.get(f"/api/v1/jobs/{job_id}").json()["state"] == "running"
    [record] = refusals(client, "evil")
    assert record["action"] == f"agent.channel.{forged['type']}"
    assert f"job {job_id}" in record["target"]
    # The node it belongs to still reports on it as before.
    with channel(client, victim) as ws:
        ws.send_text(json.dumps({"type": "job_update", "state": "running"} | rank))
        wait_until(lambda: rank_of(client, job_id)["state"] == "running", "the victim's own report recorded")


def test_output_for_another_nodes_rank_is_not_stored_and_is_audited(client: TestClient, pair: tuple[str, str]) -> None:
    victim, evil = pair
    jobs = client.app.state.ctx.jobs  # type: ignore[attr-defined]
    job_id = running_job(client)
    chunk = {"type": "job_output", "job_id": job_id, "run": 1, "rank": 0, "stream": "stdout"}
    with channel(client, evil) as ws:
        ws.send_text(json.dumps(chunk | {"offset": 0, "data": "forged by evil\n"}))
        ws.send_text(json.dumps({"type": "heartbeat", "seq": 1}))  # read after the chunk: it is buffered
    with channel(client, victim) as ws:
        ws.send_text(json.dumps(chunk | {"offset": 0, "data": "the victim's own\n"}))
        ws.send_text(json.dumps({"type": "heartbeat", "seq": 1}))
    wait_until(lambda: len(jobs._output) == 2, "both chunks buffered")
    assert jobs.flush_output_once() == 1
    output = client.get(f"/api/v1/jobs/{job_id}/output").json()
    assert [c["data"] for c in output["chunks"]] == ["the victim's own\n"]
    [record] = refusals(client, "evil")
    assert record["action"] == "agent.channel.job_output"
    assert f"job {job_id}" in record["target"]


def test_an_inventory_claiming_another_live_nodes_gpu_or_hostname_is_refused(
    client: TestClient, pair: tuple[str, str]
) -> None:
    _, evil = pair
    headers = {"Authorization": f"Bearer {evil}"}
    victims_gpu = report_of("victim", gpus=1).gpus
    before = client.get("/api/v1/nodes/evil").json()
    claims = {
        "the victim's GPU": report_of("evil").model_copy(update={"gpus": victims_gpu}),
        "the victim's hostname": report_of("evil", hostname="victim.cluster"),
        "the victim's hostname, in capitals": report_of("evil", hostname="VICTIM.cluster"),
        "the victim's name as hostname": report_of("evil", hostname="victim"),
    }
    for what, claim in claims.items():
        answer = client.put("/api/v1/agent/inventory", content=claim.model_dump_json(), headers=headers)
        assert answer.status_code == 409, (what, answer.text)
        assert "victim" in answer.json()["detail"], what
    assert client.get("/api/v1/nodes/evil").json() == before  # nothing of any claim was stored
    victim = client.get("/api/v1/nodes/victim").json()
    assert (victim["hostname"], victim["gpu_count"]) == ("victim.cluster", 1)
    records = [r for r in client.get("/api/v1/audit", params={"actor": "node:evil"}).json() if r["result"] == 409]
    assert len(records) == len(claims)
    assert all("victim" in r["target"] for r in records)
    # Its own inventory is still taken.
    own = report_of("evil", gpus=2)
    assert client.put("/api/v1/agent/inventory", content=own.model_dump_json(), headers=headers).status_code == 204
    assert client.get("/api/v1/nodes/evil").json()["gpu_count"] == 2


def test_a_gpu_of_a_node_that_is_down_may_move(client: TestClient, pair: tuple[str, str]) -> None:
    """A card moved into another chassis: its old node is down, so its UUID is free to report."""
    _, evil = pair
    ctx = client.app.state.ctx  # type: ignore[attr-defined]
    with transaction(ctx.sessions) as session:
        session.execute(update(Node).where(Node.name == "victim").values(state=NodeState.DOWN))
    moved = report_of("evil").model_copy(update={"gpus": report_of("victim", gpus=1).gpus})
    answer = client.put(
        "/api/v1/agent/inventory", content=moved.model_dump_json(), headers={"Authorization": f"Bearer {evil}"}
    )
    assert answer.status_code == 204, answer.text


def test_a_join_claiming_a_live_nodes_gpu_is_refused_and_spends_nothing(
    client: TestClient, pair: tuple[str, str]
) -> None:
    join = client.post("/api/v1/tokens/join", json={"expires_in_s": 600}).json()["token"]
    body = {
        "name": "newcomer",
        "inventory": report_of("newcomer").model_copy(update={"gpus": report_of("victim", 1).gpus}),
    }
    answer = client.post(
        "/api/v1/agent/join",
        content=json.dumps(body, default=lambda m: m.model_dump()),
        headers={"Authorization": f"Bearer {join}", "Content-Type": "application/json"},
    )
    assert answer.status_code == 409, answer.text
    assert client.get("/api/v1/nodes/newcomer").status_code == 404
    honest = {"name": "newcomer", "inventory": report_of("newcomer", 1).model_dump()}
    again = client.post("/api/v1/agent/join", json=honest, headers={"Authorization": f"Bearer {join}"})
    assert again.status_code == 200, again.text  # the token's use was not spent by the refusal


def test_a_binary_frame_closes_the_channel_with_unsupported_data(client: TestClient) -> None:
    token = credential(client, "n1")
    with channel(client, token) as ws:
        ws.send_bytes(b'{"type": "heartbeat", "seq": 1}')
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_text()
    assert closed.value.code == 1003  # RFC 6455: unsupported data
    assert "text" in (closed.value.reason or "")


def test_a_ranks_end_is_recorded_after_the_output_sent_before_it(client: TestClient, pair: tuple[str, str]) -> None:
    """A job whose ranks all ended reads as done (`job logs --follow` stops): the output its node sent before
    the end is written first, not left in the buffer for the next flush."""
    victim, _ = pair
    job_id = running_job(client)
    rank = {"job_id": job_id, "run": 1, "rank": 0}
    with channel(client, victim) as ws:
        ws.send_text(json.dumps({"type": "job_output", "stream": "stdout", "offset": 0, "data": "last\n"} | rank))
        end = {"type": "job_update", "state": "exited", "outcome": "completed", "exit_code": 0}
        ws.send_text(json.dumps(end | rank))
        assert ws.receive_json() == {"type": "job_ack"} | rank
    output = client.get(f"/api/v1/jobs/{job_id}/output").json()
    assert ([c["data"] for c in output["chunks"]], output["done"]) == (["last\n"], True)
