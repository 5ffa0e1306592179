"""The fault target of one simulated node: GPU faults go to its SimulatedNvml, `ib-down` to its ports, and
the weak parts only burn-in steps reveal (`weak-gpu-slow`, `weak-gpu-wrong`, `weak-link`) to its BurninFaults,
the `mount-*` faults to its SimulatedStorage."""

from __future__ import annotations

from gpufleet.core.errors import InvalidInput
from gpufleet.sim.burnin import WEAK_FAULTS, BurninFaults
from gpufleet.sim.infiniband import SimulatedInfiniband
from gpufleet.sim.nvml import SimulatedNvml
from gpufleet.sim.storage import MOUNT_FAULTS, SimulatedStorage


class SimulatedFaults:
    """Implements agent.faults.FaultTarget for a simulated node.

    For `ib-down` the GPU number, when given, picks the InfiniBand port by its place in the list:
    the fault command has no port field of its own. `burnin` is shared with the node's SimulatedExecutor,
    which measures what it holds; default: a set of its own (nothing then runs burn-in steps here).
    """

    def __init__(
        self,
        nvml: SimulatedNvml,
        infiniband: SimulatedInfiniband,
        burnin: BurninFaults | None = None,
        storage: SimulatedStorage | None = None,
    ) -> None:
        self.nvml = nvml
        self.infiniband = infiniband
        self.burnin = burnin or BurninFaults(len(nvml.gpus))
        self.storage = storage  # the node's shared mounts (`mount-*` faults); None: it has none

    def inject(self, kind: str, gpu: int | None) -> str:
        """Apply one fault and say what changed. Raises InvalidInput for a fault or GPU the node lacks."""
        if kind == "ib-down":
            return self.infiniband.inject(kind, gpu)
        if kind in WEAK_FAULTS:
            return self.burnin.inject(kind, gpu)
        if kind in MOUNT_FAULTS:
            if self.storage is None:
                raise InvalidInput("this node has no shared mounts (gpufleet sim --shared-mount PATH)")
            return self.storage.inject(kind, gpu)
        return self.nvml.inject(kind, gpu)

    def heal(self) -> str:
        """Undo every fault on the GPUs, the ports, the weak parts and the shared mounts."""
        healed = f"{self.nvml.heal()}; {self.infiniband.heal()}; {self.burnin.heal()}"
        return f"{healed}; {self.storage.heal()}" if self.storage is not None else healed
