"""What waits to go to the head: samples, events and log lines, bounded, packed into channel messages under
the size limit.

Samples are kept serialised (about 12 KB each for 8 GPUs): the simulator holds a backlog for a
thousand nodes in one process, and a pydantic object costs several times its JSON. While the head is
unreachable the oldest samples are dropped first; events (fewer, and what drains a node) go before
samples when the channel is back. A message leaves the outbox only once it was handed to the socket
(`sent`), so a disconnect mid-send loses nothing that was not written.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel

from gpufleet.protocol.logs import LogLine, LogLines
from gpufleet.protocol.messages import MAX_CHANNEL_MESSAGE_BYTES, Events, Metrics
from gpufleet.protocol.metrics import EntityValues, NodeEvent, Sample

# The envelopes around the items, exactly as Metrics and Events serialise (a test holds them to it).
_METRICS_HEAD = '{"type":"metrics","samples":['
_EVENTS_HEAD = '{"type":"events","events":['
_LOGS_HEAD = '{"type":"logs","lines":['
_TAIL = "]}"


def _max_length(model: type[BaseModel], name: str) -> int:
    """The max_length the protocol sets on a list field, so the two never disagree."""
    for rule in model.model_fields[name].metadata:
        if isinstance(getattr(rule, "max_length", None), int):
            return int(rule.max_length)
    raise LookupError(f"{model.__name__}.{name} has no max_length")


MAX_SAMPLES_PER_MESSAGE = _max_length(Metrics, "samples")
MAX_EVENTS_PER_MESSAGE = _max_length(Events, "events")
MAX_LINES_PER_MESSAGE = _max_length(LogLines, "lines")
Kind = Literal["events", "metrics", "logs"]


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One channel message ready to send: its JSON, and the last queued item it carries."""

    kind: Kind
    text: str
    upto: int
    count: int


@dataclass(frozen=True, slots=True)
class _Item:
    seq: int
    text: str
    size: int  # UTF-8 bytes


class Outbox:
    """Samples (at most `max_samples`, oldest dropped first) and events (at most `max_events`) for the channel.

    Not thread-safe: the daemon uses it from its event loop only.
    """

    def __init__(
        self,
        max_samples: int = 60,
        max_events: int = 256,
        limit_bytes: int = MAX_CHANNEL_MESSAGE_BYTES,
        max_log_lines: int = 2000,
    ) -> None:
        self.max_samples = max_samples
        self.max_events = max_events
        self.max_log_lines = max_log_lines
        self.limit_bytes = limit_bytes
        self._samples: deque[_Item] = deque()
        self._events: deque[_Item] = deque()
        self._logs: deque[_Item] = deque()
        self._seq = 0
        self.dropped_samples = 0
        self.dropped_events = 0
        self.dropped_log_lines = 0

    @property
    def pending(self) -> tuple[int, int]:
        """(samples, events) waiting."""
        return len(self._samples), len(self._events)

    def add_sample(self, sample: Sample) -> None:
        """Queue a sample; one too big for a single message is split into parts with the same `ts`."""
        text = sample.model_dump_json()
        for part in [text] if len(text.encode()) <= self._budget(_METRICS_HEAD) else self._split(sample):
            self._samples.append(self._item(part))
        while len(self._samples) > self.max_samples:
            self._samples.popleft()
            self.dropped_samples += 1

    def add_events(self, events: Iterable[NodeEvent]) -> None:
        """Queue events in the order seen; past `max_events` the oldest go first."""
        for event in events:
            self._events.append(self._item(event.model_dump_json()))
        while len(self._events) > self.max_events:
            self._events.popleft()
            self.dropped_events += 1

    def add_log_lines(self, lines: Iterable[LogLine]) -> None:
        """Queue log lines in the order read; past `max_log_lines` the oldest go first (their events, the
        ones health acts on, travel separately as events)."""
        for line in lines:
            self._logs.append(self._item(line.model_dump_json()))
        while len(self._logs) > self.max_log_lines:
            self._logs.popleft()
            self.dropped_log_lines += 1

    def next_message(self) -> Outgoing | None:
        """The next message to send (events, then samples, then log lines), or None when nothing waits.
        It stays queued until `sent`."""
        if self._events:
            return self._pack("events", _EVENTS_HEAD, self._events, MAX_EVENTS_PER_MESSAGE)
        if self._samples:
            return self._pack("metrics", _METRICS_HEAD, self._samples, MAX_SAMPLES_PER_MESSAGE)
        if self._logs:
            return self._pack("logs", _LOGS_HEAD, self._logs, MAX_LINES_PER_MESSAGE)
        return None

    def sent(self, message: Outgoing) -> None:
        """Drop what `message` carried (whatever of it is still queued)."""
        queue = {"events": self._events, "metrics": self._samples, "logs": self._logs}[message.kind]
        while queue and queue[0].seq <= message.upto:
            queue.popleft()

    def clear(self) -> None:
        """Forget everything queued (a simulated crash loses what the node had not sent)."""
        self._samples.clear()
        self._events.clear()
        self._logs.clear()

    def _item(self, text: str) -> _Item:
        self._seq += 1
        return _Item(self._seq, text, len(text.encode()))

    def _budget(self, head: str) -> int:
        return self.limit_bytes - len(head) - len(_TAIL)

    def _pack(self, kind: Kind, head: str, queue: deque[_Item], most: int) -> Outgoing:
        """As many queued items, oldest first, as fit in one message."""
        budget = self._budget(head)
        texts: list[str] = []
        used = 0
        last = queue[0].seq
        for item in queue:
            extra = item.size + (1 if texts else 0)  # the comma
            if texts and (used + extra > budget or len(texts) >= most):
                break
            texts.append(item.text)
            used += extra
            last = item.seq
        return Outgoing(kind, head + ",".join(texts) + _TAIL, last, len(texts))

    def _split(self, sample: Sample) -> list[str]:
        """Parts of a sample too big for one message (64 GPUs and many ports): same `ts`, entities packed
        greedily by their serialised size. The node's checks and GPU jobs go whole in the first part (the
        agent keeps checks to half a message, and GPU jobs are bounded to fit beside them), its shared
        mounts whole in the last."""
        budget = self._budget(_METRICS_HEAD)
        empty = len(Sample(ts=sample.ts, entities=[]).model_dump_json())
        checks, jobs = sample.checks, sample.gpu_jobs
        parts: list[str] = []
        current: list[EntityValues] = []
        used = len(Sample(ts=sample.ts, entities=[], checks=checks, gpu_jobs=jobs).model_dump_json().encode())
        for entity in sample.entities:
            size = len(entity.model_dump_json().encode()) + 1
            if (current or checks or jobs) and used + size > budget:
                parts.append(Sample(ts=sample.ts, entities=current, checks=checks, gpu_jobs=jobs).model_dump_json())
                current, used, checks, jobs = [], empty, [], []
            current.append(entity)
            used += size
        mounts = sample.mounts  # the shared file systems go in the last part, or one of their own
        if mounts and (current or checks or jobs):
            mounts_size = len(Sample(ts=sample.ts, entities=[], mounts=mounts).model_dump_json().encode()) - empty
            if used + mounts_size > budget:
                parts.append(Sample(ts=sample.ts, entities=current, checks=checks, gpu_jobs=jobs).model_dump_json())
                current, checks, jobs = [], [], []
        if current or checks or jobs or mounts:
            parts.append(
                Sample(ts=sample.ts, entities=current, checks=checks, gpu_jobs=jobs, mounts=mounts).model_dump_json()
            )
        return parts
