"""Assemble the node inventory from host facts, whichever GPU backend answers, and the LLDP neighbours."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gpufleet import __version__
from gpufleet.agent.gpu.detect import detect_gpus
from gpufleet.agent.gpu.ports import GpuReader
from gpufleet.agent.host import HostFacts
from gpufleet.protocol.inventory import NodeInventory
from gpufleet.protocol.topology import LinkNeighbor

InventorySource = Callable[[], NodeInventory]
NeighborSource = Callable[[], list[LinkNeighbor]]


def inventory_source(
    host: Callable[[], HostFacts], readers: Sequence[GpuReader], neighbors: NeighborSource | None = None
) -> InventorySource:
    """A callable that reads the current inventory; GPU readers are tried in order (NVML, then nvidia-smi).

    `neighbors` reads what the node's ports see over LLDP (agent.topology.lldp.LldpNeighbors, which never
    raises); None, as in the simulator, reports none.
    """

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
            neighbors=neighbors() if neighbors is not None else [],
        )

    return read
