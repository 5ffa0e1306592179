"""Slurm's word for one job, written onto its gpufleet row: the reason shown, GPUs held, times, the end.
Also the row for a job submitted to Slurm directly."""

from __future__ import annotations

from sqlalchemy.orm import Session

from gpufleet.core.clock import Clock, to_datetime
from gpufleet.jobs import lifecycle
from gpufleet.jobs.models import FINAL_STATES, Job, JobState
from gpufleet.jobs.slurm.queue import SlurmJob

BACKEND = "slurm"
SUBMITTED_BY_SLURM = "slurm"  # submitted_by of jobs submitted to Slurm directly


def allocation(current: dict[str, list[int]] | None, slurm: SlurmJob) -> dict[str, list[int]] | None:
    """Slurm lists a job's GPU indexes only while it runs: an ended job keeps those seen then."""
    if slurm.state != JobState.PENDING and slurm.nodes and (slurm.gpus or current is None):
        return {node: slurm.gpus.get(node, []) for node in slurm.nodes}
    return current


def reason(slurm: SlurmJob) -> str:
    if slurm.state == JobState.PENDING:
        return f"Slurm: {slurm.reason or 'pending'}"
    if slurm.state == JobState.RUNNING:
        return f"running in Slurm as job {slurm.slurm_name}" + (
            f" ({slurm.slurm_state.lower()})" if slurm.slurm_state != "RUNNING" else ""
        )
    return f"Slurm: {slurm.slurm_state.lower()}" + (f" ({slurm.reason})" if slurm.reason else "")


def apply(session: Session, clock: Clock, row: Job, slurm: SlurmJob) -> None:
    if slurm.partition:
        row.partition = slurm.partition[:64]
    if slurm.started_at is not None:
        row.started_at = slurm.started_at
    row.allocation = allocation(row.allocation, slurm)
    if slurm.state in FINAL_STATES:
        lifecycle.finish(session, clock, row, slurm.state, reason(slurm), slurm.exit_code)
        if slurm.ended_at is not None:
            row.ended_at = slurm.ended_at
        if row.started_at is not None and row.ended_at is not None:
            held = max(0.0, (row.ended_at - row.started_at).total_seconds())
            row.gpu_seconds = held * row.nodes * row.gpus_per_node
        return
    row.state = slurm.state
    row.reason = reason(slurm)[:512]


def imported(slurm: SlurmJob, projects: set[str], now: float) -> Job:
    """A row for a job submitted to Slurm directly."""
    return Job(
        name=slurm.name[:128],
        user=slurm.user[:32],
        project=slurm.account if slurm.account in projects else None,
        submitted_by=SUBMITTED_BY_SLURM,
        state=slurm.state,
        reason=reason(slurm)[:512],
        nodes=max(slurm.node_count, 1),
        gpus_per_node=slurm.gpus_per_node,
        time_limit_s=slurm.time_limit_s or 0.0,
        argv=[],
        env={},
        backend=BACKEND,
        external_id=slurm.slurm_name,
        partition=(slurm.partition or "")[:64] or None,
        submitted_at=slurm.submitted_at or to_datetime(now),
        started_at=slurm.started_at,
        ended_at=slurm.ended_at or (to_datetime(now) if slurm.state in FINAL_STATES else None),
        exit_code=slurm.exit_code,
        allocation={node: slurm.gpus.get(node, []) for node in slurm.nodes} if slurm.nodes else None,
    )
