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
from typing import Any, ClassVar

from sqlalchemy import select, update
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


@dataclass(frozen=True)
class _Row:
    """A Slurm job's row as the read phase saw it."""

    id: int
    external_id: str | None  # never None here: read by Slurm id
    state: JobState
    reason: str
    submitted_by: str
    submitted_at: datetime
    started_at: datetime | None
    allocation: dict[str, list[int]] | None


@dataclass(frozen=True)
class _NodeRow:
    COLUMNS: ClassVar = (Node.id, Node.name, Node.wlm_state, Node.drained_at, Node.drain_reason, Node.drained_by)

    id: int
    name: str
    wlm_state: str | None
    drained_at: datetime | None
    drain_reason: str | None
    drained_by: str | None


@dataclass(frozen=True)
class _Seen:
    rows: dict[str, list[_Row]]  # by Slurm id, for the jobs Slurm lists
    vanished: list[str]  # Slurm ids of active rows Slurm no longer lists
    cancelled_active: list[str]  # Slurm ids cancelled in gpufleet that Slurm still runs or queues
    nodes: list[_NodeRow]
    projects: set[str]


@dataclass
class SlurmSync:
    sessions: sessionmaker[Session]
    clock: Clock
    manager: SlurmWorkloadManager
    options: BatchOptions = field(default_factory=BatchOptions)
    user: str = field(default_factory=head_user)

    def once(self) -> SyncResult:
        """One pass. Raises nothing for Slurm being unreachable (`problem` says it); database errors propagate.

        It reads the database in read-only transactions and writes (one short transaction, with only the
        rows that change) only when Slurm said something new: on SQLite a write transaction holds the one
        write lock, which the health pass needs to drain a node at once.
        """
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
        seen = self._read(queue)
        updates, imports = _plan_jobs(queue, seen, result)
        gone = {slurm_id: self._accounted_end(slurm_id) for slurm_id in seen.vanished}
        node_updates = _mirror(seen.nodes, nodes, self.clock.now())
        if result.submitted or result.refused or updates or imports or gone or node_updates:
            with transaction(self.sessions) as session:
                self._record_submissions(session, result)
                result.updated = self._update_jobs(session, updates)
                for slurm in imports:
                    session.add(_imported(slurm, seen.projects, self.clock.now()))
                result.imported = len(imports)
                self._end_vanished(session, gone)
                result.nodes = self._write_nodes(session, node_updates, same_drains=self.manager.changes == changes)
        for slurm_id in seen.cancelled_active:
            try:
                self.manager.commands.run(["scancel", slurm_id])
                result.cancelled.append(slurm_id)
            except GpufleetError as exc:
                log.warning("cannot cancel Slurm job %s (next pass retries): %s", slurm_id, exc)
        return result

    def _read(self, queue: list[SlurmJob]) -> _Seen:
        """What the pass compares Slurm's word with, in one read-only transaction."""
        listed = {j.job_id for j in queue}
        with transaction(self.sessions, readonly=True) as session:
            rows = [
                _Row(*row)
                for row in session.execute(
                    select(
                        Job.id,
                        Job.external_id,
                        Job.state,
                        Job.reason,
                        Job.submitted_by,
                        Job.submitted_at,
                        Job.started_at,
                        Job.allocation,
                    ).where(Job.backend == BACKEND, Job.external_id.in_(list(listed)))
                )
            ]
            active = session.scalars(
                select(Job.external_id).where(
                    Job.backend == BACKEND, Job.external_id.is_not(None), Job.state.not_in(FINAL_STATES)
                )
            ).all()
            node_rows = [_NodeRow(*row) for row in session.execute(select(*_NodeRow.COLUMNS))]
            projects = set(session.scalars(select(Project.name)))
        by_id: dict[str, list[_Row]] = {}
        for row in rows:
            by_id.setdefault(row.external_id or "", []).append(row)
        cancelled_active = []
        for slurm in queue:
            mine = _match(by_id.get(slurm.job_id, []), slurm)
            if mine is not None and mine.state == JobState.CANCELLED and slurm.state not in FINAL_STATES:
                cancelled_active.append(slurm.job_id)
        vanished = sorted(slurm_id for slurm_id in active if slurm_id is not None and slurm_id not in listed)
        return _Seen(by_id, vanished, cancelled_active, node_rows, projects)

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

    def _update_jobs(self, session: Session, updates: list[tuple[int, SlurmJob]]) -> int:
        """Apply Slurm's word to the rows the plan picked, re-read under lock: one cancelled meanwhile stays so."""
        jobs = lifecycle.lock_jobs(session, [job_id for job_id, _ in updates])
        applied = 0
        for job_id, slurm in updates:
            row = jobs.get(job_id)
            if row is not None and row.state not in FINAL_STATES:
                _apply(session, self.clock, row, slurm)
                applied += 1
        session.flush()
        return applied

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

    def _write_nodes(self, session: Session, updates: list[dict[str, Any]], *, same_drains: bool) -> int:
        """Each changed node row by its primary key. A drain or resume made through gpufleet while Slurm was
        being read wins: the drain columns are then left for the next pass."""
        if not same_drains:
            updates = [{k: v for k, v in u.items() if k in ("id", "wlm_state")} for u in updates]
            updates = [u for u in updates if len(u) > 1]
        if updates:
            session.execute(update(Node), updates)
        return len(updates)


def _not_before(slurm_time: datetime | None, row_time: datetime) -> bool:
    """Whether Slurm's submit time can be that of this row's sbatch: not before the row existed. A job
    with the same comment submitted earlier belongs to another gpufleet database (or one since reset).
    Slurm's times are whole seconds, hence the second's slack."""
    return slurm_time is not None and slurm_time.timestamp() >= row_time.timestamp() - 1.0


def _match(rows: list[_Row], slurm: SlurmJob) -> _Row | None:
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


def _plan_jobs(
    queue: list[SlurmJob], seen: _Seen, result: SyncResult
) -> tuple[list[tuple[int, SlurmJob]], list[SlurmJob]]:
    """(row id, Slurm's job) for the rows Slurm's word changes, and the jobs to list anew (submitted to
    Slurm directly). Rows already ended are not changed; nor are the jobs this pass just submitted, whose
    rows learn their Slurm id in this pass's write."""
    updates: list[tuple[int, SlurmJob]] = []
    imports: list[SlurmJob] = []
    for slurm in queue:
        row = _match(seen.rows.get(slurm.job_id, []), slurm)
        if row is None:
            if slurm.gpufleet_id is None or slurm.gpufleet_id not in result.submitted:
                imports.append(slurm)
        elif row.state not in FINAL_STATES and _differs(row, slurm):
            updates.append((row.id, slurm))
    return updates, imports


def _differs(row: _Row, slurm: SlurmJob) -> bool:
    if slurm.state in FINAL_STATES or (row.state, row.reason) != (slurm.state, _reason(slurm)[:512]):
        return True
    if slurm.started_at is not None and row.started_at != slurm.started_at:
        return True
    return _allocation(row.allocation, slurm) != row.allocation


def _allocation(current: dict[str, list[int]] | None, slurm: SlurmJob) -> dict[str, list[int]] | None:
    """Slurm lists a job's GPU indexes only while it runs: an ended job keeps those seen then."""
    if slurm.state != JobState.PENDING and slurm.nodes and (slurm.gpus or current is None):
        return {node: slurm.gpus.get(node, []) for node in slurm.nodes}
    return current


def _mirror(rows: list[_NodeRow], nodes: list[SlurmNode], now: float) -> list[dict[str, Any]]:
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
    row.allocation = _allocation(row.allocation, slurm)
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
