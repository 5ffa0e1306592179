"""What runs on a node now: gpufleet's own job ranks and the Slurm jobs allocated there.

A workflow that takes a node (a burn-in step, a campaign's action) waits until nothing runs on it. Under
Slurm a drain lets running jobs go on, and Slurm's jobs have no ranks in gpufleet: they are read from the
mirrored queue (jobs.slurm.sync) and from Slurm's own word for the node (`wlm_state`), so a job Slurm
started after the last queue read still counts.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpufleet.inventory.models import Node
from gpufleet.jobs.models import Job, JobRank, JobState, RankState

# Slurm's base states of a node with work on it (jobs.slurm.nodes): "allocated", "mixed", "completing",
# also as "allocated+drain" (draining).
_SLURM_BUSY = ("alloc", "mix", "complet", "draining")


def slurm_busy(node: Node) -> bool:
    state = (node.wlm_state or "").lower()
    return any(word in state for word in _SLURM_BUSY)


def busy_jobs(session: Session, nodes: Sequence[Node]) -> dict[int, list[int]]:
    """The jobs running on each node, by node id: ranks that have not exited, and Slurm jobs allocated there."""
    ids = [n.id for n in nodes]
    out: dict[int, set[int]] = {}
    for start in range(0, len(ids), 500):
        chunk = ids[start : start + 500]
        rows = session.execute(
            select(JobRank.node_id, JobRank.job_id).where(JobRank.node_id.in_(chunk), JobRank.state != RankState.EXITED)
        )
        for node_id, job_id in rows:
            if node_id is not None:
                out.setdefault(node_id, set()).add(job_id)
    by_name = {n.name: n.id for n in nodes}
    slurm = session.execute(select(Job.id, Job.allocation).where(Job.state == JobState.RUNNING, Job.backend == "slurm"))
    for job_id, allocation in slurm:
        for name in (allocation or {}).keys() & by_name.keys():
            out.setdefault(by_name[name], set()).add(job_id)
    return {node_id: sorted(jobs_) for node_id, jobs_ in out.items()}
