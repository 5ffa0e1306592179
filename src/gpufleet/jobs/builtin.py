"""The built-in workload manager's drain state: kept on the node row, which its scheduler reads."""

from __future__ import annotations

from sqlalchemy.orm import Session

from gpufleet.core.clock import Clock, to_datetime
from gpufleet.inventory.models import Node


class BuiltinWorkloadManager:
    name = "builtin"

    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    def drain(self, session: Session, node: Node, reason: str, actor: str) -> None:
        node.drained_at = to_datetime(self.clock.now())
        node.drain_reason = reason
        node.drained_by = actor
        session.flush()

    def resume(self, session: Session, node: Node, actor: str) -> None:
        node.drained_at = None
        node.drain_reason = None
        node.drained_by = None
        session.flush()
