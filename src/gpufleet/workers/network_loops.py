"""The leader's switch polling: every `switch_poll_interval_s`, poll every registered switch over SNMP, a few
at a time, and record each (network.service.record_poll).

SNMP runs outside any transaction (a switch that does not answer costs its timeout and retries, nothing
else); each switch's poll is then written in its own short transaction, so one bad switch never costs the
others their poll. Rates need the previous reading of the same switch: it is kept here, in memory, by
switch id; a new leader's first poll of each switch therefore has no rates, never wrong ones.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.core.clock import Clock
from gpufleet.core.credentials import CredentialBox
from gpufleet.core.db import transaction
from gpufleet.core.errors import GpufleetError
from gpufleet.core.loops import run_periodic
from gpufleet.monitoring.models import Alert
from gpufleet.network import counters, service
from gpufleet.network.models import Switch
from gpufleet.network.snmp import SnmpTarget, SwitchReading, poll

log = logging.getLogger(__name__)
Poller = Callable[[SnmpTarget], SwitchReading]


@dataclass
class NetworkLoops:
    sessions: sessionmaker[Session]
    clock: Clock
    box: Callable[[], CredentialBox]  # opened when a switch is polled: a head without switches needs no key
    interval_s: float
    is_leader: Callable[[], bool]
    timeout_s: float = 2.0
    retries: int = 1
    concurrency: int = 8
    thresholds: service.Thresholds = field(default_factory=service.Thresholds)
    on_alerts: Callable[[list[Alert]], None] = lambda _alerts: None
    poller: Poller = poll
    # switch id -> (its previous reading, the monotonic time it was taken)
    previous: dict[int, tuple[SwitchReading, float]] = field(default_factory=dict)

    def poll_once(self) -> int:
        """Poll every switch once and record each. Returns how many answered."""
        targets: list[tuple[int, SnmpTarget | None, str | None]] = []
        with transaction(self.sessions, readonly=True) as session:
            for switch in session.scalars(select(Switch).order_by(Switch.id)):
                try:
                    targets.append((switch.id, service.target(switch, self.box(), self.timeout_s, self.retries), None))
                except GpufleetError as exc:  # its secrets cannot be opened with this head's key file
                    targets.append((switch.id, None, str(exc)))
        for gone in set(self.previous) - {t[0] for t in targets}:
            del self.previous[gone]
        if not targets:
            return 0
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(targets)), thread_name_prefix="snmp") as pool:
            polls = list(pool.map(lambda t: (t[0], self._poll(t[1], t[2], t[0])), targets))
        answered = 0
        for switch_id, result in polls:
            answered += result.reading is not None
            with transaction(self.sessions) as session:
                changed = service.record_poll(session, self.clock, switch_id, result, self.thresholds)
                if changed:
                    self.on_alerts(changed)  # inside the transaction, as Notifications.submit wants
        return answered

    def _poll(self, target: SnmpTarget | None, problem: str | None, switch_id: int) -> service.Poll:
        if target is None:
            return service.Poll(None, problem)
        try:
            reading = self.poller(target)
        except GpufleetError as exc:
            log.info("switch %s:%s: %s", target.host, target.port, exc)
            return service.Poll(None, str(exc))
        now = time.monotonic()
        before = self.previous.get(switch_id)
        self.previous[switch_id] = (reading, now)
        if before is None:
            return service.Poll(reading)
        rates = counters.port_rates(before[0], before[1], reading, now)
        return service.Poll(reading, rates=rates)

    async def run(self, stop: asyncio.Event) -> None:
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="switches")

        def step_in_thread() -> None:
            if self.is_leader():
                self.poll_once()
            else:
                self.previous.clear()  # a later leadership starts from fresh readings

        async def step() -> None:
            await asyncio.get_running_loop().run_in_executor(executor, step_in_thread)

        try:
            await run_periodic("switches", self.interval_s, step, stop)
        finally:
            executor.shutdown(wait=False)
