"""Xid events through NVML's event set, against the simulated NVML."""

from __future__ import annotations

import threading
import time

from gpufleet.agent.metrics.gpu import GpuCollector
from gpufleet.agent.metrics.xid import XidBook, XidWatcher
from gpufleet.sim.nvml import SimulatedNvml


def test_an_injected_xid_is_read_with_its_gpu_and_kept_for_xid_last() -> None:
    nvml = SimulatedNvml("n1")
    book = XidBook()
    watcher = XidWatcher(nvml, book, blocking=False)
    assert watcher.poll(0) == []
    assert book.active

    nvml.inject("xid79", 3)
    events = watcher.poll(0)

    assert [(e.kind, e.gpu, e.code) for e in events] == [("xid", 3, 79)]
    assert events[0].message == "Xid 79 on GPU 3"
    assert book.last == {3: 79}
    values = GpuCollector(nvml, xids=book).collect().entities
    assert values["gpu:0"]["xid_last"] == 0
    assert "gpu:3" not in values  # it fell off the bus
    assert watcher.poll(0) == []


def test_several_queued_events_come_in_one_poll_in_order() -> None:
    nvml = SimulatedNvml("n1")
    watcher = XidWatcher(nvml, blocking=False)
    watcher.poll(0)

    nvml.inject("ecc-dbe", 1)
    nvml.inject("nvlink-down", 2)

    assert [(e.gpu, e.code) for e in watcher.poll(0)] == [(1, 48), (2, 74)]


def test_a_blocking_wait_returns_as_soon_as_an_xid_comes() -> None:
    nvml = SimulatedNvml("n1", gpu_count=2)
    watcher = XidWatcher(nvml)
    assert watcher.poll(10) == []  # times out

    timer = threading.Timer(0.05, nvml.inject, ("xid79", 1))
    timer.start()
    started = time.monotonic()
    events = watcher.poll(5000)
    timer.join()

    assert [(e.gpu, e.code) for e in events] == [(1, 79)]
    assert time.monotonic() - started < 4  # woken by the event, not by the timeout
    watcher.close()


def test_without_a_gpu_there_is_nothing_to_watch_and_xid_last_stays_out() -> None:
    nvml = SimulatedNvml("cpu-only", gpu_count=0)
    book = XidBook()

    assert XidWatcher(nvml, book, blocking=False).poll(0) == []
    assert not book.active


def test_nvml_refusing_events_is_retried_later_not_every_poll() -> None:
    class NoEvents(SimulatedNvml):
        attempts = 0

        def nvmlEventSetCreate(self) -> object:
            NoEvents.attempts += 1
            raise self.NVMLError_NotSupported("Not Supported")

    now = [0.0]
    watcher = XidWatcher(NoEvents("n1"), blocking=False, monotonic=lambda: now[0])

    assert watcher.poll(0) == watcher.poll(0) == []
    assert NoEvents.attempts == 1
    now[0] += 61
    watcher.poll(0)
    assert NoEvents.attempts == 2
