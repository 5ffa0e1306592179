"""Liveness: heartbeat receipts in memory, made durable in batches; the sweep that marks silent nodes down.

One database write per heartbeat does not hold at 1,000 nodes a second, so each replica keeps the
receipt times in memory (`HeartbeatBook`) and writes them in one batched UPDATE per flush. The
leader's sweep then compares each `up` node's newest receipt, from memory or from the database
(another replica's flush), with that node's deadline: `down_after_intervals` of its own period.
The leader keeps the `up` nodes' durable receipts in a view it reloads about once a second, so a
sweep tick is a loop in memory; only overdue nodes are re-read and changed in the database.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

from sqlalchemy import Table, bindparam, select, update
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
    # A Core executemany, not the ORM's bulk update by primary key: a receipt for a node deleted
    # meanwhile must match no row and be dropped, not fail the whole batch (and every retry of it).
    nodes = cast(Table, Node.__table__)
    session.execute(
        update(nodes)
        .where(nodes.c.id == bindparam("node_id"))
        .values(last_seen=bindparam("seen"), heartbeat_interval_s=bindparam("interval")),
        [{"node_id": node_id, "seen": to_datetime(r.at), "interval": r.interval_s} for node_id, r in receipts.items()],
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


@dataclass(frozen=True)
class Deadlines:
    """How the sweep judges silence (see `sweep`)."""

    down_after_intervals: float
    default_interval_s: float
    leader_since: float
    grace_s: float


@dataclass(frozen=True)
class UpNode:
    name: str
    last_seen: float  # the durable receipt, from any replica's flush (0 if none)
    interval_s: float | None


def load_up_nodes(session: Session, ids: list[int] | None = None) -> dict[int, UpNode]:
    """The `up` nodes (all, or those of `ids`) with their durable last receipt: the leader's view."""
    query = select(Node.id, Node.name, Node.last_seen, Node.heartbeat_interval_s).where(Node.state == NodeState.UP)
    if ids is not None:
        query = query.where(Node.id.in_(ids))
    return {
        node_id: UpNode(name, last_seen.timestamp() if last_seen is not None else 0.0, interval)
        for node_id, name, last_seen, interval in session.execute(query)
    }


def _silence(node_id: int, node: UpNode, book: HeartbeatBook, now: float, rules: Deadlines) -> tuple[float, float]:
    """(seconds silent, deadline) for one node. A node last heard before this replica became leader
    counts as heard at `leader_since + grace_s`, so it first gets time to reconnect."""
    mine = book.latest.get(node_id)
    newest = max(node.last_seen, mine.at if mine is not None else 0.0)
    if newest < rules.leader_since:
        newest = max(newest, rules.leader_since + rules.grace_s)
    period = (mine.interval_s if mine is not None else node.interval_s) or rules.default_interval_s
    return now - newest, period * rules.down_after_intervals


def overdue(view: dict[int, UpNode], book: HeartbeatBook, now: float, rules: Deadlines) -> list[int]:
    """Nodes of the view silent past their deadline. Pure and cheap: the leader runs it every tick."""
    return [
        node_id
        for node_id, node in view.items()
        if (judged := _silence(node_id, node, book, now, rules))[0] > judged[1]
    ]


def mark_down(
    session: Session,
    clock: Clock,
    book: HeartbeatBook,
    candidates: list[int],
    rules: Deadlines,
    view: dict[int, UpNode] | None = None,
) -> list[Change]:
    """Re-check candidates against fresh database rows (another replica may have heard them since the
    view was loaded) and move those still silent to `down`. `view`, if given, is brought up to date."""
    now = clock.now()
    changes: list[Change] = []
    for start in range(0, len(candidates), 500):
        chunk = candidates[start : start + 500]
        fresh = load_up_nodes(session, chunk)
        if view is not None:
            for node_id in chunk:
                view.pop(node_id, None)
            view.update(fresh)
        for node_id, node in fresh.items():
            silent, deadline = _silence(node_id, node, book, now, rules)
            if silent <= deadline:
                continue
            reason = f"no heartbeat for {silent:.1f}s (deadline {deadline:.1f}s)"
            if transition(session, clock, node_id, NodeState.UP, NodeState.DOWN, reason):
                changes.append(Change(node_id, node.name, NodeState.DOWN, reason))
                if view is not None:
                    view.pop(node_id, None)
    return changes


def sweep(session: Session, clock: Clock, book: HeartbeatBook, rules: Deadlines) -> list[Change]:
    """One full pass: load the view, find the overdue nodes, mark them down."""
    candidates = overdue(load_up_nodes(session), book, clock.now(), rules)
    return mark_down(session, clock, book, candidates, rules) if candidates else []
