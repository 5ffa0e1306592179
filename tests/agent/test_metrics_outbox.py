"""The outbox: bounded, events first, every message under the channel's size limit and valid on the wire."""

from __future__ import annotations

from gpufleet.agent.metrics.gpu import GpuCollector
from gpufleet.agent.metrics.outbox import Outbox
from gpufleet.agent.metrics.sampler import Sampler
from gpufleet.protocol.logs import LogLine, LogLines
from gpufleet.protocol.messages import MAX_CHANNEL_MESSAGE_BYTES, Events, Metrics, agent_message_adapter
from gpufleet.protocol.metrics import GpuJob, NodeEvent, Sample
from gpufleet.sim.nvml import SimulatedNvml


def _sample(ts: float, entities: int = 1, metrics: int = 1) -> Sample:
    return Sample.model_validate(
        {
            "ts": ts,
            "entities": [
                {"entity": f"gpu:{i}", "values": {f"m{j}": float(j) for j in range(metrics)}} for i in range(entities)
            ],
        }
    )


def _drain(outbox: Outbox) -> list[Metrics | Events]:
    messages = []
    while (message := outbox.next_message()) is not None:
        assert len(message.text.encode()) <= MAX_CHANNEL_MESSAGE_BYTES
        parsed = agent_message_adapter.validate_json(message.text)
        assert isinstance(parsed, Metrics | Events)
        messages.append(parsed)
        outbox.sent(message)
    return messages


def test_a_backlog_goes_oldest_first_in_messages_under_the_limit() -> None:
    sampler = Sampler([GpuCollector(SimulatedNvml("n1"))])
    outbox = Outbox(max_samples=60)
    for _ in range(60):
        outbox.add_sample(sampler.collect()[0])

    messages = _drain(outbox)

    samples = [s for m in messages if isinstance(m, Metrics) for s in m.samples]
    assert len(samples) == 60
    assert [s.ts for s in samples] == sorted(s.ts for s in samples)
    assert 1 < len(messages) < 60  # batched, and split to stay under 64 KiB
    assert outbox.pending == (0, 0)


def test_past_the_backlog_the_oldest_samples_go() -> None:
    outbox = Outbox(max_samples=3)
    for ts in range(5):
        outbox.add_sample(_sample(float(ts)))

    messages = _drain(outbox)

    assert [s.ts for m in messages if isinstance(m, Metrics) for s in m.samples] == [2.0, 3.0, 4.0]
    assert outbox.dropped_samples == 2


def test_events_go_before_samples() -> None:
    outbox = Outbox()
    outbox.add_sample(_sample(1.0))
    outbox.add_events([NodeEvent(ts=2.0, kind="xid", gpu=0, code=79)])

    kinds = [m.type for m in _drain(outbox)]

    assert kinds == ["events", "metrics"]


def test_a_message_not_sent_stays_queued_and_one_sent_while_samples_were_dropped_removes_only_its_own() -> None:
    outbox = Outbox(max_samples=2)
    outbox.add_sample(_sample(1.0))
    outbox.add_sample(_sample(2.0))
    first = outbox.next_message()
    assert first is not None
    assert outbox.next_message() == first  # not sent: offered again

    outbox.add_sample(_sample(3.0))  # 1.0 is dropped meanwhile
    outbox.sent(first)  # carried 1.0 and 2.0

    assert [s.ts for m in _drain(outbox) if isinstance(m, Metrics) for s in m.samples] == [3.0]


def test_a_sample_too_big_for_one_message_is_split_by_entity() -> None:
    big = _sample(7.0, entities=200, metrics=30)  # about 120 KB
    outbox = Outbox()

    outbox.add_sample(big)
    messages = _drain(outbox)

    parts = [s for m in messages if isinstance(m, Metrics) for s in m.samples]
    assert len(parts) >= 2
    assert {p.ts for p in parts} == {7.0}
    assert [e for p in parts for e in p.entities] == big.entities


def test_a_split_sample_carries_its_gpu_jobs_once_in_the_first_part() -> None:
    jobs = [GpuJob(gpu=i, job=str(100 + i), user="alice", account="vision") for i in range(64)]
    big = _sample(7.0, entities=200, metrics=30).model_copy(update={"gpu_jobs": jobs})
    outbox = Outbox()

    outbox.add_sample(big)

    parts = [s for m in _drain(outbox) if isinstance(m, Metrics) for s in m.samples]
    assert len(parts) >= 2
    assert parts[0].gpu_jobs == jobs
    assert all(p.gpu_jobs == [] for p in parts[1:])
    assert [e for p in parts for e in p.entities] == big.entities


def test_many_events_are_batched_up_to_the_protocol_limit() -> None:
    outbox = Outbox(max_events=300)
    outbox.add_events(NodeEvent(ts=float(i), kind="collector_failed", message="x" * 100) for i in range(300))

    messages = _drain(outbox)

    assert [len(m.events) for m in messages if isinstance(m, Events)] == [256, 44]


def test_log_lines_go_after_events_and_samples_batched_under_the_limit_and_bounded() -> None:
    outbox = Outbox(max_log_lines=1500)
    long_line = "NVRM: Xid (PCI:0000:cb:00): 13, " + "x" * 1900
    outbox.add_log_lines(LogLine(ts=float(i), source="/dev/kmsg", line=long_line) for i in range(1600))
    outbox.add_sample(_sample(1.0))
    outbox.add_events([NodeEvent(ts=2.0, kind="xid", gpu=0, code=13)])
    messages = []
    while (message := outbox.next_message()) is not None:
        assert len(message.text.encode()) <= MAX_CHANNEL_MESSAGE_BYTES
        messages.append(agent_message_adapter.validate_json(message.text))
        outbox.sent(message)
    assert [m.type for m in messages[:3]] == ["events", "metrics", "logs"]
    lines = [line for m in messages if isinstance(m, LogLines) for line in m.lines]
    assert [line.ts for line in lines] == [float(i) for i in range(100, 1600)]  # the oldest 100 dropped
    assert outbox.dropped_log_lines == 100
    assert len(messages) > 40  # about 30 lines of 2 KB fit in 64 KiB
