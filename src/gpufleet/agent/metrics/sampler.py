"""One collection round: every collector in turn, each failure isolated, the result one `Sample`.

A collector that raises loses its own values for the round and nothing else; the failure is sent
once as a `collector_failed` event per distinct message (a collector failing every five seconds must
not flood the head), and logged once.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence

from pydantic import ValidationError

from gpufleet.agent.metrics.ports import Collector, EntityMap
from gpufleet.core.errors import describe
from gpufleet.protocol.metrics import (
    MAX_ENTITIES_PER_SAMPLE,
    MAX_GPU_JOBS_PER_SAMPLE,
    MAX_METRICS_PER_ENTITY,
    MAX_MOUNTS_PER_SAMPLE,
    EntityValues,
    GpuJob,
    MountInfo,
    NodeEvent,
    Sample,
)

log = logging.getLogger(__name__)

MAX_REMEMBERED_FAILURES = 256  # distinct failure messages kept for de-duplication


class Sampler:
    """Runs the collectors; `collect` is what the daemon calls every interval (in a worker thread)."""

    def __init__(self, collectors: Sequence[Collector], *, clock: Callable[[], float] = time.time) -> None:
        self.collectors = list(collectors)
        self._clock = clock
        self._reported: set[tuple[str, str]] = set()

    def collect(self) -> tuple[Sample, list[NodeEvent]]:
        """One round: the sample (always at least the `host` entity with `metrics_collect_s`) and the
        events the collectors saw. Raises nothing."""
        ts = self._clock()
        started = time.perf_counter()
        entities: EntityMap = {}
        events: list[NodeEvent] = []
        gpu_jobs: list[GpuJob] = []
        mounts: list[MountInfo] = []
        for collector in self.collectors:
            try:
                collected = collector.collect()
            except Exception as exc:  # one failing collector never stops the others
                self._failed(collector.name, str(exc) or type(exc).__name__, events, exc)
                continue
            for entity, values in collected.entities.items():
                entities.setdefault(entity, {}).update(values)
            events.extend(collected.events)
            gpu_jobs.extend(collected.gpu_jobs)
            mounts.extend(collected.mounts)
            for problem in collected.problems:
                self._failed(collector.name, problem, events)
        host = entities.setdefault("host", {})
        host["metrics_collect_s"] = round(time.perf_counter() - started, 6)
        if len(gpu_jobs) > MAX_GPU_JOBS_PER_SAMPLE:
            self._failed("sampler", f"{len(gpu_jobs)} GPU jobs, only {MAX_GPU_JOBS_PER_SAMPLE} sent", events)
            gpu_jobs = gpu_jobs[:MAX_GPU_JOBS_PER_SAMPLE]
        sample = self._sample(ts, entities, events)
        if gpu_jobs:  # already valid models: the collector built them
            sample = sample.model_copy(update={"gpu_jobs": gpu_jobs})
        if mounts:
            sample = sample.model_copy(update={"mounts": mounts[:MAX_MOUNTS_PER_SAMPLE]})
        return sample, events

    def _sample(self, ts: float, entities: EntityMap, events: list[NodeEvent]) -> Sample:
        """Build the Sample: non-finite values dropped, limits kept; an entity the schema refuses is dropped
        (and reported) rather than costing the whole sample."""
        items = [
            {"entity": name, "values": {k: v for k, v in values.items() if math.isfinite(v)}}
            for name, values in list(entities.items())[:MAX_ENTITIES_PER_SAMPLE]
        ]
        for item in items:
            values = item["values"]
            if isinstance(values, dict) and len(values) > MAX_METRICS_PER_ENTITY:
                item["values"] = dict(list(values.items())[:MAX_METRICS_PER_ENTITY])
        try:
            return Sample.model_validate({"ts": ts, "entities": items})
        except ValidationError:
            pass  # rare: find the entity at fault and keep the rest
        kept = []
        for item in items:
            try:
                kept.append(EntityValues.model_validate(item))
            except ValidationError as exc:
                self._failed("sampler", f"entity {str(item['entity'])[:80]!r} dropped: {describe(exc)}", events)
        return Sample(ts=ts, entities=kept)

    def _failed(self, collector: str, message: str, events: list[NodeEvent], exc: BaseException | None = None) -> None:
        """Report a failure once per (collector, message)."""
        key = (collector, message)
        if key in self._reported:
            return
        if len(self._reported) >= MAX_REMEMBERED_FAILURES:
            # Messages that keep changing (a number in them) would otherwise be reported every round.
            log.debug("metrics collector %s: %s", collector, message)
            return
        self._reported.add(key)
        trace = exc if log.isEnabledFor(logging.DEBUG) else None
        log.warning("metrics collector %s: %s", collector, message, exc_info=trace)
        text = f"{collector}: {message}"[:512]
        events.append(NodeEvent(ts=self._clock(), kind="collector_failed", message=text))
