"""Hand new and resolved alerts to every configured receiver, off the path that raised them.

The monitoring thread submits notices; an asyncio task on the head's event loop sends them, one
batch per receiver, with the retries of `notifiers.deliver`. A slow or dead receiver delays only
its own notices: batches go out concurrently and each delivery is bounded by its retries.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.core.db import transaction
from gpufleet.core.errors import GpufleetError
from gpufleet.monitoring import notifiers
from gpufleet.monitoring.models import Alert, Receiver
from gpufleet.monitoring.notifiers import AlertNotice, DeliveryResult

log = logging.getLogger(__name__)
QUEUE_LIMIT = 10_000


def notice_for(alert: Alert, external_url: str | None) -> AlertNotice:
    """What receivers get for an alert row (call inside the transaction that loaded or changed it)."""
    labels = {str(k): str(v) for k, v in alert.labels.items()}
    return AlertNotice(
        fingerprint=alert.fingerprint,
        alertname=alert.rule,
        status="firing" if alert.status == "firing" else "resolved",
        severity=alert.severity,
        labels=labels,
        annotations={"summary": alert.summary},
        starts_at=alert.starts_at,
        ends_at=alert.ends_at,
        generator_url=f"{external_url.rstrip('/')}/api/v1/alerts/{alert.id}" if external_url else "",
    )


class Notifications:
    def __init__(self, sessions: sessionmaker[Session], external_url: str | None) -> None:
        self.sessions = sessions
        self.external_url = external_url
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue[list[AlertNotice]] | None = None
        self._worker: asyncio.Task[None] | None = None
        self.results: list[DeliveryResult] = []  # the latest outcomes, for tests and `alert receivers`

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queue = asyncio.Queue(QUEUE_LIMIT)
        self._worker = loop.create_task(self._run(self._queue))

    def submit(self, alerts: list[Alert]) -> None:
        """From any thread, inside the transaction that changed `alerts`. Silenced alerts are not sent."""
        notices = []
        for alert in alerts:
            if alert.silenced:
                continue
            try:
                notices.append(notice_for(alert, self.external_url))
            except ValueError as exc:  # a row no receiver could be told about: say so, send the rest
                log.error("alert %s cannot be sent: %s", alert.id, exc)
        if notices and self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._enqueue, notices)

    def _enqueue(self, notices: list[AlertNotice]) -> None:
        if self._queue is None:
            return
        try:
            self._queue.put_nowait(notices)
        except asyncio.QueueFull:
            log.error("notification queue full: %d notices dropped", len(notices))

    def _receivers(self) -> list[notifiers.WebhookReceiver | notifiers.SlackReceiver | notifiers.EmailReceiver]:
        with transaction(self.sessions, readonly=True) as session:
            specs = list(session.scalars(select(Receiver.spec).order_by(Receiver.id)))
        out = []
        for spec in specs:
            try:
                out.append(notifiers.parse_receiver(spec))
            except GpufleetError as exc:
                log.error("skipping an unreadable receiver: %s", exc)
        return out

    async def _run(self, queue: asyncio.Queue[list[AlertNotice]]) -> None:
        pending: set[asyncio.Task[DeliveryResult]] = set()
        while True:
            notices = await queue.get()
            for spec in await asyncio.to_thread(self._receivers):
                notifier = notifiers.notifier_for(spec, external_url=self.external_url or "")
                task = asyncio.create_task(notifiers.deliver(notifier, notices))
                pending.add(task)
                task.add_done_callback(self._done(pending))

    def _done(self, pending: set[asyncio.Task[DeliveryResult]]) -> Callable[[asyncio.Task[DeliveryResult]], None]:
        def done(task: asyncio.Task[DeliveryResult]) -> None:
            pending.discard(task)
            if not task.cancelled() and task.exception() is None:
                self.results = [*self.results[-99:], task.result()]

        return done

    async def close(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
