"""The one periodic-loop helper: each pass is isolated, so one failure is logged and the loop goes on."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)
# A pass run because it was woken, not because its period came, may use at most this share of a core
# (`run_periodic`): under a burst of wakes a slow pass waits longer before the next.
WAKE_SHARE = 0.05


async def run_periodic(
    name: str,
    interval_s: float,
    step: Callable[[], Awaitable[None]],
    stop: asyncio.Event,
    *,
    once: bool = False,
    wake: asyncio.Event | None = None,
    wake_gap_s: float = 0.0,
) -> None:
    """Call `step` every `interval_s` until `stop` is set (or once), and at once whenever `wake` is set,
    but no sooner than `wake_gap_s` after the last pass ended, nor sooner than the pass took times
    (1 / WAKE_SHARE - 1): a burst of wakes (a thousand submissions in a second) then costs a pass per gap,
    not a pass per wake, and passes that grow with the work (a scheduler over ten thousand queued jobs) take
    at most WAKE_SHARE of a core between the periodic ones. Exceptions are logged, never propagated."""
    loop = asyncio.get_running_loop()
    next_at = loop.time()
    while not stop.is_set():
        started = loop.time()
        try:
            await step()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("loop %s: pass failed; continuing", name)
        if once:
            return
        ended = loop.time()
        # Fixed-rate schedule: a slow pass shortens the next wait instead of drifting the period.
        next_at = max(next_at + interval_s, loop.time())
        with contextlib.suppress(TimeoutError):
            if wake is None:
                await asyncio.wait_for(stop.wait(), timeout=next_at - loop.time())
            elif await _either(stop, wake, next_at - loop.time()):
                # Woken: this pass is an extra one, so the next periodic pass is a whole period after it.
                # (Counting it as the scheduled one would push every later pass a period further out.)
                if wake_gap_s > 0:
                    gap = max(wake_gap_s, (ended - started) * (1 / WAKE_SHARE - 1))
                    await _stopped_within(stop, ended + gap - loop.time())
                wake.clear()
                next_at = loop.time()


async def _stopped_within(stop: asyncio.Event, within_s: float) -> None:
    """Wait `within_s`, or less if `stop` is set meanwhile."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=max(0.0, within_s))


async def _either(stop: asyncio.Event, wake: asyncio.Event, within_s: float) -> bool:
    """Wait until `stop` or `wake` is set, or `within_s` passes; returns whether `wake` is set."""
    waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(wake.wait())]
    try:
        await asyncio.wait(waiters, timeout=within_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
    return wake.is_set()
