"""The fault target of one simulated node: GPU faults go to its SimulatedNvml, `ib-down` to its ports."""

from __future__ import annotations

from gpufleet.sim.infiniband import SimulatedInfiniband
from gpufleet.sim.nvml import SimulatedNvml


class SimulatedFaults:
    """Implements agent.faults.FaultTarget for a simulated node.

    For `ib-down` the GPU number, when given, picks the InfiniBand port by its place in the list:
    the fault command has no port field of its own.
    """

    def __init__(self, nvml: SimulatedNvml, infiniband: SimulatedInfiniband) -> None:
        self.nvml = nvml
        self.infiniband = infiniband

    def inject(self, kind: str, gpu: int | None) -> str:
        """Apply one fault and say what changed. Raises InvalidInput for a fault or GPU the node lacks."""
        if kind == "ib-down":
            return self.infiniband.inject(kind, gpu)
        return self.nvml.inject(kind, gpu)

    def heal(self) -> str:
        """Undo every fault on the GPUs and the ports."""
        return f"{self.nvml.heal()}; {self.infiniband.heal()}"
