"""Simulated host metrics: what the real HostCollector would send for a simulated node, without psutil.

A thousand simulated nodes share one real machine, so its own CPU, disks and NICs would describe
none of them. Memory scales per GPU from the real H200 machine (tests/fixtures/h200/meminfo.txt:
MemTotal 131981020 kB, MemAvailable 131461588 kB on an idle node), as `sim.host` does for the
inventory. CPU use follows the GPUs' load; the disk and the NIC are plausible, not measured.
"""

from __future__ import annotations

import random
import time
import zlib
from collections.abc import Callable

from gpufleet.agent.metrics.ports import Collected
from gpufleet.sim.host import CPUS_PER_GPU
from gpufleet.sim.nvml import SimulatedNvml

_MEM_PER_GPU_BYTES = 131_981_020 * 1024
_AVAILABLE_IDLE_SHARE = 131_461_588 / 131_981_020
_ROOT_DISK_BYTES = 1_920_383_410_176  # a 1.92 TB NVMe boot drive
_ROOT_USED_PCT = 12.0
_NIC_BYTES_PER_S = 2_000_000  # management traffic


class SimulatedHostMetrics:
    """The `host`, `disk:/` and `nic:eth0` entities of one simulated node; cheap (no I/O)."""

    name = "host"

    def __init__(self, node_name: str, nvml: SimulatedNvml, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._nvml = nvml
        self._gpus = max(1, len(nvml.gpus))
        self._rng = random.Random(zlib.crc32(node_name.encode()))
        self._clock = clock
        self._last = clock()
        self._rx = self._tx = 0.0

    def collect(self) -> Collected:
        """One round of host values."""
        busy = sum(gpu.load for gpu in self._nvml.gpus) / self._gpus
        cpus = CPUS_PER_GPU * self._gpus
        load = busy * cpus * 0.1 + self._rng.uniform(0.0, 0.5)  # a data loader's share of the cores
        total = _MEM_PER_GPU_BYTES * self._gpus
        available = total * (_AVAILABLE_IDLE_SHARE - 0.2 * busy)
        now = self._clock()
        elapsed, self._last = now - self._last, now
        self._rx += _NIC_BYTES_PER_S * elapsed * (1 + self._rng.random())
        self._tx += _NIC_BYTES_PER_S * elapsed * self._rng.random()
        return Collected(
            entities={
                "host": {
                    "cpu_util": round(100 * load / cpus, 2),
                    "load1": round(load, 2),
                    "load5": round(load, 2),
                    "load15": round(load, 2),
                    "mem_total_bytes": float(total),
                    "mem_available_bytes": float(round(available)),
                    "mem_used_pct": round(100 * (1 - available / total), 2),
                    "swap_used_bytes": 0.0,
                },
                "disk:/": {
                    "disk_total_bytes": float(_ROOT_DISK_BYTES),
                    "disk_used_pct": _ROOT_USED_PCT,
                    "disk_inodes_used_pct": 1.5,
                },
                "nic:eth0": {
                    "net_rx_bytes": float(round(self._rx)),
                    "net_tx_bytes": float(round(self._tx)),
                    "net_rx_errors": 0.0,
                    "net_tx_errors": 0.0,
                    "net_up": 1.0,
                },
            }
        )
