"""Bring the GPUs to their declared MIG layouts, one idle GPU at a time, through the agents.

The declared layout is a setting (`mig_layout`, per category or node: inventory.categories); the
GPUs' actual layouts come with each inventory. Nothing here waits or drains by hand:

- the scheduler pass gives no new job to a GPU whose layout must change (jobs.tick uses `layouts` too),
  so once the jobs on it end, it is idle and stays so;
- every replica, for the nodes whose channels it holds, sends a `MigApply` for the GPUs that must change
  and hold no rank (`outgoing`, with the job dispatch), and marks the node asked (`nodes.mig_sent_at`);
- the agent applies it, re-sends its inventory, then answers (`MigResult`); `record_result` stores what
  failed and when. A GPU still off its layout after an answer that said done (its inventory was lost, or
  the driver names a profile otherwise) is asked again after SETTLE_S; a refused or unanswered request
  after RETRY_S: a reset the driver could not do waits for a reboot, and asking every half second would
  only fill the agent's log. A new declaration clears the mark (sharing.service), so it goes out at once.

Takes a session and a clock; never commits (the caller's transaction does).
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Collection

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpufleet.core.clock import Clock, to_datetime
from gpufleet.inventory.mig_layouts import layouts, to_change
from gpufleet.inventory.models import Node
from gpufleet.inventory.states import NodeState
from gpufleet.jobs.models import JobRank, RankState
from gpufleet.protocol.mig import MigApply, MigResult

RETRY_S = 60.0
SETTLE_S = 10.0
_ids = itertools.count(1)


def held_gpus(session: Session, node_ids: Collection[int]) -> dict[int, set[int]]:
    """GPU indexes that ranks hold now, by node id (a MIG rank holds its instances' GPUs)."""
    held: dict[int, set[int]] = defaultdict(set)
    rows = session.execute(
        select(JobRank.node_id, JobRank.gpu_indexes).where(
            JobRank.node_id.in_(list(node_ids)), JobRank.state != RankState.EXITED
        )
    )
    for node_id, indexes in rows:
        if node_id is not None:
            held[node_id].update(indexes)
    return held


def outgoing(
    session: Session, clock: Clock, node_ids: Collection[int], *, slurm: bool = False
) -> list[tuple[int, MigApply]]:
    """The MIG changes due for these nodes (up, GPUs idle, not asked lately); marks them asked. Under
    Slurm (`slurm`) gpufleet does not know which GPUs Slurm's jobs hold: only nodes Slurm reports drained
    (no job left) are changed, so an admin drains them first."""
    if not node_ids:
        return []
    changes = to_change(session, node_ids)
    if not changes:
        return []
    now = clock.now()
    rows = session.scalars(select(Node).where(Node.id.in_(list(changes)), Node.state == NodeState.UP))
    due = [n for n in rows if _due(n, now) and (not slurm or (n.wlm_state or "").startswith("drained"))]
    if not due:
        return []
    held = held_gpus(session, [n.id for n in due])
    declared = {node_id: {g.index: g.declared for g in found} for node_id, found in layouts(session, changes).items()}
    out = []
    for node in due:
        idle = sorted(changes[node.id] - held.get(node.id, set()))
        layouts_now = {i: declared[node.id][i] for i in idle if declared[node.id].get(i) is not None}
        if layouts_now:
            node.mig_sent_at = to_datetime(now)
            node.mig_answered = False
            out.append((node.id, MigApply(id=next(_ids), gpus={i: str(v) for i, v in layouts_now.items()})))
    return out


def _due(node: Node, now: float) -> bool:
    """Not asked yet, or asked long enough ago: RETRY_S after a refusal or no answer, SETTLE_S after an
    answer that said done (a GPU still off its layout then is asked again, but never in a tight loop)."""
    if node.mig_sent_at is None:
        return True
    wait = SETTLE_S if node.mig_answered and not node.mig_errors else RETRY_S
    return node.mig_sent_at <= to_datetime(now - wait)


def record_result(session: Session, clock: Clock, node_id: int, result: MigResult) -> None:
    """Store what the agent could not apply, and when it answered (the waits of `_due` count from there)."""
    node = session.get(Node, node_id)
    if node is None or node.mig_sent_at is None:
        return  # gone, or a new declaration since: this answer is to a request no longer wanted
    node.mig_errors = {str(index): reason for index, reason in sorted(result.errors.items())}
    node.mig_sent_at = to_datetime(clock.now())
    node.mig_answered = True
