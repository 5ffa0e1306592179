"""An impostor agent (node `evil`, with its own valid credential) sends every message type of the
agent channel about node `victim`: it cannot answer `victim`'s commands, report on or hold `victim`'s
ranks, or put anything in `victim`'s records. Whatever it sends lands in its own records, or is refused
(closed with 4403) and audited.

The message types come from protocol.messages.AnyAgentMessage: a new type without a case here fails
`test_every_channel_message_type_has_a_case`. In-process (TestClient) rather than tests/e2e: the same
head code, twenty cases in seconds.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, get_args

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from starlette.testclient import WebSocketTestSession
from starlette.websockets import WebSocketDisconnect

from gpufleet.core.clock import to_datetime
from gpufleet.core.db import Base, transaction
from gpufleet.inventory.models import Node
from gpufleet.jobs.models import Job
from gpufleet.protocol.messages import CLOSE_FORBIDDEN, AnyAgentMessage
from tests.api.channel_helpers import (
    CHANNEL,
    bring_up,
    channel,
    credential,
    node_id,
    rank_of,
    refusals,
    running_job,
    wait_until,
)

# One database: who may say what is checked above the database; test_channel_bounds runs both.
pytestmark = pytest.mark.one_database

SHA = "ab" * 32
CHANNEL_TYPES = sorted(model.model_fields["type"].default for model in get_args(AnyAgentMessage))


@dataclass
class World:
    client: TestClient
    ctx: Any
    victim_ws: WebSocketTestSession
    evil: str  # evil's credential
    victim_id: int
    evil_id: int
    job_id: int

    @property
    def rank(self) -> dict[str, int]:
        return {"job_id": self.job_id, "run": 1, "rank": 0}

    def victims(self) -> dict[str, Any]:
        """Everything the head holds about the victim: every row keyed by its node or its job, and what
        the channel's in-memory books say of it."""
        found: dict[str, Any] = {}
        with transaction(self.ctx.sessions, readonly=True) as s:
            for table in Base.metadata.sorted_tables:
                for column, value in (("node_id", self.victim_id), ("job_id", self.job_id)):
                    if column in table.c:
                        rows = s.execute(select(table).where(table.c[column] == value)).all()
                        found[f"{table.name}.{column}"] = sorted(map(repr, rows))
            found["node"] = repr(s.execute(select(Node.__table__).where(Node.id == self.victim_id)).one())
            found["job"] = repr(s.execute(select(Job.__table__).where(Job.id == self.job_id)).one())
        found["heartbeat"] = self.ctx.loops.book.latest.get(self.victim_id)
        found["latest sample"] = self.ctx.monitoring.tracker.latest(self.victim_id)
        found["gpu jobs"] = self.ctx.monitoring.tracker.gpu_jobs(self.victim_id)
        return found

    def flush(self) -> None:
        self.ctx.monitoring.flush_metrics_once()
        self.ctx.jobs.flush_output_once()

    def evils(self, table: str) -> int:
        with transaction(self.ctx.sessions, readonly=True) as s:
            t = Base.metadata.tables[table]
            return len(s.execute(select(t).where(t.c.node_id == self.evil_id)).all())


@pytest.fixture
def world(client: TestClient) -> Iterator[World]:
    """`victim` up with a GPU, a running rank, a sample, a log line and a cached artifact, its channel
    open; `evil` up, with no GPU."""
    ctx = client.app.state.ctx  # type: ignore[attr-defined]
    victim, evil = credential(client, "victim"), credential(client, "evil")
    bring_up(client, "victim", gpus=1)
    bring_up(client, "evil", gpus=0)
    job_id = running_job(client)
    now = ctx.clock.now()
    with channel(client, victim) as ws:
        rank = {"job_id": job_id, "run": 1, "rank": 0}
        ws.send_text(json.dumps({"type": "job_update", "state": "running"} | rank))
        ws.send_text(json.dumps(_metrics(now, util=10.0)))
        ws.send_text(json.dumps({"type": "logs", "lines": [{"ts": now, "source": "kernel", "line": "victim's"}]}))
        ws.send_text(json.dumps(_cache(now)))
        ws.send_text(json.dumps({"type": "job_output", "stream": "stdout", "offset": 0, "data": "victim's\n"} | rank))
        wait_until(lambda: rank_of(client, job_id)["state"] == "running", "the victim's rank running")
        world = World(client, ctx, ws, evil, node_id(client, "victim"), node_id(client, "evil"), job_id)
        wait_until(lambda: world.victims()["node_artifacts.node_id"], "the victim's cache recorded")
        wait_until(ctx.monitoring.flush_metrics_once, "the victim's sample and line stored")
        wait_until(ctx.jobs.flush_output_once, "the victim's output stored")
        ctx.loops.flush_once()  # the victim's receipt of its hello written: only an impostor's could change it
        yield world


def _metrics(ts: float, util: float) -> dict[str, Any]:
    return {"type": "metrics", "samples": [{"ts": ts, "entities": [{"entity": "gpu:0", "values": {"gpu_util": util}}]}]}


def _cache(ts: float) -> dict[str, Any]:
    entry = {"sha256": SHA, "size_bytes": 1, "copied_at": ts, "last_used_at": ts, "uses": 1}
    return {"type": "node_cache", "limit_bytes": 10, "entries": [entry]}


def _refused(world: World, ws: WebSocketTestSession, message_type: str) -> None:
    """The channel was closed with 4403, and the audit log says evil sent `message_type` about the victim."""
    with pytest.raises(WebSocketDisconnect) as closed:
        ws.receive_text()
    assert closed.value.code == CLOSE_FORBIDDEN
    [record] = refusals(world.client, "evil")
    assert record["action"] == f"agent.channel.{message_type}"
    assert "victim" in record["target"]


# -- one case per message type: evil sends it about the victim ---------------------------------------


def _hello(w: World) -> None:
    """A hello naming the victim's inventory fingerprint opens evil's own channel, nobody else's."""
    with w.client.websocket_connect(CHANNEL, headers={"Authorization": f"Bearer {w.evil}"}) as ws:
        with transaction(w.ctx.sessions, readonly=True) as s:
            theirs = s.scalar(select(Node.inventory_fingerprint).where(Node.id == w.victim_id))
        ws.send_text(json.dumps({"type": "hello", "heartbeat_interval_s": 1.0, "inventory_fingerprint": theirs}))
        assert ws.receive_json() == {"type": "welcome", "node": "evil", "inventory_wanted": True}


def _heartbeat(w: World) -> None:
    with channel(w.client, w.evil) as ws:
        ws.send_text(json.dumps({"type": "heartbeat", "seq": 10**6}))
        wait_until(lambda: getattr(w.ctx.loops.book.latest.get(w.evil_id), "seq", 0) == 10**6, "evil's heartbeat")
    w.ctx.loops.flush_once()


def _metrics_case(w: World) -> None:
    with channel(w.client, w.evil) as ws:
        ws.send_text(json.dumps(_metrics(w.ctx.clock.now() + 1, util=99.0)))
        wait_until(w.ctx.monitoring.flush_metrics_once, "evil's sample stored")
    assert w.evils("metric_samples") == 1


def _events(w: World) -> None:
    with channel(w.client, w.evil) as ws:
        event = {"ts": w.ctx.clock.now(), "kind": "xid", "gpu": 0, "code": 79, "message": "fallen off the bus"}
        ws.send_text(json.dumps({"type": "events", "events": [event]}))
        wait_until(lambda: w.evil_id in w.ctx.monitoring.tracker.tracked(), "evil's event taken as evil's")


def _logs(w: World) -> None:
    with channel(w.client, w.evil) as ws:
        line = {"ts": w.ctx.clock.now(), "source": "kernel", "line": "NVRM: Xid (PCI:0000:01:00): 79", "gpu": 0}
        ws.send_text(json.dumps({"type": "logs", "lines": [line]}))
        wait_until(w.ctx.monitoring.flush_log_lines_once, "evil's line stored")
    assert w.evils("log_records") == 1


def _fault_result(w: World) -> None:
    answer: dict[str, httpx.Response] = {}

    def inject() -> None:
        answer["http"] = w.client.post("/api/v1/nodes/victim/faults", json={"action": "inject", "kind": "xid79"})

    with channel(w.client, w.evil) as ws:
        sender = threading.Thread(target=inject)
        sender.start()
        command = _next_of(w.victim_ws, "fault")
        ws.send_text(json.dumps({"type": "fault_result", "id": command["id"], "ok": False, "message": "by evil"}))
        _refused(w, ws, "fault_result")
        w.victim_ws.send_text(json.dumps({"type": "fault_result", "id": command["id"], "ok": True}))
        sender.join(15)
    assert answer["http"].json() == {"node": "victim", "ok": True, "message": ""}


def _job_update(w: World) -> None:
    with channel(w.client, w.evil) as ws:
        ws.send_text(
            json.dumps({"type": "job_update", "state": "exited", "outcome": "failed", "exit_code": 1} | w.rank)
        )
        _refused(w, ws, "job_update")


def _job_output(w: World) -> None:
    with channel(w.client, w.evil) as ws:
        chunk = {"type": "job_output", "stream": "stdout", "offset": 9, "data": "forged\n"} | w.rank
        ws.send_text(json.dumps(chunk))
        wait_until(lambda: w.ctx.jobs._output, "evil's chunk buffered")
    w.ctx.jobs.flush_output_once()
    [record] = refusals(w.client, "evil")
    assert record["action"] == "agent.channel.job_output"
    assert "victim" in record["target"]


def _job_held(w: World) -> None:
    with channel(w.client, w.evil) as ws:
        ws.send_text(json.dumps({"type": "job_held", "ranks": [w.rank]}))
        _refused(w, ws, "job_held")


def _node_cache(w: World) -> None:
    """Evil may say it caches the victim's artifact: that is a claim about its own cache only."""
    with channel(w.client, w.evil) as ws:
        ws.send_text(json.dumps(_cache(w.ctx.clock.now())))
        wait_until(lambda: w.evils("node_artifacts") == 1, "evil's cache recorded as evil's")


def _mig_result(w: World) -> None:
    """A MIG answer speaks for the node whose channel it came on: evil's says something of evil alone."""
    with transaction(w.ctx.sessions) as s:
        evil = s.get(Node, w.evil_id)
        assert evil is not None
        evil.mig_sent_at = to_datetime(w.ctx.clock.now())  # as if the head had asked evil for a layout
    with channel(w.client, w.evil) as ws:
        ws.send_text(json.dumps({"type": "mig_result", "id": 1, "errors": {"0": "forged"}}))

        def recorded() -> bool:
            with transaction(w.ctx.sessions, readonly=True) as s:
                found = s.get(Node, w.evil_id)
                return found is not None and found.mig_errors == {"0": "forged"}

        wait_until(recorded, "evil's answer recorded as evil's")


def _next_of(ws: WebSocketTestSession, kind: str) -> dict[str, Any]:
    """The next message of type `kind` the head sent on `ws` (job starts and the like may come first)."""
    while True:
        message: dict[str, Any] = ws.receive_json()
        if message["type"] == kind:
            return message


CASES: dict[str, Callable[[World], None]] = {
    "hello": _hello,
    "heartbeat": _heartbeat,
    "metrics": _metrics_case,
    "events": _events,
    "logs": _logs,
    "fault_result": _fault_result,
    "mig_result": _mig_result,
    "job_update": _job_update,
    "job_output": _job_output,
    "job_held": _job_held,
    "node_cache": _node_cache,
}


def test_every_channel_message_type_has_a_case() -> None:
    assert sorted(CASES) == CHANNEL_TYPES


@pytest.mark.parametrize("message_type", CHANNEL_TYPES)
def test_an_impostor_changes_nothing_of_another_node(world: World, message_type: str) -> None:
    before = world.victims()
    CASES[message_type](world)
    world.flush()
    assert world.victims() == before
    assert refusals(world.client, "victim") == []
