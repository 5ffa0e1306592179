"""The head's monitoring loops: store samples, judge health, drain and resume, raise alerts, roll up.

Channels hand samples and events to `ingest`/`events` (event-loop thread, no I/O). The loops run
their database work on their own thread, apart from the heartbeat loops', so a slow metrics write
can never delay a heartbeat flush:

- every `metrics_flush_s`, buffered samples are written in one batch;
- every `health_pass_s`, nodes with news are judged (an Xid is judged within this, not at the next
  sample); every few seconds all of this replica's nodes are, so stale metrics are noticed too;
- the leader rolls samples up and prunes old ones every minute, aggregating in a process of its own;
- the leader mines the stored log lines for templates every `template_pass_s` (logs.mining), on the
  roll-up's thread, and fires `LogTemplateBurst` when a template bursts.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.core.clock import Clock
from gpufleet.core.db import transaction
from gpufleet.core.loops import run_periodic
from gpufleet.inventory.liveness import Change
from gpufleet.inventory.models import Gpu, Node
from gpufleet.logs import store as logs_store
from gpufleet.logs.forward import event_json
from gpufleet.logs.mining import CategoryBurst, TemplateMining
from gpufleet.monitoring import alerts, store
from gpufleet.monitoring.health import HealthChange, HealthJudge
from gpufleet.monitoring.models import Alert
from gpufleet.monitoring.thresholds import Transition
from gpufleet.monitoring.tracker import HealthTracker
from gpufleet.protocol.logs import LogLine
from gpufleet.protocol.metrics import NodeEvent, Sample
from gpufleet.workers import batches, rollup_process

log = logging.getLogger(__name__)
T = TypeVar("T")
MAX_BUFFERED_SAMPLES = 60_000  # a minute of 1,000 nodes at 1 s; beyond it, drop the oldest
MAX_BUFFERED_LOG_LINES = 100_000
FULL_PASS_EVERY = 20  # health passes: with 0.1 s passes, every node is judged at least every 2 s

OnAlerts = Callable[[list[Alert]], None]


def _of_live_nodes(session: Session, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows whose node still exists (one removed while they waited fails the batch on its foreign key)."""
    alive = set(session.scalars(select(Node.id).where(Node.id.in_({r["node_id"] for r in rows}))))
    return [r for r in rows if r["node_id"] in alive]


@dataclass
class MonitoringLoops:
    sessions: sessionmaker[Session]
    clock: Clock
    judge: HealthJudge
    is_leader: Callable[[], bool]
    on_alerts: OnAlerts = lambda _alerts: None
    retention: store.Retention = field(default_factory=store.Retention)
    metrics_flush_s: float = 1.0
    health_pass_s: float = 0.1
    rollup_every_s: float = 60.0
    mining: TemplateMining | None = None
    forward: Callable[[list[dict[str, Any]]], None] | None = None  # logs.forward.EventForwarder.submit
    template_pass_s: float = 5.0
    _pending: list[tuple[int, Sample]] = field(default_factory=list)  # encoded on the flush thread
    _pending_lines: list[tuple[int, LogLine]] = field(default_factory=list)
    _liveness: list[Change] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _passes: int = 0
    dropped_rows: int = 0
    stored_rows: int = 0
    dropped_lines: int = 0
    refused_rows: int = 0  # samples and log lines the database refused, each dropped alone (workers.batches)

    @property
    def tracker(self) -> HealthTracker:
        return self.judge.tracker

    # -- called from the channels (event loop) and the heartbeat loops ------------------------------
    def ingest(self, node_id: int, samples: list[Sample]) -> None:
        # No encoding here: this runs on the event loop, which every agent channel shares.
        with self._lock:
            self._pending.extend((node_id, sample) for sample in samples)
            excess = len(self._pending) - MAX_BUFFERED_SAMPLES
            if excess > 0:  # the database cannot keep up: keep the newest, say so
                del self._pending[:excess]
                self.dropped_rows += excess
        self.tracker.add_samples(node_id, samples, self.clock.now())

    def log_lines(self, node_id: int, lines: list[LogLine]) -> None:
        """Keep a node's log lines for the next flush (event loop; no I/O)."""
        with self._lock:
            self._pending_lines.extend((node_id, line) for line in lines)
            excess = len(self._pending_lines) - MAX_BUFFERED_LOG_LINES
            if excess > 0:
                del self._pending_lines[:excess]
                self.dropped_lines += excess

    def events(self, node_id: int, events: list[NodeEvent]) -> None:
        for event in events:
            if event.kind == "collector_failed":
                log.warning("node %s: collector failed: %s", node_id, event.message)
        self.tracker.add_events(node_id, events)

    def liveness_changed(self, changes: list[Change]) -> None:
        with self._lock:
            self._liveness.extend(changes)

    # -- one pass of each loop (what the tests call) ------------------------------------------------
    def flush_metrics_once(self) -> int:
        self.flush_log_lines_once()
        with self._lock:
            pending, self._pending = self._pending, []
        rows = [row for node_id, sample in pending for row in store.sample_rows(node_id, [sample])]
        written = len(self._write_batch(rows, store.write_rows))
        self.stored_rows += written
        return written

    def flush_log_lines_once(self) -> int:
        """Write the buffered log lines in one batch; those of nodes removed meanwhile are dropped."""
        with self._lock:
            pending, self._pending_lines = self._pending_lines, []
        rows = [line.model_dump() | {"node_id": node_id} for node_id, line in pending]
        written = self._write_batch(rows, logs_store.write_records)
        events = [r for r in written if r["kind"] is not None]
        if self.forward is not None and events:
            self._forward([(r["node_id"], r["ts"], r) for r in events])
        return len(written)

    def _forward(self, events: list[tuple[int, float, dict[str, Any]]]) -> None:
        """Hand events to the forwarder with their node's name and GPU's UUID (events of nodes removed
        meanwhile are dropped)."""
        if self.forward is None:
            return
        with transaction(self.sessions, readonly=True) as session:
            ids = {node_id for node_id, _, _ in events}
            names = dict(session.execute(select(Node.id, Node.name).where(Node.id.in_(ids))).all())
            gpus = select(Gpu.node_id, Gpu.index, Gpu.uuid).where(Gpu.node_id.in_(ids))
            uuids: dict[tuple[int, int | None], str] = {(n, i): u for n, i, u in session.execute(gpus).all()}
        self.forward([event_json(names[n], ts, r, uuids.get((n, r.get("gpu")))) for n, ts, r in events if n in names])

    def _write_batch(
        self, rows: list[dict[str, Any]], write: Callable[[Session, list[dict[str, Any]]], None]
    ) -> list[dict[str, Any]]:
        """Write `rows` (each with a node_id) in one transaction; the rows of nodes removed while they waited
        here, and any row the database refuses, are dropped without the others (workers.batches)."""
        written = batches.write_isolating(self.sessions, rows, write, prune=_of_live_nodes, what="rows")
        self.refused_rows += len(written.refused)
        return written.stored

    def health_once(self, full: bool = False) -> list[HealthChange]:
        nodes = self.tracker.take_dirty()
        if full:
            nodes |= set(self.tracker.tracked())
        with self._lock:
            liveness, self._liveness = self._liveness, []
        if not nodes and not liveness:
            return []
        now = self.clock.now()
        transitions = self._refresh(nodes, now)
        decisions, crossed = self.judge.decide(nodes, now)
        transitions += crossed
        if not decisions and not liveness and not transitions:
            return []
        with transaction(self.sessions) as session:
            changes = self.judge.apply(session, self.clock, decisions)
            fired: list[Alert] = []
            for change in changes:
                fired += alerts.on_health_change(session, self.clock, change)
            for t in transitions:
                fired += self._threshold_alert(session, t)
            for live in liveness:
                fired += alerts.on_liveness_change(
                    session, self.clock, live.node_id, live.name, live.to_state, live.reason
                )
        self._report(changes)
        if fired:
            self.on_alerts(fired)
        return changes

    def _refresh(self, nodes: set[int], now: float) -> list[Transition]:
        """Re-read stale node facts, policies and rules (one read transaction, only when due)."""
        stale = self.judge.stale_facts(nodes, now)
        if not stale and not self.judge.config_stale(now):
            return []
        with transaction(self.sessions, readonly=True) as session:
            if stale:
                self.judge.refresh_facts(session, stale, now)
            if self.judge.config_stale(now):
                return self.judge.refresh_config(session, now)
        return []

    @staticmethod
    def _report(changes: list[HealthChange]) -> None:
        for change in changes:
            if change.drained:
                log.warning("node %s drained: %s", change.node, change.drained)
            elif change.resumed:
                log.info("node %s resumed: healthy again", change.node)
            if change.before != change.after:
                reasons = "; ".join(change.reasons)
                log.info("node %s health %s -> %s: %s", change.node, change.before, change.after, reasons)

    def _threshold_alert(self, session: Session, t: Transition) -> list[Alert]:
        facts = self.judge.facts.get(t.node_id)
        if facts is None:
            return []
        entity = None if t.gpu is not None or t.entity == "host" else t.entity
        if t.firing:
            alert = alerts.fire(
                session,
                self.clock,
                t.rule.name,
                t.node_id,
                facts.name,
                t.summary,
                t.gpu,
                severity=t.rule.severity,
                entity=entity,
            )
        else:
            alert = alerts.resolve(session, self.clock, t.rule.name, facts.name, t.gpu, entity)
        return [alert] if alert is not None else []

    def rollup_once(self) -> int:
        """One roll-up pass in this process (tests, small data; the loop aggregates in `rollup_process`)."""
        if not self.is_leader():
            return 0
        now = self.clock.now()
        with transaction(self.sessions, readonly=True) as session:
            rows = store.rollup_rows(session, now)
        return self.write_rollups(rows, store.fleet_rollup_rows(rows), now)

    def rollup_due(self, now: float) -> bool:
        with transaction(self.sessions, readonly=True) as session:
            return store.rollup_window(session, now) is not None

    def write_rollups(self, rows: list[dict[str, Any]], fleet: list[dict[str, Any]], now: float) -> int:
        """Write what the aggregation read (outside any lock), and prune: one short write."""
        with transaction(self.sessions) as session:
            store.write_rollups(session, rows)
            store.write_fleet_rollups(session, fleet)
            store.prune(session, now, self.retention)
            logs_store.prune(session, now - self.retention.logs_s)
        return len(rows)

    def mine_templates_once(self) -> int:
        """One template-mining pass (leader only); returns the lines mined."""
        if self.mining is None or not self.is_leader():
            return 0
        now = self.clock.now()
        fired: list[Alert] = []
        try:
            with transaction(self.sessions, readonly=True) as session:
                rows = self.mining.read(session)
            result = self.mining.mine(rows, now)
            if rows or result.touched:
                with transaction(self.sessions) as session:
                    self.mining.write(session, result)
                    fired = [a for b in result.bursts if (a := self._burst_alert(session, b)) is not None]
        except Exception:
            self.mining.forget()  # memory may be ahead of the database: reload next pass
            raise
        if result.new_templates:
            log.info("%d new log templates", result.new_templates)
        if result.events:
            self._forward([(e.node_id, e.ts, e.as_record()) for e in result.events])
        if fired:
            self.on_alerts(fired)
        return len(rows)

    def _burst_alert(self, session: Session, found: CategoryBurst) -> Alert | None:
        burst = found.burst
        node = session.get(Node, burst.top_node)
        name = node.name if node is not None else f"node {burst.top_node}"
        entity = f"template {found.category or '-'}/{burst.template_id}"
        if not burst.firing:
            return alerts.resolve(session, self.clock, "LogTemplateBurst", name, None, entity)
        window = self.mining.settings.window_s if self.mining else 60.0
        summary = (
            f"log template written {burst.count} times in {window:g} s (usually {burst.baseline:.1f}),"
            f" {burst.top_count} of them on {name}: {found.template}"
        )
        return alerts.fire(
            session,
            self.clock,
            "LogTemplateBurst",
            burst.top_node if node else None,
            name,
            summary[:512],
            severity="warning",
            entity=entity,
        )

    # -- the loops ----------------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="monitoring")
        # Roll-ups take seconds: their reads and writes on a thread of their own never hold up a health
        # pass or a flush, and their aggregation runs in a process of its own (see rollup_process).
        slow = ThreadPoolExecutor(max_workers=1, thread_name_prefix="monitoring-rollup")
        url = self.sessions.kw["bind"].url.render_as_string(hide_password=False)
        processes: ProcessPoolExecutor | None = None

        async def in_thread(call: Callable[[], T]) -> T:
            return await asyncio.get_running_loop().run_in_executor(executor, call)

        async def flush_step() -> None:
            await in_thread(self.flush_metrics_once)

        async def health_step() -> None:
            self._passes += 1
            full = self._passes % FULL_PASS_EVERY == 0
            await in_thread(lambda: self.health_once(full))

        async def rollup_step() -> None:
            nonlocal processes
            loop = asyncio.get_running_loop()
            now = self.clock.now()
            if not self.is_leader() or not await loop.run_in_executor(slow, self.rollup_due, now):
                return
            if processes is None:
                processes = rollup_process.start_pool()
            try:
                rows, fleet = await loop.run_in_executor(processes, rollup_process.aggregate, url, now)
            except BrokenProcessPool:  # the worker died (killed, out of memory): a new one next pass
                processes.shutdown(wait=False)
                processes = None
                raise
            await loop.run_in_executor(slow, self.write_rollups, rows, fleet, now)

        async def template_step() -> None:
            await asyncio.get_running_loop().run_in_executor(slow, self.mine_templates_once)

        try:
            await asyncio.gather(
                run_periodic("metrics-flush", self.metrics_flush_s, flush_step, stop),
                run_periodic("health", self.health_pass_s, health_step, stop),
                run_periodic("metrics-rollup", self.rollup_every_s, rollup_step, stop),
                run_periodic("log-templates", self.template_pass_s, template_step, stop),
            )
        finally:
            try:
                await in_thread(self.flush_metrics_once)
            except Exception:
                log.exception("final metrics flush failed")
            executor.shutdown(wait=False)
            slow.shutdown(wait=False)
            if processes is not None:
                processes.shutdown(wait=False, cancel_futures=True)
