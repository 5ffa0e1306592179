"""Xid errors as NVML delivers them: an event set with every GPU registered for critical Xid errors,
waited on with a timeout. Each Xid becomes a `NodeEvent(kind="xid")` the moment it is read, and the
last one per GPU is kept for the `xid_last` metric.
"""

from __future__ import annotations

import ctypes
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpufleet.agent.gpu import nvml_api as api
from gpufleet.protocol.metrics import NodeEvent

log = logging.getLogger(__name__)

RETRY_START_S = 60.0  # how long to wait before trying again to set up events NVML refused
MAX_DRAIN = 64  # events read at once after a wait returns one


@dataclass
class XidBook:
    """Shared between the watcher (writes) and the GPU collector (reads `xid_last`).

    `active` is true once the watcher listens on at least one GPU: before that a missing Xid means
    "not watched", not "none", so the collector leaves `xid_last` out.
    """

    active: bool = False
    last: dict[int, int] = field(default_factory=dict)  # GPU index -> last Xid


def handle_key(handle: Any) -> int:
    """A key for an NVML device handle: the address a ctypes pointer holds, or the object's identity."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value or 0
    except (TypeError, ctypes.ArgumentError):
        return id(handle)


class XidWatcher:
    """Waits for Xid events on every GPU.

    `blocking` is true for real NVML, whose wait blocks in the driver (the daemon runs `poll` in a
    thread); the simulator's event set answers at once, so it is polled on the event loop instead.
    Not thread-safe: one poll at a time.
    """

    def __init__(
        self,
        nvml: Any | None = None,
        book: XidBook | None = None,
        *,
        blocking: bool = True,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """Nothing is loaded until the first poll."""
        self._nvml: Any = nvml  # None until the first use imports pynvml
        self.book = book if book is not None else XidBook()
        self.blocking = blocking
        self._clock = clock
        self._monotonic = monotonic
        self._event_set: Any = None
        self._indexes: dict[int, int] = {}  # handle key -> GPU index at registration
        self._next_start = 0.0
        self._initialised = False
        self._warned: set[str] = set()

    def poll(self, timeout_ms: int) -> list[NodeEvent]:
        """Wait up to `timeout_ms` for Xid events; return those read (usually none). Raises nothing:
        NVML trouble is logged once per distinct message and the watcher tries again later."""
        if self._event_set is None and not self._start():
            self._idle(timeout_ms)
            return []
        nvml = self._nvml
        events: list[NodeEvent] = []
        wait_ms = timeout_ms
        for _ in range(MAX_DRAIN):
            try:
                data = nvml.nvmlEventSetWait(self._event_set, wait_ms)
            except nvml.NVMLError as exc:
                if api.error_code(exc) != api.NVML_ERROR_TIMEOUT:
                    self._warn(f"waiting for Xid events failed: {exc}")
                    if not events:
                        self._idle(timeout_ms)  # do not spin on a wait that fails at once
                break
            event = self._to_event(data)
            if event is not None:
                events.append(event)
            wait_ms = 0  # take what else is queued, without waiting again
        return events

    def close(self) -> None:
        """Free the event set and shut NVML down if this watcher started it; safe to call twice."""
        nvml: Any = self._nvml
        if self._event_set is not None:
            try:
                nvml.nvmlEventSetFree(self._event_set)
            except nvml.NVMLError as exc:
                log.debug("nvmlEventSetFree failed: %s", exc)
            self._event_set = None
        if self._initialised:
            self._initialised = False
            try:
                nvml.nvmlShutdown()
            except nvml.NVMLError as exc:
                log.debug("nvmlShutdown failed: %s", exc)

    def _start(self) -> bool:
        """Create the event set and register every GPU that supports Xid events; False if none could be."""
        now = self._monotonic()
        if now < self._next_start:
            return False
        self._next_start = now + RETRY_START_S
        try:
            nvml = self._open()
        except ImportError:
            self._warn("no Xid events: nvidia-ml-py is not installed")
            return False
        try:
            if not self._initialised:
                nvml.nvmlInit()
                self._initialised = True
            event_set = nvml.nvmlEventSetCreate()
            indexes: dict[int, int] = {}
            for index in range(int(nvml.nvmlDeviceGetCount())):
                try:
                    handle = nvml.nvmlDeviceGetHandleByIndex(index)
                    nvml.nvmlDeviceRegisterEvents(handle, api.EVENT_TYPE_XID_CRITICAL_ERROR, event_set)
                except nvml.NVMLError as exc:
                    self._warn(f"no Xid events from GPU {index}: {exc}")
                    continue
                indexes[handle_key(handle)] = index
        except nvml.NVMLError as exc:
            self._warn(f"no Xid events: {exc}")
            return False
        if not indexes:
            nvml.nvmlEventSetFree(event_set)
            return False
        self._event_set, self._indexes = event_set, indexes
        self.book.active = True
        log.info("watching %d GPU(s) for Xid errors", len(indexes))
        return True

    def _open(self) -> Any:
        if self._nvml is None:
            import pynvml

            self._nvml = pynvml
        return self._nvml

    def _to_event(self, data: Any) -> NodeEvent | None:
        """An Xid NodeEvent from nvmlEventData_t, or None for another event type."""
        if not int(data.eventType) & api.EVENT_TYPE_XID_CRITICAL_ERROR:
            return None
        xid = int(data.eventData)
        index = self._index_of(data.device)
        if index is not None:
            self.book.last[index] = xid
        where = f"GPU {index}" if index is not None else "an unknown GPU"
        return NodeEvent(ts=self._clock(), kind="xid", gpu=index, code=xid, message=f"Xid {xid} on {where}")

    def _index_of(self, handle: Any) -> int | None:
        """The GPU's current index; the index it had when registered if NVML no longer answers for it
        (a GPU that fell off the bus)."""
        nvml = self._nvml
        try:
            return int(nvml.nvmlDeviceGetIndex(handle))
        except (nvml.NVMLError, AttributeError):
            return self._indexes.get(handle_key(handle))

    def _idle(self, timeout_ms: int) -> None:
        if self.blocking and timeout_ms > 0:
            time.sleep(timeout_ms / 1000)

    def _warn(self, message: str) -> None:
        if message not in self._warned and len(self._warned) < 100:
            self._warned.add(message)
            log.warning("%s", message)
