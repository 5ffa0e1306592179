"""The one periodic-loop helper: each pass is isolated, so one failure is logged and the loop goes on."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)


async def run_periodic(
    name: str,
    interval_s: float,
    step: Callable[[], Awaitable[None]],
    stop: asyncio.Event,
    *,
    once: bool = False,
) -> None:
    """Call `step` every `interval_s` until `stop` is set (or once). Exceptions are logged, never propagated."""
    loop = asyncio.get_running_loop()
    next_at = loop.time()
    while not stop.is_set():
        try:
            await step()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("loop %s: pass failed; continuing", name)
        if once:
            return
        # Fixed-rate schedule: a slow pass shortens the next wait instead of drifting the period.
        next_at = max(next_at + interval_s, loop.time())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=next_at - loop.time())
