"""The node state machine, as data: which transitions exist and why they happen."""

from __future__ import annotations

import enum


class NodeState(enum.StrEnum):
    NEW = "new"  # registered (by `node add` or a join) but never heard from
    UP = "up"  # heartbeats arrive
    DOWN = "down"  # heartbeats stopped for longer than the node's deadline


ALLOWED: frozenset[tuple[NodeState, NodeState]] = frozenset(
    {
        (NodeState.NEW, NodeState.UP),
        (NodeState.UP, NodeState.DOWN),
        (NodeState.DOWN, NodeState.UP),
    }
)


def allowed(src: NodeState, dst: NodeState) -> bool:
    return (src, dst) in ALLOWED
