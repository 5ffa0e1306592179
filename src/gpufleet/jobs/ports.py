"""What gpufleet needs from a workload manager: keep new work off a node, and let it back."""

from __future__ import annotations

from typing import Protocol

from sqlalchemy.orm import Session

from gpufleet.inventory.models import Node

# A drain whose reason starts with this was made by gpufleet, which may therefore undo it; any other
# drain was made by a person (or another tool) and is never undone automatically.
OWN_DRAIN_PREFIX = "gpufleet:"


class WorkloadManager(Protocol):
    name: str

    def drain(self, session: Session, node: Node, reason: str, actor: str) -> None:
        """Stop new work landing on `node`; running work may finish. Raises Unavailable if unreachable."""
        ...

    def resume(self, session: Session, node: Node, actor: str) -> None:
        """Let work land on `node` again. Raises Unavailable if the workload manager is unreachable."""
        ...
