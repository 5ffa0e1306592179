"""Liveness: heartbeat receipts in memory, made durable in batches; the sweep that marks silent nodes down.

One database write per heartbeat does not hold at 1,000 nodes a second, so each replica keeps the
receipt times in memory (`HeartbeatBook`) and writes them in one batched UPDATE per flush. The
leader's sweep then compares each `up` node's newest receipt, from memory or from the database
(another replica's flush), with that node's deadline: `down_after_intervals` of its own period.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from gpufleet.core.clock import Clock, to_datetime
from gpufleet.inventory.models import Node
from gpufleet.inventory.service import transition
from gpufleet.inventory.states import NodeState


@dataclass
class Receipt:
    at: float
    interval_s: float
    seq: int


@dataclass
class HeartbeatBook:
    """Heartbeat receipts on this replica: the newest per node, and those not yet written."""

    latest: dict[int, Receipt] = field(default_factory=dict)
    pending: dict[int, Receipt] = field(default_factory=dict)

    def record(self, node_id: int, at: float, interval_s: float, seq: int) -> None:
        receipt = Receipt(at, interval_s, seq)
        self.latest[node_id] = receipt
        self.pending[node_id] = receipt

    def take_pending(self) -> dict[int, Receipt]:
        taken, self.pending = self.pending, {}
        return taken

    def restore(self, receipts: dict[int, Receipt]) -> None:
        """Put back receipts whose write failed, unless a newer one arrived meanwhile."""
        for node_id, receipt in receipts.items():
            current = self.pending.get(node_id)
            if current is None or current.at < receipt.at:
                self.pending[node_id] = receipt

    def forget(self, node_id: int) -> None:
        self.latest.pop(node_id, None)
        self.pending.pop(node_id, None)


@dataclass(frozen=True)
class Change:
    node_id: int
    name: str
    to_state: NodeState
    reason: str


def flush(session: Session, clock: Clock, receipts: dict[int, Receipt]) -> list[Change]:
    """Write receipts (last_seen, interval) in one batch and bring nodes that were not `up` back up.

    Returns the transitions made. A receipt for a node deleted meanwhile is dropped.
    """
    if not receipts:
        return []
    session.execute(
        update(Node),
        [
            {"id": node_id, "last_seen": to_datetime(r.at), "heartbeat_interval_s": r.interval_s}
            for node_id, r in receipts.items()
        ],
        execution_options={"synchronize_session": False},
    )
    changes: list[Change] = []
    ids = list(receipts)
    for start in range(0, len(ids), 500):
        rows = session.execute(
            select(Node.id, Node.name, Node.state).where(
                Node.id.in_(ids[start : start + 500]), Node.state != NodeState.UP
            )
        )
        for node_id, name, state in rows:
            reason = "first heartbeat" if state is NodeState.NEW else "heartbeats resumed"
            if transition(session, clock, node_id, state, NodeState.UP, reason):
                changes.append(Change(node_id, name, NodeState.UP, reason))
    return changes


def sweep(
    session: Session,
    clock: Clock,
    book: HeartbeatBook,
    *,
    down_after_intervals: float,
    default_interval_s: float,
    leader_since: float,
    grace_s: float,
) -> list[Change]:
    """Mark `up` nodes down whose newest heartbeat is older than their deadline.

    A node last heard before this replica became leader (`leader_since`) is judged as if heard at
    `leader_since + grace_s`: a restarted head, or a new leader after a failover, first gives every
    node time to reconnect. A node heard since is judged on its own heartbeats at once.
    """
    now = clock.now()
    changes: list[Change] = []
    rows = session.execute(
        select(Node.id, Node.name, Node.last_seen, Node.heartbeat_interval_s).where(Node.state == NodeState.UP)
    )
    for node_id, name, last_seen, interval in rows:
        mine = book.latest.get(node_id)
        newest = max(last_seen.timestamp() if last_seen is not None else 0.0, mine.at if mine is not None else 0.0)
        if newest < leader_since:
            newest = max(newest, leader_since + grace_s)
        period = (mine.interval_s if mine is not None else interval) or default_interval_s
        silent = now - newest
        if silent > period * down_after_intervals:
            reason = f"no heartbeat for {silent:.1f}s (deadline {period * down_after_intervals:.1f}s)"
            if transition(session, clock, node_id, NodeState.UP, NodeState.DOWN, reason):
                changes.append(Change(node_id, name, NodeState.DOWN, reason))
    return changes
