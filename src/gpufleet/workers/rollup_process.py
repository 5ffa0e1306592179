"""The leader's roll-up aggregation, in a low-priority process of its own.

Aggregating a minute of samples decodes every node's JSON: seconds of pure-Python work at 1,000
nodes. On a thread of the head it held the GIL against the event loop that serves every agent
channel, and each of the loop's socket calls then waited for the GIL: measured at 999 simulated
nodes, the loop lagged 1-2 s at a time for ~10 s of every minute, which delayed fault answers and
drains by up to 14 s. In its own process it competes for CPU only, and at a lower priority (nice),
so the channels come first and the roll-up takes what is left; a minute leaves it plenty.

The process is started on the first roll-up that has work (a head with no samples never starts one)
and opens its own engine on the head's database URL.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from gpufleet.core.db import make_engine, make_session_factory, transaction
from gpufleet.monitoring import store

NICENESS = 10  # CFS weight ~10x lower than the head's: the event loop and the flushes come first

Rows = list[dict[str, Any]]
_sessions: dict[str, sessionmaker[Session]] = {}  # per database URL, in the worker process


def _worker_init(niceness: int) -> None:
    # Ctrl-C in a terminal reaches the whole process group; the head stops this worker itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(OSError):  # not allowed here: it still works, at the head's priority
        os.nice(niceness)


def aggregate(url: str, until: float) -> tuple[Rows, Rows]:
    """The node and fleet roll-up rows for every complete bucket before `until` (runs in the worker)."""
    sessions = _sessions.get(url)
    if sessions is None:
        sessions = _sessions[url] = make_session_factory(make_engine(url))
    with transaction(sessions, readonly=True) as session:
        rows = store.rollup_rows(session, until)
    return rows, store.fleet_rollup_rows(rows)


def start_pool() -> ProcessPoolExecutor:
    """One worker, spawned (never forked from a head that runs threads), at low priority."""
    return ProcessPoolExecutor(
        max_workers=1,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_worker_init,
        initargs=(NICENESS,),
    )
