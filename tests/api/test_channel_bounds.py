"""Numbers and times at the channel's edge (protocol.bounds): a message holding NaN, ±infinity or an
integer past its column is dropped whole and the channel stays open; a sample, event, line or cache entry
timed before 2000 or more than a day ahead is dropped alone; a NUL in text is stored as U+FFFD."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from starlette.websockets import WebSocketDisconnect

from gpufleet.core.db import transaction
from gpufleet.jobs.models import NodeArtifact
from gpufleet.logs.models import LogRecord
from gpufleet.monitoring.models import MetricSample
from gpufleet.protocol.bounds import EARLIEST_TS, MAX_AHEAD_S
from gpufleet.protocol.messages import CLOSE_BAD_MESSAGE
from gpufleet.protocol.metrics import Sample
from tests.api.channel_helpers import CHANNEL, bring_up, channel, credential, wait_until


def _sample(ts: Any) -> dict[str, Any]:
    return {"ts": ts, "entities": [{"entity": "gpu:0", "values": {"gpu_util": 1.0}}]}


def _stored_ts(client: TestClient, node: int) -> list[float]:
    ctx = client.app.state.ctx  # type: ignore[attr-defined]
    ctx.monitoring.flush_metrics_once()
    with transaction(ctx.sessions, readonly=True) as s:
        return sorted(s.scalars(select(MetricSample.ts).where(MetricSample.node_id == node)))


@pytest.mark.parametrize(
    "bad",
    [
        '{"type": "metrics", "samples": [{"ts": NaN, "entities": []}]}',
        '{"type": "metrics", "samples": [{"ts": Infinity, "entities": []}]}',
        '{"type": "metrics", "samples": [{"ts": 1800000000, "entities": [{"entity": "host", "values": {"load": -Infinity}}]}]}',  # noqa: E501
        '{"type": "heartbeat", "seq": 100000000000000000000000}',
        '{"type": "logs", "lines": [{"ts": 1800000000, "source": "k", "line": "x", "code": 99999999999999}]}',
        '{"type": "node_cache", "limit_bytes": 1e400, "entries": []}',
    ],
    ids=["nan-ts", "inf-ts", "-inf-value", "huge-seq", "huge-code", "overflowing-float"],
)
def test_a_message_with_a_number_out_of_bounds_is_dropped_and_the_channel_stays_open(
    client: TestClient, bad: str
) -> None:
    ctx = client.app.state.ctx  # type: ignore[attr-defined]
    credential(client, "other")
    other = bring_up(client, "other", gpus=1)
    token = credential(client, "n1")
    node = bring_up(client, "n1", gpus=1)
    now = ctx.clock.now()
    ctx.monitoring.ingest(other, [Sample.model_validate(_sample(now))])  # another node's, in the same flush
    with channel(client, token) as ws:
        ws.send_text(bad)
        ws.send_text(json.dumps({"type": "metrics", "samples": [_sample(now)]}))  # read only if still open
        wait_until(lambda: _stored_ts(client, node) == [now], "the next sample stored")
    assert _stored_ts(client, other) == [now]
    assert ctx.monitoring.refused_rows == 0


def test_items_timed_implausibly_are_dropped_alone(client: TestClient) -> None:
    ctx = client.app.state.ctx  # type: ignore[attr-defined]
    token = credential(client, "n1")
    node = bring_up(client, "n1", gpus=1)
    now = ctx.clock.now()
    times = [0.0, EARLIEST_TS - 1, EARLIEST_TS, now, now + MAX_AHEAD_S, now + MAX_AHEAD_S + 1, 1e300]
    lines = [{"ts": ts, "source": "kernel", "line": f"at {ts}"} for ts in times]
    with channel(client, token) as ws:
        ws.send_text(json.dumps({"type": "metrics", "samples": [_sample(ts) for ts in times]}))
        ws.send_text(json.dumps({"type": "logs", "lines": lines}))
        wait_until(lambda: _stored_ts(client, node), "the plausible samples stored")
    kept = [EARLIEST_TS, now, now + MAX_AHEAD_S]
    assert _stored_ts(client, node) == kept
    with transaction(ctx.sessions, readonly=True) as s:
        assert sorted(s.scalars(select(LogRecord.ts).where(LogRecord.node_id == node))) == kept


def test_a_nul_in_a_log_line_is_stored_as_a_replacement_character(client: TestClient) -> None:
    """PostgreSQL's text holds no NUL: one would fail the whole batch of lines there."""
    ctx = client.app.state.ctx  # type: ignore[attr-defined]
    token = credential(client, "n1")
    node = bring_up(client, "n1", gpus=0)
    line = {"ts": ctx.clock.now(), "source": "kern\u0000el", "line": "a\u0000b \\u0000 c"}
    with channel(client, token) as ws:
        ws.send_text(json.dumps({"type": "logs", "lines": [line]}))
        wait_until(ctx.monitoring.flush_log_lines_once, "the line stored")
    with transaction(ctx.sessions, readonly=True) as s:
        stored = s.execute(select(LogRecord.source, LogRecord.line).where(LogRecord.node_id == node)).one()
    assert tuple(stored) == ("kern\ufffdel", "a\ufffdb \\u0000 c")


def test_a_hello_out_of_bounds_opens_no_channel(client: TestClient) -> None:
    token = credential(client, "n1")
    with client.websocket_connect(CHANNEL, headers={"Authorization": f"Bearer {token}"}) as ws:
        ws.send_text('{"type": "hello", "heartbeat_interval_s": NaN}')
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_text()
    assert closed.value.code == CLOSE_BAD_MESSAGE


def test_a_cache_entry_is_kept_unless_its_time_cannot_be_stored(client: TestClient) -> None:
    """A node whose clock says 1970 still holds the artifact; one timed past year 9999 is dropped alone
    (it failed the whole report, and the channel, on every reconnect)."""
    ctx = client.app.state.ctx  # type: ignore[attr-defined]
    token = credential(client, "n1")
    node = bring_up(client, "n1", gpus=0)

    def entry(sha: str, ts: float) -> dict[str, Any]:
        return {"sha256": sha * 64, "size_bytes": 1, "copied_at": ts, "last_used_at": ts, "uses": 1}

    entries = [entry("a", 100.0), entry("b", 1e300), entry("c", ctx.clock.now())]
    with channel(client, token) as ws:
        ws.send_text(json.dumps({"type": "node_cache", "limit_bytes": 10, "entries": entries}))
        wait_until(lambda: _cached(client, node), "the cache recorded")
        ws.send_text(json.dumps({"type": "heartbeat", "seq": 1}))  # still open
    assert _cached(client, node) == ["a" * 64, "c" * 64]


def _cached(client: TestClient, node: int) -> list[str]:
    ctx = client.app.state.ctx  # type: ignore[attr-defined]
    with transaction(ctx.sessions, readonly=True) as s:
        return sorted(s.scalars(select(NodeArtifact.sha256).where(NodeArtifact.node_id == node)))
