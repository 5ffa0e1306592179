"""Garbage-collector settings for long-running processes that hold many connections.

A head node with 1,000 agent channels (and a simulator with 1,000 agents) holds some 200,000
long-lived objects; with CPython's default thresholds a full collection then runs every ~15 s and
stops the event loop for 0.2-0.4 s on two cores, long enough to push heartbeats late by that much
(measured with bench/liveness.py; see docs/benchmarks.md). Freezing what exists after start-up
takes it out of every later collection, and a higher young-generation threshold lets objects that
live for about one heartbeat die young instead of being promoted into the old generation.
"""

from __future__ import annotations

import gc

THRESHOLD = (50_000, 20, 10)


def tune_for_long_running() -> None:
    """Collect once, freeze the survivors, and raise the young-generation threshold."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLD)
