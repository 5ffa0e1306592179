"""What this replica knows right now about the nodes whose channels it holds: their latest samples
and their open events. Health is judged from this, in memory, so a fault reported by an agent is
judged within the next evaluation pass instead of after a database round trip.

Written from the event loop (channel messages), read from the monitoring thread: one lock.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field

from gpufleet.monitoring.checks import Entities
from gpufleet.protocol.metrics import CheckResult, GpuJob, MountInfo, NodeEvent, Sample

KEPT_SAMPLES = 8
MAX_OPEN_EVENTS = 64
# An event stays open until a sample taken this long after it shows its GPU again: the sample
# proves the GPU answered NVML after the event, not merely before the event's message arrived.
EVENT_CLEARED_AFTER_S = 0.5


@dataclass
class NodeTrack:
    samples: deque[tuple[float, Entities]] = field(default_factory=lambda: deque(maxlen=KEPT_SAMPLES))
    events: list[NodeEvent] = field(default_factory=list)
    last_sample_at: float | None = None  # the head's clock when the last sample arrived
    new_samples: int = 0  # since the last evaluation: each is one round of the resume count
    checks: list[CheckResult] = field(default_factory=list)  # node-side checks, as of the latest sample
    gpu_jobs: list[GpuJob] = field(default_factory=list)  # Slurm's jobs on the GPUs, as of the latest sample
    mounts: list[MountInfo] = field(default_factory=list)  # its shared file systems, as of the latest sample


@dataclass(frozen=True)
class TrackView:
    samples: list[Entities]  # latest first
    events: list[NodeEvent]
    last_sample_at: float | None
    new_samples: int
    checks: list[CheckResult] = field(default_factory=list)
    times: list[float] = field(default_factory=list)  # of `samples`, latest first


class HealthTracker:
    def __init__(self) -> None:
        self._nodes: dict[int, NodeTrack] = {}
        self._dirty: set[int] = set()
        self._lock = threading.Lock()

    def add_samples(self, node_id: int, samples: list[Sample], received_at: float) -> None:
        with self._lock:
            track = self._nodes.setdefault(node_id, NodeTrack())
            for sample in sorted(samples, key=lambda s: s.ts):
                entities = {e.entity: e.values for e in sample.entities}
                if track.samples and sample.ts == track.samples[0][0]:
                    # A sample too big for one message comes in parts with the same time: merge them.
                    track.samples[0][1].update(entities)
                    track.checks += sample.checks
                    track.gpu_jobs += sample.gpu_jobs
                    track.mounts += sample.mounts
                    continue
                if track.samples and sample.ts < track.samples[0][0]:
                    continue  # a late duplicate after a reconnect
                track.samples.appendleft((sample.ts, entities))
                track.checks = list(sample.checks)
                track.gpu_jobs = list(sample.gpu_jobs)
                track.mounts = list(sample.mounts)
                track.new_samples += 1
                track.events = [e for e in track.events if not _cleared_by(e, sample.ts, entities)]
            track.last_sample_at = received_at
            self._dirty.add(node_id)

    def add_events(self, node_id: int, events: list[NodeEvent]) -> None:
        with self._lock:
            track = self._nodes.setdefault(node_id, NodeTrack())
            track.events = (track.events + [e for e in events if e.kind != "collector_failed"])[-MAX_OPEN_EVENTS:]
            self._dirty.add(node_id)

    def clear_events(self, node_id: int) -> None:
        with self._lock:
            track = self._nodes.get(node_id)
            if track is not None:
                track.events.clear()
                self._dirty.add(node_id)

    def forget(self, node_id: int) -> None:
        with self._lock:
            self._nodes.pop(node_id, None)
            self._dirty.discard(node_id)

    def tracked(self) -> list[int]:
        with self._lock:
            return list(self._nodes)

    def take_dirty(self) -> set[int]:
        with self._lock:
            dirty, self._dirty = self._dirty, set()
            return dirty

    def view(self, node_id: int) -> TrackView | None:
        """The node's state for one evaluation; resets its count of new samples."""
        with self._lock:
            track = self._nodes.get(node_id)
            if track is None:
                return None
            view = TrackView(
                [s for _, s in track.samples],
                list(track.events),
                track.last_sample_at,
                track.new_samples,
                list(track.checks),
                [t for t, _ in track.samples],
            )
            track.new_samples = 0
            return view

    def latest(self, node_id: int) -> Entities:
        with self._lock:
            track = self._nodes.get(node_id)
            return dict(track.samples[0][1]) if track is not None and track.samples else {}

    def gpu_jobs(self, node_id: int) -> list[GpuJob]:
        """The workload manager's jobs on the node's GPUs (Slurm's job map), as of its latest sample."""
        with self._lock:
            track = self._nodes.get(node_id)
            return list(track.gpu_jobs) if track is not None else []

    def mounts(self, node_id: int) -> list[MountInfo]:
        """The node's shared file systems (agent.storage), as of its latest sample."""
        with self._lock:
            track = self._nodes.get(node_id)
            return list(track.mounts) if track is not None else []

    def recent(self, node_id: int, kind: str) -> list[tuple[float, Entities]]:
        """The node's kept samples, latest first, each cut to the entities named `KIND:...`."""
        prefix = kind + ":"
        with self._lock:
            track = self._nodes.get(node_id)
            if track is None:
                return []
            return [(ts, {e: v for e, v in entities.items() if e.startswith(prefix)}) for ts, entities in track.samples]


def _cleared_by(event: NodeEvent, ts: float, entities: Entities) -> bool:
    if event.kind == "host_fault":
        # No sample shows a kernel's fault mended: it stays open while this channel lasts, and the node's
        # next channel (after the reboot or agent restart that fixes it) starts without it.
        return False
    if ts < event.ts + EVENT_CLEARED_AFTER_S:
        return False
    if event.gpu is None:
        return True
    return f"gpu:{event.gpu}" in entities
