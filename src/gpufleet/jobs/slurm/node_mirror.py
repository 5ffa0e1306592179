"""Slurm's word for each node, mirrored onto gpufleet's node rows (the sync's step 4). Pure but for the write.

`wlm_state` says what Slurm says of the node (None for a node Slurm does not have); a drain set in Slurm by
a person shows as drained by "slurm:<user>" (and so is never resumed by gpufleet), a drain lifted in Slurm
is lifted on the row, Slurm being the truth.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar

from sqlalchemy import update
from sqlalchemy.orm import Session

from gpufleet.core.clock import to_datetime
from gpufleet.inventory.models import Node
from gpufleet.jobs.slurm.manager import FOREIGN_ACTOR_PREFIX
from gpufleet.jobs.slurm.nodes import SlurmNode


@dataclass(frozen=True)
class NodeRow:
    COLUMNS: ClassVar = (Node.id, Node.name, Node.wlm_state, Node.drained_at, Node.drain_reason, Node.drained_by)

    id: int
    name: str
    wlm_state: str | None
    drained_at: datetime | None
    drain_reason: str | None
    drained_by: str | None


def mirror(rows: list[NodeRow], nodes: list[SlurmNode], now: float) -> list[dict[str, Any]]:
    """The node rows' changes that make them say what Slurm says: its word for each node (None for a
    node Slurm does not have) and its drains, Slurm being the truth."""
    by_name = {n.name: n for n in nodes}
    updates: list[dict[str, Any]] = []
    for row in rows:
        slurm = by_name.get(row.name)
        change: dict[str, Any] = {}
        state = slurm.display_state[:32] if slurm else None
        if row.wlm_state != state:
            change["wlm_state"] = state
        if slurm is not None:
            held = slurm.drain or (slurm.state == "down" and slurm.reason is not None)
            if held and slurm.reason and row.drain_reason != slurm.reason[:512]:
                change["drained_at"] = to_datetime(slurm.reason_at.timestamp() if slurm.reason_at else now)
                change["drain_reason"] = slurm.reason[:512]
                change["drained_by"] = (
                    "gpufleet" if slurm.own_drain else f"{FOREIGN_ACTOR_PREFIX}{slurm.reason_user or 'unknown'}"
                )[:128]
            elif not held and row.drained_at is not None:
                change.update(drained_at=None, drain_reason=None, drained_by=None)
        if change:
            updates.append({"id": row.id, **change})
    return updates


def write(session: Session, updates: list[dict[str, Any]], *, same_drains: bool) -> int:
    """Each changed node row by its primary key. A drain or resume made through gpufleet while Slurm was
    being read wins: the drain columns are then left for the next pass."""
    if not same_drains:
        updates = [{k: v for k, v in u.items() if k in ("id", "wlm_state")} for u in updates]
        updates = [u for u in updates if len(u) > 1]
    if updates:
        session.execute(update(Node), updates)
    return len(updates)
