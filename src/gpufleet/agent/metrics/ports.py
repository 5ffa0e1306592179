"""What every collector returns, and the interfaces the agent's daemon uses to sample and to watch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from gpufleet.core.errors import GpufleetError
from gpufleet.protocol.metrics import GpuJob, MountInfo, NodeEvent, Sample

# entity name ("gpu:0", "host", ...) -> metric name -> value
EntityMap = dict[str, dict[str, float]]


class CollectorError(GpufleetError):
    """A collector could not read anything this round (library missing, driver down)."""


@dataclass
class Collected:
    """One collector's part of a round: values by entity, events it saw, and problems short of failure.

    A problem is one line ("GPU 3: nvmlDeviceGetClockInfo: Unknown Error") for something that kept
    a few values out of this round but not the rest; the sampler reports each distinct one once.
    `gpu_jobs`: which workload manager's jobs hold which GPUs (the Slurm job map), sent with the sample.
    `mounts`: the shared file systems the `fs:` entities are (agent.storage), sent with the sample.
    """

    entities: EntityMap = field(default_factory=dict)
    events: list[NodeEvent] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    gpu_jobs: list[GpuJob] = field(default_factory=list)
    mounts: list[MountInfo] = field(default_factory=list)


class Collector(Protocol):
    """One source of metrics (the GPUs, the host, the InfiniBand ports)."""

    name: str

    def collect(self) -> Collected:
        """Read the current values. Raises CollectorError (or anything else) when nothing could be read."""
        ...


class SampleSource(Protocol):
    """What the daemon calls every metrics interval, in a worker thread."""

    def collect(self) -> tuple[Sample, list[NodeEvent]]:
        """One round: the sample and the events seen while taking it. Raises nothing on purpose."""
        ...


class EventSource(Protocol):
    """Events that must not wait for the next sample (Xid errors), read by the daemon as they come.

    `blocking` says whether `poll` waits in the driver (run it in a thread) or returns at once
    (call it on the event loop when woken, as the simulator does).
    """

    blocking: bool

    def poll(self, timeout_ms: int) -> list[NodeEvent]:
        """Wait up to `timeout_ms` for events and return those seen (often none). Raises nothing."""
        ...
