"""The head node's background loops and the leadership that gates the singleton ones.

Every replica flushes the heartbeat receipts it holds; only the lease holder sweeps for silent
nodes. Database work runs in threads so the event loop keeps serving agent channels.

A head process has a role. `ALL` does everything (the embedded head, and each of `workers` replicas):
one lease picks the process that sweeps and runs the other singleton loops. With `agent_listen` the
work splits: a `CHANNELS` process serves the agents and sweeps under a lease of its own, and `API`
processes serve people and scripts and run the other singleton loops (scheduler, roll-ups, CVE
evaluation) under the leader lease, so a saturated API never delays a heartbeat's receipt.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TypeVar

from sqlalchemy.orm import Session, sessionmaker

from gpufleet.core.clock import Clock
from gpufleet.core.config import Settings
from gpufleet.core.db import transaction
from gpufleet.core.leases import release, try_acquire
from gpufleet.core.loops import run_periodic
from gpufleet.inventory.liveness import (
    Change,
    Deadlines,
    HeartbeatBook,
    Receipt,
    UpNode,
    flush,
    load_up_nodes,
    mark_down,
    overdue,
)

log = logging.getLogger(__name__)
LEADER_LEASE = "head-leader"
LIVENESS_LEASE = "head-liveness"  # the sweep's own lease, where a channel process holds it (role CHANNELS)
# How stale the leader's view of `up` nodes may be: it bounds how late a node that another replica just
# brought up starts being judged, and overdue nodes are re-read from the database before any change.
VIEW_REFRESH_S = 1.0

OnDurable = Callable[[dict[int, Receipt]], None]
T = TypeVar("T")


class Role(StrEnum):
    ALL = "all"
    CHANNELS = "channels"  # agents' channels, heartbeat flush, the sweep, health verdicts; no singleton loops
    API = "api"  # API calls and pages, the singleton loops; no channels, no sweep

    @property
    def lease(self) -> str:
        return LIVENESS_LEASE if self is Role.CHANNELS else LEADER_LEASE

    @property
    def sweeps(self) -> bool:
        return self is not Role.API

    @property
    def runs_singletons(self) -> bool:
        """Whether this process may run the scheduler, roll-ups and the other leader-only loops."""
        return self is not Role.CHANNELS


def replica_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass
class HeadLoops:
    settings: Settings
    sessions: sessionmaker[Session]
    clock: Clock
    book: HeartbeatBook = field(default_factory=HeartbeatBook)
    holder: str = field(default_factory=replica_id)
    role: Role = Role.ALL
    on_durable: OnDurable = lambda _receipts: None
    on_changes: Callable[[list[Change]], None] = lambda _changes: None  # state changes, for alerts
    leader_since: float | None = None
    lease_valid_until: float = 0.0
    view: dict[int, UpNode] | None = None
    view_loaded_at: float = 0.0

    @property
    def is_leader(self) -> bool:
        """Whether this process holds its role's lease (a CHANNELS process: the sweep's)."""
        return self.leader_since is not None

    @property
    def leads(self) -> bool:
        """Whether this process runs the singleton loops: it holds the leader lease."""
        return self.is_leader and self.role.runs_singletons

    # -- one pass of each loop (also what tests call) ---------------------------------------------
    def flush_once(self) -> list[Change]:
        receipts = self.book.take_pending()
        if not receipts:
            return []
        try:
            with transaction(self.sessions) as session:
                changes = flush(session, self.clock, receipts)
        except Exception:
            self.book.restore(receipts)
            raise
        self.on_durable(receipts)
        return changes

    def lead_once(self) -> bool:
        attempt_at = self.clock.now()
        try:
            with transaction(self.sessions) as session:
                held = try_acquire(session, self.role.lease, self.holder, attempt_at, self.settings.lease_ttl_s)
        except Exception:
            held = False  # cannot renew: behave as a follower until the database answers again
            self._set_leader(held)
            raise
        if held:
            # The lease is ours until this attempt's start plus the TTL; sweep only inside that.
            self.lease_valid_until = attempt_at + self.settings.lease_ttl_s
        self._set_leader(held)
        return held

    def _set_leader(self, held: bool) -> None:
        if held and self.leader_since is None:
            self.leader_since = self.clock.now()
            log.info("this replica (%s) is now the leader", self.holder)
        elif not held and self.leader_since is not None:
            self.leader_since = None
            log.warning("this replica (%s) lost the leadership lease", self.holder)

    def sweep_once(self) -> list[Change]:
        now = self.clock.now()
        if not self.role.sweeps or self.leader_since is None or now >= self.lease_valid_until:
            self.view = None
            return []
        rules = Deadlines(
            down_after_intervals=self.settings.down_after_intervals,
            default_interval_s=self.settings.heartbeat_interval_s,
            leader_since=self.leader_since,
            grace_s=self.settings.leader_grace_s,
        )
        if self.view is None or now - self.view_loaded_at >= VIEW_REFRESH_S:
            with transaction(self.sessions, readonly=True) as session:
                self.view = load_up_nodes(session)
            self.view_loaded_at = now
        candidates = overdue(self.view, self.book, now, rules)
        if not candidates:
            return []
        with transaction(self.sessions) as session:
            return mark_down(session, self.clock, self.book, candidates, rules, self.view)

    def resign(self) -> None:
        if self.leader_since is None:
            return
        with transaction(self.sessions) as session:
            release(session, self.role.lease, self.holder)
        self.leader_since = None

    # -- the loops --------------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        """Run until `stop` is set; then make pending receipts durable and give up the lease.

        The loops' database work runs on their own thread, not asyncio's shared default executor:
        a thousand agents joining at once queue their requests there, and a flush or sweep stuck
        behind them would make live nodes look silent.
        """
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="head-loops")
        # The lease is renewed on a thread of its own: behind a long flush or sweep (a thousand nodes'
        # receipts, a slow database) a healthy leader's renewal came late, 4 s into a 5 s lease, and the
        # lease could lapse and pass to another process for nothing.
        lease_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="head-lease")

        async def in_loop_thread(call: Callable[[], T]) -> T:
            return await asyncio.get_running_loop().run_in_executor(executor, call)

        def report(changes: list[Change]) -> None:
            for change in changes:
                log.info("node %s is %s: %s", change.name, change.to_state, change.reason)
            if changes:
                self.on_changes(changes)

        async def flush_step() -> None:
            report(await in_loop_thread(self.flush_once))

        async def lead_step() -> None:
            await asyncio.get_running_loop().run_in_executor(lease_executor, self.lead_once)

        async def sweep_step() -> None:
            report(await in_loop_thread(self.sweep_once))

        # Renew at a third of the TTL, so two missed renewals still keep the lease.
        lease_period = self.settings.lease_ttl_s / 3
        try:
            await asyncio.gather(
                run_periodic("heartbeat-flush", self.settings.flush_interval_s, flush_step, stop),
                run_periodic("leadership", lease_period, lead_step, stop),
                run_periodic("liveness-sweep", self.settings.sweep_interval_s, sweep_step, stop),
            )
        finally:
            await in_loop_thread(lambda: lease_executor.shutdown(wait=True))  # no renewal after resigning
            await in_loop_thread(self._shutdown)
            executor.shutdown(wait=False)

    def _shutdown(self) -> None:
        try:
            self.flush_once()
        except Exception:
            log.exception("final heartbeat flush failed")
        try:
            self.resign()
        except Exception:
            log.exception("could not release the leadership lease")
