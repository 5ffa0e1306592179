"""Assemble the node inventory from host facts and whichever GPU backend answers."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gpufleet import __version__
from gpufleet.agent.gpu.detect import detect_gpus
from gpufleet.agent.gpu.ports import GpuReader
from gpufleet.agent.host import HostFacts
from gpufleet.protocol.inventory import NodeInventory

InventorySource = Callable[[], NodeInventory]


def inventory_source(host: Callable[[], HostFacts], readers: Sequence[GpuReader]) -> InventorySource:
    """A callable that reads the current inventory; GPU readers are tried in order (NVML, then nvidia-smi)."""

    def read() -> NodeInventory:
        facts = host()
        source, gpus, _reasons = detect_gpus(readers)
        return NodeInventory(
            hostname=facts.hostname,
            cpus=facts.cpus,
            cpu_model=facts.cpu_model,
            memory_total_mib=facts.memory_total_mib,
            os_name=facts.os_name,
            kernel=facts.kernel,
            arch=facts.arch,
            agent_version=__version__,
            gpu_source=source,
            gpus=gpus,
        )

    return read
