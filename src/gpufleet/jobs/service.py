"""Drain and resume by hand. Takes a session; never commits."""

from __future__ import annotations

from sqlalchemy.orm import Session

from gpufleet.core.errors import Conflict, InvalidInput
from gpufleet.inventory import service as inventory
from gpufleet.inventory.models import Node
from gpufleet.jobs.ports import OWN_DRAIN_PREFIX, WorkloadManager

# Holds of a workflow still in progress (lifecycle: a burn-in running, a maintenance campaign): resuming
# the node by hand would put it in service under the workflow's feet.
WORKFLOW_HOLDS = ("burn-in", "maintenance")


def drain(session: Session, workload: WorkloadManager, name: str, reason: str, actor: str) -> Node:
    """A person's drain: never undone by gpufleet, even over one gpufleet made (it becomes theirs).

    Raises NotFound for an unknown node, InvalidInput for an empty reason or one posing as gpufleet's.
    """
    reason = reason.strip()
    if not reason:
        raise InvalidInput("a drain needs a reason")
    if reason.lower().startswith(OWN_DRAIN_PREFIX):
        raise InvalidInput(f"reasons starting {OWN_DRAIN_PREFIX!r} are gpufleet's own")
    node = inventory.get_node(session, name)
    workload.drain(session, node, reason, actor)
    return node


def resume(session: Session, workload: WorkloadManager, name: str, actor: str) -> Node:
    """Raises NotFound for an unknown node and Conflict for one that is not drained."""
    node = inventory.get_node(session, name)
    if node.hold in WORKFLOW_HOLDS:
        raise Conflict(f"node {name} is held by {node.hold}: cancel that first, or let it finish")
    if node.drained_at is None:
        raise Conflict(f"node {name} is not drained")
    workload.resume(session, node, actor)
    node.hold = None  # a person's resume overrides a failed burn-in's hold: they answer for the node now
    return node
