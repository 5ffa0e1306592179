"""One pass between gpufleet and Slurm: submit what waits, read back Slurm's jobs and nodes, cancel.

The leader runs `SlurmSync.once` every `slurm_poll_interval_s`, and at once after a submit or a cancel.
Slurm's programs run outside any database transaction (they take tens of milliseconds, or seconds when
slurmctld is slow); the pass writes what they said in one short transaction at the end.

1. Jobs submitted through gpufleet and not yet in Slurm (`backend = "slurm"`, no `external_id`) are
   found in `squeue` by their `--comment=gpufleet:<id>` (an earlier sbatch whose answer was lost) or
   submitted with `sbatch`. Slurm refusing one fails it with Slurm's message; Slurm unreachable leaves it
   pending, saying so, for the next pass.
2. Every job Slurm lists updates its row: state, Slurm's pending reason, nodes and GPU indexes, times,
   exit code. Jobs submitted to Slurm directly are listed too (`submitted_by = "slurm"`, the Slurm
   account as project when a gpufleet project has that name). A row in a final state is never changed:
   gpufleet's cancel is final even while Slurm is still killing the job.
3. A row still active that Slurm no longer lists (it ended more than MinJobAge ago, while the head was
   away) is ended from `sacct` where accounting answers, else failed with a reason that says so.
4. Slurm's node states are mirrored onto the node rows (`wlm_state`), and so are its drains: a drain
   set in Slurm by a person shows as drained by "slurm:<user>" (and so is never resumed by gpufleet), a
   drain lifted in Slurm is lifted on the row. A drain or resume made through gpufleet during the pass
   wins (the manager's `changes` counter), so a stale read never undoes it.
5. Jobs cancelled in gpufleet that Slurm still runs or queues are `scancel`led.
"""

from __future__ import annotations

import logging
import os
import pwd
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.auth.projects import Project
from gpufleet.core.clock import Clock, to_datetime
from gpufleet.core.db import transaction
from gpufleet.core.errors import GpufleetError, InvalidInput, Unavailable
from gpufleet.inventory.models import Node
from gpufleet.jobs import lifecycle
from gpufleet.jobs.models import FINAL_STATES, Job, JobState
from gpufleet.jobs.slurm.batch import BatchOptions, job_environment, render_script, sbatch_argv
from gpufleet.jobs.slurm.history import parse_sacct_end
from gpufleet.jobs.slurm.manager import FOREIGN_ACTOR_PREFIX, SlurmWorkloadManager
from gpufleet.jobs.slurm.nodes import SlurmNode
from gpufleet.jobs.slurm.queue import SQUEUE_JSON, SlurmJob, parse_squeue_json

log = logging.getLogger(__name__)
BACKEND = "slurm"
SUBMITTED_BY_SLURM = "slurm"  # submitted_by of jobs submitted to Slurm directly
MAX_SUBMITS_PER_PASS = 200  # a burst of submissions spreads over passes rather than stalling one
_End = tuple[JobState, str, int | None, datetime | None]  # how a job Slurm no longer lists ended


def head_user() -> str:
    return pwd.getpwuid(os.geteuid()).pw_name


@dataclass
class SyncResult:
    submitted: dict[int, str] = field(default_factory=dict)  # gpufleet id → Slurm id
    refused: dict[int, str] = field(default_factory=dict)  # gpufleet id → why
    updated: int = 0
    imported: int = 0
    cancelled: list[str] = field(default_factory=list)  # Slurm ids scancelled
    nodes: int = 0
    problem: str | None = None  # Slurm unreachable: what failed


@dataclass(frozen=True)
class _Pending:
    job_id: int
    user: str
    submitted_at: datetime
    env: dict[str, str]
    script: str | None
    argv: list[str] | None
    refusal: str | None


@dataclass
class SlurmSync:
    sessions: sessionmaker[Session]
    clock: Clock
    manager: SlurmWorkloadManager
    options: BatchOptions = field(default_factory=BatchOptions)
    user: str = field(default_factory=head_user)

    def once(self) -> SyncResult:
        """One pass. Raises nothing for Slurm being unreachable (`problem` says it); database errors propagate."""
        result = SyncResult()
        pending = self._unsubmitted()
        changes = self.manager.changes
        try:
            queue = parse_squeue_json(self.manager.commands.run(list(SQUEUE_JSON)), now=self.clock.now())
            nodes = self.manager.node_states()
        except GpufleetError as exc:
            result.problem = str(exc)
            self._waiting(pending, str(exc))
            return result
        listed = {j.gpufleet_id: j for j in queue if j.gpufleet_id is not None}
        for job in pending:
            self._submit(job, listed.get(job.job_id), result)
            if result.problem:
                break
        gone = self._gone(queue)
        with transaction(self.sessions) as session:
            self._record_submissions(session, result)
            self._update_jobs(session, queue, result)
            self._end_vanished(session, gone)
            result.nodes = self._mirror_nodes(session, nodes, same_drains=self.manager.changes == changes)
            to_cancel = self._cancelled_but_active(session, queue)
        for slurm_id in to_cancel:
            try:
                self.manager.commands.run(["scancel", slurm_id])
                result.cancelled.append(slurm_id)
            except GpufleetError as exc:
                log.warning("cannot cancel Slurm job %s (next pass retries): %s", slurm_id, exc)
        return result

    # -- submit -------------------------------------------------------------------------------------
    def _unsubmitted(self) -> list[_Pending]:
        with transaction(self.sessions, readonly=True) as session:
            jobs = session.scalars(
                select(Job)
                .where(Job.backend == BACKEND, Job.external_id.is_(None), Job.state == JobState.PENDING)
                .order_by(Job.id)
                .limit(MAX_SUBMITS_PER_PASS)
            ).all()
            pending = []
            for job in jobs:
                try:
                    argv = sbatch_argv(job, "SCRIPT", self.options, head_user=self.user)
                    pending.append(
                        _Pending(
                            job.id, job.user, job.submitted_at, job_environment(job), render_script(job), argv, None
                        )
                    )
                except InvalidInput as exc:
                    pending.append(_Pending(job.id, job.user, job.submitted_at, {}, None, None, str(exc)))
            return pending

    def _submit(self, job: _Pending, listed: SlurmJob | None, result: SyncResult) -> None:
        if job.refusal is not None:
            result.refused[job.job_id] = job.refusal
            return
        if listed is not None and listed.user == job.user and _not_before(listed.submitted_at, job.submitted_at):
            result.submitted[job.job_id] = listed.job_id  # submitted before; sbatch's answer was lost
            return
        if job.argv is None or job.script is None:  # only with a refusal, handled above
            return
        with tempfile.NamedTemporaryFile("w", prefix=f"gpufleet-job{job.job_id}-", suffix=".sh") as script:
            script.write(job.script)
            script.flush()
            os.chmod(script.name, 0o644)  # sbatch reads it as the head's user; the content is copied at submit
            argv = [script.name if a == "SCRIPT" else a for a in job.argv]
            try:
                out = self.manager.commands.run(argv, extra_env=job.env)
            except Unavailable as exc:
                result.problem = str(exc)
                return
            except InvalidInput as exc:
                result.refused[job.job_id] = str(exc)
                return
        slurm_id = out.strip().split(";", 1)[0]
        if not slurm_id.isdigit():
            result.refused[job.job_id] = f"Slurm: sbatch answered {out.strip()[:200]!r}, not a job id"
            return
        result.submitted[job.job_id] = slurm_id
        log.info("job %s submitted to Slurm as job %s", job.job_id, slurm_id)

    def _waiting(self, pending: Iterable[_Pending], problem: str) -> None:
        ids = [p.job_id for p in pending]
        if not ids:
            return
        with transaction(self.sessions) as session:
            for job in lifecycle.lock_jobs(session, ids).values():
                if job.state == JobState.PENDING and job.external_id is None:
                    job.reason = f"waiting for Slurm: {problem}"[:512]

    def _record_submissions(self, session: Session, result: SyncResult) -> None:
        jobs = lifecycle.lock_jobs(session, [*result.submitted, *result.refused])
        for job_id, slurm_id in result.submitted.items():
            job = jobs.get(job_id)
            if job is None:
                continue
            job.external_id = slurm_id
            if job.state == JobState.PENDING:
                job.reason = f"submitted to Slurm as job {slurm_id}"
        for job_id, why in result.refused.items():
            job = jobs.get(job_id)
            if job is not None and job.state == JobState.PENDING:
                lifecycle.finish(session, self.clock, job, JobState.FAILED, why)

    # -- jobs ---------------------------------------------------------------------------------------
    def _gone(self, queue: list[SlurmJob]) -> dict[str, _End]:
        """Active rows Slurm no longer lists, with their end from sacct where accounting answers."""
        listed = {j.job_id for j in queue}
        with transaction(self.sessions, readonly=True) as session:
            active = session.scalars(
                select(Job.external_id).where(
                    Job.backend == BACKEND, Job.external_id.is_not(None), Job.state.not_in(FINAL_STATES)
                )
            ).all()
        gone: dict[str, _End] = {}
        for slurm_id in active:
            if slurm_id is None or slurm_id in listed:
                continue
            gone[slurm_id] = self._accounted_end(slurm_id)
        return gone

    def _accounted_end(self, slurm_id: str) -> _End:
        try:
            out = self.manager.commands.run(
                ["sacct", "-n", "-P", "-X", "-j", slurm_id, "-o", "JobID,State,ExitCode,End"]
            )
            found = parse_sacct_end(out, slurm_id)
        except GpufleetError as exc:
            found = None
            detail = str(exc)
        else:
            detail = "sacct has no record of it"
        if found is None:
            return (
                JobState.FAILED,
                f"Slurm job {slurm_id} left Slurm's queue unseen and its end is unknown ({detail[:300]})",
                None,
                None,
            )
        state, word, code, ended = found
        return state, f"Slurm: {word} (from sacct)", code, ended

    def _update_jobs(self, session: Session, queue: list[SlurmJob], result: SyncResult) -> None:
        if not queue:
            return
        rows: dict[str, list[Job]] = {}
        for job in session.scalars(
            select(Job).where(Job.backend == BACKEND, Job.external_id.in_([j.job_id for j in queue]))
        ):
            rows.setdefault(job.external_id or "", []).append(job)
        projects = set(session.scalars(select(Project.name)))
        for slurm in queue:
            row = _match(rows.get(slurm.job_id, []), slurm)
            if row is None:
                if slurm.gpufleet_id is not None and slurm.gpufleet_id in result.submitted:
                    continue  # recorded above, in this transaction; read again next pass
                session.add(_imported(slurm, projects, self.clock.now()))
                result.imported += 1
            elif row.state not in FINAL_STATES:
                _apply(session, self.clock, row, slurm)
                result.updated += 1
        session.flush()

    def _end_vanished(self, session: Session, gone: dict[str, _End]) -> None:
        if not gone:
            return
        for job in session.scalars(
            select(Job).where(Job.backend == BACKEND, Job.external_id.in_(list(gone)), Job.state.not_in(FINAL_STATES))
        ):
            state, reason, code, ended = gone[job.external_id or ""]
            lifecycle.finish(session, self.clock, job, state, reason, code)
            if ended is not None:
                job.ended_at = ended

    def _cancelled_but_active(self, session: Session, queue: list[SlurmJob]) -> list[str]:
        active = {j.job_id for j in queue if j.state not in FINAL_STATES}
        if not active:
            return []
        return [
            slurm_id
            for slurm_id in session.scalars(
                select(Job.external_id).where(
                    Job.backend == BACKEND, Job.external_id.in_(active), Job.state == JobState.CANCELLED
                )
            )
            if slurm_id is not None
        ]

    # -- nodes --------------------------------------------------------------------------------------
    def _mirror_nodes(self, session: Session, nodes: list[SlurmNode], *, same_drains: bool) -> int:
        by_name = {n.name: n for n in nodes}
        now = self.clock.now()
        mirrored = 0
        for row in session.scalars(select(Node)):
            slurm = by_name.get(row.name)
            state = slurm.display_state[:32] if slurm else None
            if row.wlm_state != state:
                row.wlm_state = state
            if slurm is None or not same_drains:
                continue  # not a Slurm node; or a drain changed through gpufleet while Slurm was read
            mirrored += 1
            held = slurm.drain or (slurm.state == "down" and slurm.reason is not None)
            if held and slurm.reason and row.drain_reason != slurm.reason:
                row.drained_at = to_datetime(slurm.reason_at.timestamp() if slurm.reason_at else now)
                row.drain_reason = slurm.reason[:512]
                row.drained_by = (
                    "gpufleet" if slurm.own_drain else f"{FOREIGN_ACTOR_PREFIX}{slurm.reason_user or 'unknown'}"
                )[:128]
            elif not held and row.drained_at is not None:
                row.drained_at = None  # lifted in Slurm (scontrol ... state=resume): Slurm is the truth
                row.drain_reason = None
                row.drained_by = None
        session.flush()
        return mirrored


def _not_before(slurm_time: datetime | None, row_time: datetime) -> bool:
    """Whether Slurm's submit time can be that of this row's sbatch: not before the row existed. A job
    with the same comment submitted earlier belongs to another gpufleet database (or one since reset).
    Slurm's times are whole seconds, hence the second's slack."""
    return slurm_time is not None and slurm_time.timestamp() >= row_time.timestamp() - 1.0


def _match(rows: list[Job], slurm: SlurmJob) -> Job | None:
    """The row for this Slurm job. Job ids restart after a clean slurmctld start, so an id alone is not
    enough: a gpufleet job's row is the one the comment names, a direct one's the one submitted then."""
    for row in rows:
        if slurm.gpufleet_id is not None and row.id == slurm.gpufleet_id:
            return row
        if row.submitted_by == SUBMITTED_BY_SLURM and (
            slurm.submitted_at is None or row.submitted_at == slurm.submitted_at
        ):
            return row
    return None


def _reason(slurm: SlurmJob) -> str:
    if slurm.state == JobState.PENDING:
        return f"Slurm: {slurm.reason or 'pending'}"
    if slurm.state == JobState.RUNNING:
        return f"running in Slurm as job {slurm.job_id}" + (
            f" ({slurm.slurm_state.lower()})" if slurm.slurm_state != "RUNNING" else ""
        )
    return f"Slurm: {slurm.slurm_state.lower()}" + (f" ({slurm.reason})" if slurm.reason else "")


def _apply(session: Session, clock: Clock, row: Job, slurm: SlurmJob) -> None:
    if slurm.partition:
        row.partition = slurm.partition[:64]
    if slurm.started_at is not None:
        row.started_at = slurm.started_at
    if slurm.state != JobState.PENDING and slurm.nodes and (slurm.gpus or row.allocation is None):
        # Slurm lists a job's GPU indexes only while it runs: an ended job keeps those seen then.
        row.allocation = {node: slurm.gpus.get(node, []) for node in slurm.nodes}
    if slurm.state in FINAL_STATES:
        lifecycle.finish(session, clock, row, slurm.state, _reason(slurm), slurm.exit_code)
        if slurm.ended_at is not None:
            row.ended_at = slurm.ended_at
        if row.started_at is not None and row.ended_at is not None:
            held = max(0.0, (row.ended_at - row.started_at).total_seconds())
            row.gpu_seconds = held * row.nodes * row.gpus_per_node
        return
    row.state = slurm.state
    row.reason = _reason(slurm)[:512]


def _imported(slurm: SlurmJob, projects: set[str], now: float) -> Job:
    """A row for a job submitted to Slurm directly."""
    return Job(
        name=slurm.name[:128],
        user=slurm.user[:32],
        project=slurm.account if slurm.account in projects else None,
        submitted_by=SUBMITTED_BY_SLURM,
        state=slurm.state,
        reason=_reason(slurm)[:512],
        nodes=max(slurm.node_count, 1),
        gpus_per_node=slurm.gpus_per_node,
        time_limit_s=slurm.time_limit_s or 0.0,
        argv=[],
        env={},
        backend=BACKEND,
        external_id=slurm.job_id,
        partition=(slurm.partition or "")[:64] or None,
        submitted_at=slurm.submitted_at or to_datetime(now),
        started_at=slurm.started_at,
        ended_at=slurm.ended_at or (to_datetime(now) if slurm.state in FINAL_STATES else None),
        exit_code=slurm.exit_code,
        allocation={node: slurm.gpus.get(node, []) for node in slurm.nodes} if slurm.nodes else None,
    )
