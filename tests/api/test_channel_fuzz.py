"""Fuzzing the agent channel: whatever a node sends (any message type with any field replaced by a wrong
type, NaN, ±infinity, a huge integer, a NUL; text that is not JSON; binary frames), the head's handler
never fails with a traceback, no flush fails or refuses a row, and another node's samples and log lines,
sent through the same head meanwhile, are all stored.

Bounded: a few dozen examples, each one short channel; seconds, not minutes.
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

from gpufleet.core.db import transaction
from gpufleet.logs.models import LogRecord
from gpufleet.monitoring.models import MetricSample
from tests.api.channel_helpers import CHANNEL, bring_up, channel, credential, wait_until
from tests.api.test_channel_impostor import CHANNEL_TYPES

NOW = 1_800_000_000.0  # the tests' FakeClock

# A valid message of every type, to mutate: the fuzz reaches past the first field pydantic checks.
VALID: dict[str, dict[str, Any]] = {
    "hello": {"type": "hello", "heartbeat_interval_s": 1.0},
    "heartbeat": {"type": "heartbeat", "seq": 1},
    "metrics": {
        "type": "metrics",
        "samples": [
            {
                "ts": NOW,
                "entities": [{"entity": "gpu:0", "values": {"gpu_util": 1.0}}],
                "checks": [{"name": "disk", "status": 0}],
                "gpu_jobs": [{"gpu": 0, "job": "42"}],
            }
        ],
    },
    "events": {"type": "events", "events": [{"ts": NOW, "kind": "xid", "gpu": 0, "code": 79}]},
    "logs": {"type": "logs", "lines": [{"ts": NOW, "source": "kernel", "line": "x", "code": 79, "gpu": 0}]},
    "fault_result": {"type": "fault_result", "id": 1, "ok": True},
    "mig_result": {"type": "mig_result", "id": 1, "errors": {"0": "in use"}},
    "job_update": {"type": "job_update", "job_id": 1, "run": 1, "rank": 0, "state": "running"},
    "job_output": {
        "type": "job_output",
        "job_id": 1,
        "run": 1,
        "rank": 0,
        "stream": "stdout",
        "offset": 0,
        "data": "x",
    },
    "job_held": {"type": "job_held", "ranks": [{"job_id": 1, "run": 1, "rank": 0}]},
    "node_cache": {
        "type": "node_cache",
        "limit_bytes": 10,
        "entries": [{"sha256": "ab" * 32, "size_bytes": 1, "copied_at": NOW, "last_used_at": NOW, "uses": 1}],
    },
}

ODD_NUMBERS = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, 2**63, 2**64, -(2**63) - 1, 10**400, 1e308, 0.0, -1]),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=True, allow_infinity=True),
)
ODD_VALUES = st.recursive(
    ODD_NUMBERS | st.none() | st.booleans() | st.text(alphabet=st.characters(codec="utf-8"), max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a JSON value a fuzzed value may go (the message's own `type` included)."""
    found = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _paths(item, (*prefix, index))
    return found


def _replace(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[path[0]] = _replace(value[path[0]], path[1:], new)
    return copy


@st.composite
def mutated(draw: st.DrawFn) -> str:
    """A message of a known type with one place replaced by an odd value, as JSON text (NaN literals kept)."""
    message = VALID[draw(st.sampled_from(CHANNEL_TYPES))]
    path = draw(st.sampled_from(_paths(message)))
    return json.dumps(_replace(message, path, draw(ODD_VALUES)))


FRAMES = st.one_of(
    mutated(),
    st.sampled_from(list(VALID.values())).map(json.dumps),  # valid ones between, so state builds up
    st.binary(max_size=64),
    st.text(max_size=64),  # mostly not JSON
    st.sampled_from(['{"type": "metrics", "samples": [{"ts": NaN, "entities": []}]}', "[]", "null", '{"type": 1}']),
)


def test_the_head_survives_any_frame_and_keeps_every_other_nodes_data(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    ctx = client.app.state.ctx  # type: ignore[attr-defined]
    fuzz, steady = credential(client, "fuzz"), credential(client, "steady")
    steady_id = bring_up(client, "steady", gpus=1)
    bring_up(client, "fuzz", gpus=1)
    caplog.set_level(logging.WARNING)
    sent = 0

    @settings(
        max_examples=40,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        database=None,
    )
    @given(hello_first=st.booleans(), frames=st.lists(FRAMES, min_size=1, max_size=4))
    def one_channel(hello_first: bool, frames: list[str | bytes]) -> None:
        nonlocal sent
        with client.websocket_connect(CHANNEL, headers={"Authorization": f"Bearer {fuzz}"}) as ws:
            if hello_first:
                ws.send_text(json.dumps(VALID["hello"]))
            for frame in frames:
                if isinstance(frame, bytes):
                    ws.send_bytes(frame)
                else:
                    ws.send_text(frame)
        # The same head, meanwhile: another node's sample and log line.
        sent += 1
        with channel(client, steady) as ws:
            ts = ctx.clock.now() + sent
            ws.send_text(json.dumps(VALID["metrics"] | {"samples": [{"ts": ts, "entities": []}]}))
            ws.send_text(json.dumps({"type": "logs", "lines": [{"ts": ts, "source": "kernel", "line": f"{sent}"}]}))
            wait_until(
                lambda: ctx.monitoring.flush_metrics_once() >= 0 and _stored(ctx, steady_id) == (sent, sent),
                "the other node's sample and line stored",
            )
        ctx.jobs.flush_output_once()
        assert ctx.monitoring.refused_rows == 0  # nothing reached a flush that the database would refuse
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]

    one_channel()
    assert _stored(ctx, steady_id) == (sent, sent)


def _stored(ctx: Any, node_id: int) -> tuple[int, int]:
    """The node's samples and log lines stored."""
    with transaction(ctx.sessions, readonly=True) as s:
        samples = s.scalar(select(func.count()).select_from(MetricSample).where(MetricSample.node_id == node_id))
        lines = s.scalar(select(func.count()).select_from(LogRecord).where(LogRecord.node_id == node_id))
    return samples or 0, lines or 0
