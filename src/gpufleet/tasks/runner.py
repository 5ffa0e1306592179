"""Runs tasks on threads of the head that accepted them, recording each target's result as it lands.

Every state change is its own short transaction, so a follower sees progress while the work goes on,
and a long action (a 1 GB rsync, a node that takes 11 s to power on) never holds a database lock.
The runner beats for its tasks every few seconds; a head that starts up marks the unfinished tasks
of a head that stopped beating as interrupted (`service.interrupt_stale`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from gpufleet.core.clock import Clock
from gpufleet.core.db import transaction
from gpufleet.core.errors import GpufleetError
from gpufleet.tasks import service
from gpufleet.tasks.service import FAILED, OK, SKIPPED

log = logging.getLogger(__name__)
HEARTBEAT_S = 5.0
STALE_AFTER_S = 60.0  # a dozen missed heartbeats: the head running the task is gone
JANITOR_S = 30.0  # how often a head looks for tasks whose head stopped beating


@dataclass(frozen=True)
class TargetResult:
    ok: bool
    detail: str = ""
    data: dict[str, Any] | None = None


@dataclass
class TaskContext:
    """What a task's work gets: its parameters and the way to report each target."""

    task_id: int
    params: dict[str, Any]
    _sessions: sessionmaker[Session]
    _clock: Clock
    _sleep: Callable[[float], None] = field(default=time.sleep)

    def running(self, target: str) -> None:
        with transaction(self._sessions) as session:
            service.target_running(session, self._clock, self.task_id, target)

    def acting(self, target: str) -> None:
        """`running`, once the task is known to be still this head's: raises Superseded when another head
        has given it up as lost (`service.supersede`). Called before each target's action."""
        with transaction(self._sessions) as session:
            service.still_ours(session, self.task_id, target)
            service.target_running(session, self._clock, self.task_id, target)

    def finished(self, target: str, ok: bool, detail: str = "", data: dict[str, Any] | None = None) -> None:
        self._finish(target, OK if ok else FAILED, detail, data)

    def skipped(self, target: str, detail: str) -> None:
        self._finish(target, SKIPPED, detail, None)

    def _finish(self, target: str, state: str, detail: str, data: dict[str, Any] | None) -> None:
        with transaction(self._sessions) as session:
            service.target_finished(session, self._clock, self.task_id, target, state=state, detail=detail, data=data)

    def fan_out(
        self,
        targets: Sequence[str],
        fn: Callable[[str], TargetResult],
        *,
        limit: int,
        stagger_s: float = 0.0,
    ) -> None:
        """Run `fn` for every target, at most `limit` at once, starts at least `stagger_s` apart (power-on
        inrush). An exception in `fn` fails that target with its message; the others go on. A task given
        up as lost meanwhile acts on no further target."""
        if not targets:
            return
        gate = threading.Lock()
        next_start = [0.0]

        def one(target: str) -> None:
            try:
                self.acting(target)
                if stagger_s > 0:
                    # Starts are spaced even when many workers are free at once. `fn` follows the gate
                    # directly (the database write above comes first) so its calls, the power-ons
                    # themselves, are the ones spaced, however slow that write is.
                    with gate:
                        wait = next_start[0] - time.monotonic()
                        if wait > 0:
                            self._sleep(wait)
                        next_start[0] = time.monotonic() + stagger_s
                result = fn(target)
            except GpufleetError as exc:
                result = TargetResult(False, str(exc))
            except Exception as exc:  # one target's failure never stops the others
                log.warning("task %s: %s failed: %s", self.task_id, target, exc, exc_info=True)
                result = TargetResult(False, f"{type(exc).__name__}: {exc}")
            self.finished(target, result.ok, result.detail, result.data)

        with ThreadPoolExecutor(max_workers=max(1, min(limit, len(targets))), thread_name_prefix="task") as pool:
            for future in [pool.submit(one, t) for t in targets]:
                future.result()


Work = Callable[[TaskContext], "str | None"]


class TaskRunner:
    """The head's task threads. `start` returns at once; the work runs on a thread of its own."""

    def __init__(self, sessions: sessionmaker[Session], clock: Clock) -> None:
        self._sessions = sessions
        self._clock = clock
        self._threads: dict[int, threading.Thread] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._beater: threading.Thread | None = None
        self._janitor: threading.Thread | None = None

    def start(self, task_id: int, work: Work, params: dict[str, Any] | None = None) -> None:
        """Run `work` for a task the caller created and committed."""
        ctx = TaskContext(task_id, params or {}, self._sessions, self._clock)
        thread = threading.Thread(target=self._run, args=(ctx, work), name=f"task-{task_id}", daemon=True)
        with self._lock:
            self._threads[task_id] = thread
            self._ensure_beater()
        try:
            thread.start()
        except RuntimeError:  # no thread to be had (a process at its limit): the caller fails the task
            with self._lock:
                self._threads.pop(task_id, None)
            raise

    def _run(self, ctx: TaskContext, work: Work) -> None:
        error: str | None = None
        summary: str | None = None
        try:
            with transaction(self._sessions) as session:
                service.mark_running(session, self._clock, ctx.task_id)
            summary = work(ctx)
        except GpufleetError as exc:
            error = str(exc)
        except Exception as exc:
            log.exception("task %s failed", ctx.task_id)
            error = f"{type(exc).__name__}: {exc}"
        finally:
            try:
                with transaction(self._sessions) as session:
                    state = service.finish(session, self._clock, ctx.task_id, error=error, summary=summary)
                log.info("task %s %s", ctx.task_id, state)
            except Exception:
                log.exception("task %s: could not record its end", ctx.task_id)
            with self._lock:
                self._threads.pop(ctx.task_id, None)

    def _ensure_beater(self) -> None:
        """Called holding the lock: the beater decides to stop under the same lock, so a task that
        starts as the last one ends always finds a beater that will beat for it."""
        if self._beater is None:
            self._beater = threading.Thread(target=self._beat, name="task-heartbeat", daemon=True)
            self._beater.start()

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            with self._lock:
                ids = list(self._threads)
                if not ids:
                    self._beater = None
                    return
            try:
                with transaction(self._sessions) as session:
                    service.heartbeat(session, self._clock, ids)
            except GpufleetError as exc:
                log.warning("task heartbeat: %s", exc)

    def interrupt_stale(self) -> int:
        """Tasks left unfinished by a head that stopped beating are marked interrupted."""
        with transaction(self._sessions) as session:
            return service.interrupt_stale(session, self._clock, STALE_AFTER_S)

    def watch(self, every_s: float = JANITOR_S) -> None:
        """Look for a stopped head's tasks now and then every `every_s`, for as long as this head runs:
        a head restarted within STALE_AFTER_S of its predecessor, or a replica whose peer died, finds
        them on a later look rather than never."""
        self._janitor = threading.Thread(target=self._sweep, args=(every_s,), name="task-janitor", daemon=True)
        self._janitor.start()

    def _sweep(self, every_s: float) -> None:
        while True:
            try:
                found = self.interrupt_stale()
                if found:
                    log.warning("marked %d task(s) of a stopped head interrupted", found)
            except GpufleetError as exc:
                log.warning("looking for a stopped head's tasks: %s", exc)
            if self._stop.wait(every_s):
                return

    def running(self) -> list[int]:
        with self._lock:
            return list(self._threads)

    def wait(self, task_id: int, timeout_s: float) -> None:
        """Wait for a task's thread to end (tests, shutdown). Raises TimeoutError if it does not."""
        with self._lock:
            thread = self._threads.get(task_id)
        if thread is None:
            return
        thread.join(timeout_s)
        if thread.is_alive():
            raise TimeoutError(f"task {task_id} still running after {timeout_s} s")

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop beating and sweeping; tasks still running after `timeout_s` are left for another head to
        interrupt."""
        self._stop.set()
        if self._janitor is not None:
            self._janitor.join(timeout_s)
        deadline = time.monotonic() + timeout_s
        for task_id in self.running():
            try:
                self.wait(task_id, max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                log.warning("task %s still running at shutdown; the next head marks it interrupted", task_id)
