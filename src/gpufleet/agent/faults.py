"""Fault injection (`gpufleet sim fault`): what a simulated node offers the daemon, and what the daemon does itself.

Hardware faults (an Xid 79, an ECC error, a hot GPU, a dead NVLink or InfiniBand port, a missing GPU)
change what the node's simulated NVML and ports report, so the real collectors see them. Two faults
are the agent's own behaviour and are handled by the daemon: `node-crash` (nothing leaves the node but
answers to commands) and `agent-hang` (heartbeats go on, metrics and events stop). A real agent has
no fault target and refuses every command.
"""

from __future__ import annotations

from typing import Protocol

AGENT_FAULTS = frozenset({"node-crash", "agent-hang"})
REFUSED_ON_REAL_NODES = "fault injection works only on simulated nodes"


class FaultTarget(Protocol):
    """A simulated node's hardware, as far as faults go."""

    def inject(self, kind: str, gpu: int | None) -> str:
        """Apply fault `kind` (to GPU `gpu`, default 0, where it concerns a GPU) and say what changed.

        Raises InvalidInput for a kind this node does not simulate or a GPU it does not have.
        """
        ...

    def heal(self) -> str:
        """Undo every injected fault, as a repair and GPU reset would, and say what changed."""
        ...
