"""The job loops on the head: schedule (or sync with Slurm), dispatch, store output, attribute.

- the leader schedules every `scheduler_interval_s`, and at once after a submit or a rank's end
  (`wake`): `jobs.tick.run_tick`; under `workload_manager = "slurm"` it runs the pass with Slurm
  instead (`jobs.slurm.sync`: submit, read jobs and nodes back, cancel) every `slurm_poll_interval_s`
  and at once after a submit or a cancel;
- every replica sends the starts and cancels due for the nodes whose channels it holds
  (`jobs.dispatch.outgoing`), every half second and at once after a scheduling pass;
- agents' output is buffered from the channels and written in batches;
- the leader attributes GPU samples to running jobs every ten seconds (`monitoring.attribution`);
- the leader health-checks every inference service replica and reconciles the services
  (`jobs.inference`: replace the dead and the failing, scale, roll to a new revision) every
  `service_check_interval_s`.

Database work runs on a thread of its own, apart from the heartbeat and monitoring loops.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.auth import audit
from gpufleet.core.clock import Clock
from gpufleet.core.config import Settings
from gpufleet.core.db import transaction
from gpufleet.core.errors import Unavailable
from gpufleet.core.loops import run_periodic
from gpufleet.inventory.models import Node
from gpufleet.jobs import artifacts, dispatch, inference, lifecycle, output, submission
from gpufleet.jobs.scheduler import Policy
from gpufleet.jobs.slurm.sync import SlurmSync, SyncResult
from gpufleet.jobs.tick import TickResult, TickSettings, run_tick
from gpufleet.monitoring import attribution
from gpufleet.monitoring.models import Alert
from gpufleet.monitoring.stragglers import StragglerWatch
from gpufleet.protocol.artifacts import NodeCache
from gpufleet.protocol.jobs import JobHeld, JobOutput, JobUpdate, RankRef
from gpufleet.protocol.mig import MigResult
from gpufleet.sharing import reconcile
from gpufleet.workers import batches

log = logging.getLogger(__name__)
T = TypeVar("T")
DISPATCH_S = 0.5
# A pass reads the whole queue; woken by every submission of a burst it would run back to back and take the
# CPU the submissions need. Woken, it waits until this long after the last pass: a job still starts within
# a fraction of a second, and a thousand submissions cost a few passes.
SCHEDULE_WAKE_GAP_S = 0.25
OUTPUT_FLUSH_S = 0.5
PROBE_TIMEOUT_S = 2.0  # a replica's health check; longer counts as a failure
MAX_BUFFERED_CHUNKS = 10_000  # beyond it the oldest chunks are dropped (the node's spool keeps them)


async def _probe(http: httpx.AsyncClient, url: str) -> bool:
    """Whether a replica's health endpoint answers 2xx."""
    try:
        response = await http.get(url)
    except httpx.HTTPError:
        return False
    return response.is_success


def tick_settings(settings: Settings) -> TickSettings:
    return TickSettings(
        policy=Policy(
            placement=dict(settings.scheduler_placement_by_category),  # type: ignore[arg-type]
            default=settings.scheduler_placement,  # type: ignore[arg-type]
            backfill=settings.scheduler_backfill,
        ),
        half_life_s=settings.fair_share_half_life_s,
        max_requeues=settings.job_max_requeues,
    )


def _audit_foreign_output(session: Session, clock: Clock, refused: list[tuple[int, JobOutput, str]]) -> None:
    """One audit record per node that sent output for ranks other nodes hold (dropped by `output.store`):
    the same refusal as a report on another node's rank, which closes the channel (api.routers.agent).
    Only the first few ranks are named: the record's target is short, and one is proof enough."""
    if not refused:
        return
    by_node: dict[int, list[str]] = {}
    for node_id, chunk, owner in refused:
        by_node.setdefault(node_id, []).append(f"job {chunk.job_id} run {chunk.run} rank {chunk.rank} of node {owner}")
    names: dict[int, str] = dict(session.execute(select(Node.id, Node.name).where(Node.id.in_(by_node))).all())
    for node_id, ranks in by_node.items():
        distinct = list(dict.fromkeys(ranks))
        named = ", ".join(distinct[:5]) + (f" and {len(distinct) - 5} more" if len(distinct) > 5 else "")
        audit.record(
            session,
            clock,
            actor=f"node:{names.get(node_id, node_id)}",
            action="agent.channel.job_output",
            target=f"{len(ranks)} output chunk(s) for {named}",
            source="agent channel",
            result=403,
        )
        log.warning("node %s sent output for another node's rank: %s; dropped", names.get(node_id, node_id), named)


@dataclass
class JobLoops:
    settings: Settings
    sessions: sessionmaker[Session]
    clock: Clock
    is_leader: Callable[[], bool]
    nodes_here: Callable[[], list[int]] = lambda: []  # node ids whose channels this replica holds
    send: Callable[[int, str], None] = lambda _node_id, _text: None  # from any thread
    _output: list[tuple[int, JobOutput]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _loop: asyncio.AbstractEventLoop | None = None
    _schedule_now: asyncio.Event | None = None
    _dispatch_now: asyncio.Event | None = None
    _last_attribution: float | None = None
    dropped_chunks: int = 0
    # Under workload_manager = "slurm": the pass that takes the scheduler's place (jobs.slurm.sync).
    slurm: SlurmSync | None = None
    _slurm_problem: str | None = None
    on_alerts: Callable[[list[Alert]], None] = lambda _alerts: None  # straggler alerts, for notification
    _stragglers: StragglerWatch = field(default_factory=StragglerWatch)

    def wake(self) -> None:
        """Schedule (and dispatch) now rather than at the next interval. Callable from any thread."""
        loop, schedule_now, dispatch_now = self._loop, self._schedule_now, self._dispatch_now
        if loop is None or schedule_now is None or dispatch_now is None or loop.is_closed():
            return
        loop.call_soon_threadsafe(schedule_now.set)
        loop.call_soon_threadsafe(dispatch_now.set)

    # -- called from the agent channels -------------------------------------------------------------
    def record_update(self, node_id: int, update: JobUpdate) -> bool:
        """In a worker thread: durable before the channel acknowledges it. A rank's end first writes the output
        buffered before it (its agent sends the end after its output): a reader told the job is done must find
        all of it."""
        if update.state == "exited":
            self.flush_output_once()
        with transaction(self.sessions) as session:
            recorded = lifecycle.rank_update(session, self.clock, node_id, update, self.settings.job_max_requeues)
        if update.state == "exited":
            self.wake()
        return recorded

    def record_held(self, node_id: int, held: JobHeld) -> list[RankRef]:
        """Returns the ranks the agent holds that must stop at once (the head has no live record of them)."""
        with transaction(self.sessions) as session:
            strays = lifecycle.ranks_held(session, self.clock, node_id, held.ranks, self.settings.job_max_requeues)
        self.wake()
        return strays

    def record_cache(self, node_id: int, report: NodeCache) -> None:
        """In a worker thread: what the node's artifact cache holds, for data locality and its page."""
        with transaction(self.sessions) as session:
            artifacts.record_cache(session, node_id, report)

    def record_mig(self, node_id: int, result: MigResult) -> None:
        """In a worker thread: what the node's agent could not apply of the MIG layouts it was sent."""
        with transaction(self.sessions) as session:
            reconcile.record_result(session, self.clock, node_id, result)

    def output(self, node_id: int, chunk: JobOutput) -> None:
        """On the event loop: buffered, written by the flush loop."""
        with self._lock:
            self._output.append((node_id, chunk))
            excess = len(self._output) - MAX_BUFFERED_CHUNKS
            if excess > 0:
                del self._output[:excess]
                self.dropped_chunks += excess

    # -- one pass of each loop (what the tests call) ------------------------------------------------
    def schedule_once(self) -> TickResult | None:
        if not self.is_leader():
            return None
        if self.slurm is not None:
            self.slurm_once()
            return None
        result = run_tick(self.sessions, self.clock, tick_settings(self.settings))
        for job_id in result.ended:
            log.info("job %s ended by the scheduler (node failure or time limit)", job_id)
        if result.placed:
            log.info("placed job(s) %s", ", ".join(map(str, result.placed)))
        return result

    def slurm_once(self) -> SyncResult | None:
        """One pass with Slurm (the leader's); Slurm being away is logged once, not every pass."""
        if self.slurm is None or not self.is_leader():
            return None
        result = self.slurm.once()
        if result.problem != self._slurm_problem:
            if result.problem:
                log.warning("Slurm cannot be reached; jobs wait: %s", result.problem)
            else:
                log.info("Slurm answers again")
            self._slurm_problem = result.problem
        return result

    def dispatch_once(self, nodes: list[int] | None = None) -> int:
        """`nodes`: read on the event loop, which owns the channel table; None reads it here (tests)."""
        nodes = self.nodes_here() if nodes is None else nodes
        if not nodes:
            return 0
        with transaction(self.sessions) as session:
            messages: list[tuple[int, BaseModel]] = [*dispatch.outgoing(session, self.clock, nodes)]
            # MIG layouts for idle GPUs (under Slurm, for the nodes Slurm has drained)
            slurm = self.settings.workload_manager == "slurm"
            messages += reconcile.outgoing(session, self.clock, nodes, slurm=slurm)
        for node_id, message in messages:
            self.send(node_id, message.model_dump_json())
        return len(messages)

    def flush_output_once(self) -> int:
        with self._lock:
            pending, self._output = self._output, []
        if not pending:
            return 0
        stored = 0

        def store(session: Session, chunks: list[tuple[int, JobOutput]]) -> None:
            nonlocal stored
            _audit_foreign_output(session, self.clock, output.foreign(session, chunks))
            stored += output.store(session, self.clock, chunks, self.settings.job_output_max_chars)

        try:  # a chunk the database refuses is dropped alone, not with every other job's (workers.batches)
            batches.write_isolating(self.sessions, pending, store, what="output chunks")
        except Unavailable:
            with self._lock:  # the database is away: keep the chunks for the next flush
                self._output[:0] = pending
            raise
        return stored

    def attribute_once(self) -> int:
        now = self.clock.now()
        last, self._last_attribution = self._last_attribution, now
        if not self.is_leader() or last is None:
            return 0
        # A long gap (a new leader, a stalled loop) is not charged as if sampled throughout.
        elapsed = min(now - last, 3 * attribution.ATTRIBUTION_INTERVAL_S)
        with transaction(self.sessions) as session:
            held = list(attribution.held_gpus(session, now, self.settings.metrics_interval_s))
            counted = attribution.attribute(session, now, elapsed, self.settings.metrics_interval_s, held)
            # The same GPUs, each compared with its peers in the job (monitoring.stragglers).
            changed = self._stragglers.check(session, self.clock, held)
        if changed:
            self.on_alerts(changed)
        return counted

    def reconcile_services_once(self, results: dict[int, bool]) -> bool:
        """Record the health checks' `results` (replica id -> healthy), then reconcile every service."""
        if not self.is_leader():
            return False
        limits = submission.Limits(self.settings.job_default_time_limit_s, self.settings.job_max_time_limit_s)
        with transaction(self.sessions) as session:
            inference.record_probes(session, self.clock, results)
            changed = inference.reconcile(session, self.clock, limits)
        if changed:
            self.wake()
        return changed

    def service_probes(self) -> list[inference.Probe]:
        if not self.is_leader() or self.slurm is not None:
            return []
        with transaction(self.sessions, readonly=True) as session:
            return inference.probes(session)

    async def check_services(self, in_thread: Callable[[Callable[[], Any]], Awaitable[Any]]) -> None:
        """One round: every running replica's health endpoint at once (each within PROBE_TIMEOUT_S), then
        the reconciler with the answers."""
        if not self.is_leader() or self.slurm is not None:
            return
        targets = await in_thread(self.service_probes)
        answers: list[bool] = []
        if targets:  # a client builds an SSL context (milliseconds of CPU): not on every idle pass
            async with httpx.AsyncClient(timeout=PROBE_TIMEOUT_S) as http:
                answers = list(await asyncio.gather(*(_probe(http, t.url) for t in targets)))
        results = {t.replica_id: ok for t, ok in zip(targets, answers, strict=True)}
        await in_thread(lambda: self.reconcile_services_once(results))

    def _schedule_interval_s(self) -> float:
        return self.settings.slurm_poll_interval_s if self.slurm is not None else self.settings.scheduler_interval_s

    # -- the loops ----------------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        self._loop = asyncio.get_running_loop()
        self._schedule_now = asyncio.Event()
        self._dispatch_now = asyncio.Event()
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="jobs")

        async def in_thread(call: Callable[[], T]) -> T:
            return await asyncio.get_running_loop().run_in_executor(executor, call)

        async def schedule_step() -> None:
            result = await in_thread(self.schedule_once)
            if result is not None and (result.placed or result.ended) and self._dispatch_now is not None:
                self._dispatch_now.set()

        async def dispatch_step() -> None:
            nodes = self.nodes_here()
            await in_thread(lambda: self.dispatch_once(nodes))

        async def flush_step() -> None:
            await in_thread(self.flush_output_once)

        async def attribute_step() -> None:
            await in_thread(self.attribute_once)

        async def services_step() -> None:
            await self.check_services(in_thread)

        try:
            await asyncio.gather(
                run_periodic(
                    "scheduler",
                    self._schedule_interval_s(),
                    schedule_step,
                    stop,
                    wake=self._schedule_now,
                    wake_gap_s=SCHEDULE_WAKE_GAP_S,
                ),
                run_periodic("job-dispatch", DISPATCH_S, dispatch_step, stop, wake=self._dispatch_now),
                run_periodic("job-output", OUTPUT_FLUSH_S, flush_step, stop),
                run_periodic("job-attribution", attribution.ATTRIBUTION_INTERVAL_S, attribute_step, stop),
                run_periodic("services", self.settings.service_check_interval_s, services_step, stop),
            )
        finally:
            try:
                await in_thread(self.flush_output_once)
            except Exception:
                log.exception("final job output flush failed")
            executor.shutdown(wait=False)
