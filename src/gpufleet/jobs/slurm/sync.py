"""One pass between gpufleet and Slurm: submit what waits, read back Slurm's jobs and nodes, cancel.

The leader runs `SlurmSync.once` every `slurm_poll_interval_s`, and at once after a submit or a cancel.
Slurm's programs run outside any database transaction (they take tens of milliseconds, or seconds when
slurmctld is slow); the pass writes what they said in one short transaction at the end.

1. Jobs submitted through gpufleet and not yet in Slurm (`backend = "slurm"`, no `external_id`) are
   found in `squeue` by their `--comment` (`queue.job_comment`: an earlier sbatch whose answer was lost) or
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
   wins (the manager's `changes` counter), so a stale read never undoes it (`node_mirror`; how Slurm's
   word lands on a job's row is `job_rows`).
5. Jobs cancelled in gpufleet that Slurm still runs or queues are `scancel`led.

Job arrays: an array's tasks still waiting to go to Slurm go as one `sbatch --array` (one submission of
the pass's MAX_SUBMITS_PER_PASS, however many tasks), and each task's row takes Slurm's name for it,
`<array>_<task>` (`queue.task_name`; gpufleet's task ids are Slurm's). A task Slurm has started is a record
of its own and updates its row as a job does; the tasks not yet started are one record, which keeps their
rows pending with its reason (one UPDATE, however many tasks) and stops them being taken for vanished.
Rows are read by name in chunks, and an array's unstarted tasks by the array (`array_job_id`): never one
bound parameter per task. A task cancelled in gpufleet is `scancel <array>_<task>`ed; an array whose every
task has ended in gpufleet while Slurm still holds some is `scancel <array>`ed whole. An array submitted to
Slurm directly is listed a row per record: a task by its name, the rest of the array by its first
unstarted task's (that row becomes that task when it starts), never a row per unstarted task.
"""

from __future__ import annotations

import logging
import os
import pwd
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar

from sqlalchemy import func, literal, select, update
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.auth.projects import Project
from gpufleet.core.clock import Clock
from gpufleet.core.db import transaction
from gpufleet.core.errors import GpufleetError, InvalidInput, Unavailable
from gpufleet.inventory.models import Gpu
from gpufleet.jobs import lifecycle
from gpufleet.jobs.models import FINAL_STATES, Job, JobState
from gpufleet.jobs.slurm import job_rows, node_mirror
from gpufleet.jobs.slurm.batch import BatchOptions, inventory_mig_types, job_environment, render_script, sbatch_argv
from gpufleet.jobs.slurm.config import mig_instances
from gpufleet.jobs.slurm.history import parse_sacct_end
from gpufleet.jobs.slurm.job_rows import BACKEND, SUBMITTED_BY_SLURM
from gpufleet.jobs.slurm.manager import SlurmWorkloadManager
from gpufleet.jobs.slurm.node_mirror import NodeRow
from gpufleet.jobs.slurm.queue import (
    SQUEUE_JSON,
    SlurmJob,
    job_comment,
    parse_squeue_json,
    split_task_name,
    task_name,
)

log = logging.getLogger(__name__)
MAX_SUBMITS_PER_PASS = 200  # sbatch runs (a job, or a whole array): a burst spreads over passes
CHUNK = 900  # ids or names per IN (...): under every SQLite build's bound-parameter limit
IDS_PER_COMMAND = 100  # jobs per sacct or scancel: one call for many tasks, a short command line
SUBMITTED = "submitted to Slurm as job "
_End = tuple[JobState, str, int | None, datetime | None]  # how a job Slurm no longer lists ended


def head_user() -> str:
    return pwd.getpwuid(os.geteuid()).pw_name


@dataclass
class SyncResult:
    submitted: dict[int, str] = field(default_factory=dict)  # gpufleet id → Slurm id (`<array>_<task>` for a task)
    arrays: dict[int, str] = field(default_factory=dict)  # gpufleet array id → Slurm array job id, submitted
    refused: dict[int, str] = field(default_factory=dict)  # gpufleet id → why
    updated: int = 0
    imported: int = 0
    cancelled: list[str] = field(default_factory=list)  # Slurm ids scancelled
    nodes: int = 0
    problem: str | None = None  # Slurm unreachable: what failed


@dataclass(frozen=True)
class _Pending:
    """One sbatch to run: a job, or the tasks of an array still waiting to go (`job_id` the first's row)."""

    job_id: int
    user: str
    submitted_at: datetime
    env: dict[str, str]
    script: str | None
    argv: list[str] | None
    refusal: str | None
    array_job_id: int | None = None
    tasks: dict[int, int] = field(default_factory=dict)  # an array's: task id → its row id

    @property
    def comment_id(self) -> int:
        """The id in its --comment=gpufleet:<id>:<stamp>."""
        return self.job_id if self.array_job_id is None else self.array_job_id

    @property
    def comment(self) -> str:
        """Its whole `--comment`, as `sbatch_argv` gave it from the same row."""
        return job_comment(self.comment_id, self.submitted_at)

    @property
    def rows(self) -> list[int]:
        return [self.job_id] if self.array_job_id is None else sorted(self.tasks.values())


@dataclass(frozen=True)
class _Row:
    """A Slurm job's row as the read phase saw it."""

    COLUMNS: ClassVar = (
        Job.id,
        Job.external_id,
        Job.state,
        Job.reason,
        Job.submitted_by,
        Job.submitted_at,
        Job.started_at,
        Job.allocation,
        Job.array_job_id,
    )

    id: int
    external_id: str | None  # never None here: read by Slurm id
    state: JobState
    reason: str
    submitted_by: str
    submitted_at: datetime
    started_at: datetime | None
    allocation: dict[str, list[int]] | None
    array_job_id: int | None


@dataclass(frozen=True)
class _Task:
    """A row of gpufleet's array that Slurm lists among the array's unstarted tasks."""

    id: int
    name: str
    state: JobState
    reason: str


@dataclass(frozen=True)
class _Seen:
    rows: dict[str, list[_Row]]  # by Slurm id, for the jobs Slurm lists
    unstarted: dict[str, list[_Task]]  # by Slurm array job id: gpufleet's rows of its unstarted tasks
    vanished: list[str]  # Slurm ids of active rows Slurm no longer lists
    cancelled_active: list[str]  # Slurm ids cancelled in gpufleet that Slurm still runs or queues
    nodes: list[NodeRow]
    projects: set[str]


@dataclass
class _Plan:
    """What Slurm's word changes in the jobs' rows."""

    updates: list[tuple[int, SlurmJob]] = field(default_factory=list)  # row id, Slurm's job
    imports: list[SlurmJob] = field(default_factory=list)  # jobs submitted to Slurm directly, new
    waiting: dict[str, list[int]] = field(default_factory=dict)  # pending reason → rows of unstarted tasks

    def __bool__(self) -> bool:
        return bool(self.updates or self.imports or self.waiting)


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
        listed = _by_comment(queue)
        for job in pending:
            self._submit(job, listed.get((job.comment, job.array_job_id is not None)), result)
            if result.problem:
                break
        seen = self._read(queue)
        plan = _plan_jobs(queue, seen, result)
        gone = self._accounted_ends(seen.vanished)
        node_updates = node_mirror.mirror(seen.nodes, nodes, self.clock.now())
        if result.submitted or result.refused or plan or gone or node_updates:
            with transaction(self.sessions) as session:
                self._record_submissions(session, result)
                result.updated = self._update_jobs(session, plan.updates) + _wait(session, plan.waiting)
                for slurm in plan.imports:
                    session.add(job_rows.imported(slurm, seen.projects, self.clock.now()))
                result.imported = len(plan.imports)
                self._end_vanished(session, gone)
                result.nodes = node_mirror.write(session, node_updates, same_drains=self.manager.changes == changes)
        self._scancel(seen.cancelled_active, result)
        return result

    def _scancel(self, names: list[str], result: SyncResult) -> None:
        for chunk in _chunks(names, IDS_PER_COMMAND):
            try:
                self.manager.commands.run(["scancel", *chunk])
                result.cancelled.extend(chunk)
            except GpufleetError as exc:
                log.warning("cannot cancel Slurm job(s) %s (next pass retries): %s", " ".join(chunk), exc)

    def _read(self, queue: list[SlurmJob]) -> _Seen:
        """What the pass compares Slurm's word with, in one read-only transaction."""
        listed = {j.slurm_name for j in queue}
        rests = {j.array_job_id: j for j in queue if j.array_job_id is not None and j.array_pending is not None}
        with transaction(self.sessions, readonly=True) as session:
            rows: list[_Row] = []
            for chunk in _chunks(sorted(listed), CHUNK):
                query = select(*_Row.COLUMNS).where(Job.backend == BACKEND, Job.external_id.in_(chunk))
                rows.extend(_Row(*row) for row in session.execute(query))
            unstarted = {
                array: tasks for array, rest in rests.items() if (tasks := _unstarted_rows(session, array, rest))
            }
            active = session.scalars(
                select(Job.external_id).where(
                    Job.backend == BACKEND, Job.external_id.is_not(None), Job.state.not_in(FINAL_STATES)
                )
            ).all()
            node_rows = [NodeRow(*row) for row in session.execute(select(*NodeRow.COLUMNS))]
            projects = set(session.scalars(select(Project.name)))
        by_id: dict[str, list[_Row]] = {}
        for row in rows:
            by_id.setdefault(row.external_id or "", []).append(row)
        live = {name for name in active if name is not None}
        vanished = sorted(name for name in live if name not in listed and not _unstarted(name, rests))
        cancelled = _to_cancel(queue, by_id, unstarted, live)
        return _Seen(by_id, unstarted, vanished, cancelled, node_rows, projects)

    # -- submit -------------------------------------------------------------------------------------
    def _unsubmitted(self) -> list[_Pending]:
        """The next MAX_SUBMITS_PER_PASS sbatch runs due, oldest first: a job each, or an array's waiting
        tasks together (never split over passes), as their first task's row with every task's id."""
        waiting = (Job.backend == BACKEND, Job.external_id.is_(None), Job.state == JobState.PENDING)
        unit = func.coalesce(Job.array_job_id, Job.id)  # an array's tasks go as one
        with transaction(self.sessions, readonly=True) as session:
            units = list(
                session.scalars(select(unit).where(*waiting).group_by(unit).order_by(unit).limit(MAX_SUBMITS_PER_PASS))
            )
            tasks: dict[int, dict[int, int]] = {}
            for row_id, array, task in session.execute(
                select(Job.id, Job.array_job_id, Job.array_task_id).where(*waiting, Job.array_job_id.in_(units))
            ):
                if array is not None and task is not None:  # always, for an array's rows
                    tasks.setdefault(array, {})[task] = row_id
            firsts = [min(ids.values()) for ids in tasks.values()]
            plain = [u for u in units if u not in tasks]
            jobs = session.scalars(select(Job).where(Job.id.in_(plain + firsts)).order_by(Job.id)).all()
            mig_types = _mig_types(session) if any(job.gpu_profile for job in jobs) else {}
            return [self._pending(job, tasks.get(job.array_job_id or 0, {}), mig_types) for job in jobs]

    def _pending(self, job: Job, tasks: dict[int, int], mig_types: dict[str, str]) -> _Pending:
        """The sbatch for `job` (an array's first waiting task, with all its array's waiting `tasks`)."""
        array = job.array_job_id
        try:
            argv = sbatch_argv(
                job, "SCRIPT", self.options, head_user=self.user, tasks=sorted(tasks), mig_types=mig_types
            )
            script = render_script(job)
        except InvalidInput as exc:
            return _Pending(job.id, job.user, job.submitted_at, {}, None, None, str(exc), array, tasks)
        return _Pending(job.id, job.user, job.submitted_at, job_environment(job), script, argv, None, array, tasks)

    def _submit(self, job: _Pending, listed: SlurmJob | None, result: SyncResult) -> None:
        if job.refusal is not None:
            result.refused.update(dict.fromkeys(job.rows, job.refusal))
            return
        if listed is not None and listed.user == job.user:
            _submitted(job, listed.array_job_id or listed.job_id, result)  # submitted before; sbatch's answer was lost
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
                result.refused.update(dict.fromkeys(job.rows, str(exc)))
                return
        slurm_id = out.strip().split(";", 1)[0]
        if not slurm_id.isdigit():
            why = f"Slurm: sbatch answered {out.strip()[:200]!r}, not a job id"
            result.refused.update(dict.fromkeys(job.rows, why))
            return
        _submitted(job, slurm_id, result)
        what = "job" if job.array_job_id is None else f"job array ({len(job.tasks)} tasks)"
        log.info("%s %s submitted to Slurm as job %s", what, job.comment_id, slurm_id)

    def _waiting(self, pending: Iterable[_Pending], problem: str) -> None:
        ids = sorted(row for p in pending for row in p.rows)
        if not ids:
            return
        with transaction(self.sessions) as session:
            for chunk in _chunks(ids, CHUNK):
                _lock(session, chunk)
                session.execute(
                    update(Job)
                    .where(Job.id.in_(chunk), Job.state == JobState.PENDING, Job.external_id.is_(None))
                    .values(reason=f"waiting for Slurm: {problem}"[:512]),
                    execution_options={"synchronize_session": False},
                )

    def _record_submissions(self, session: Session, result: SyncResult) -> None:
        """Each submitted row's Slurm id (set even on a row cancelled meanwhile: the next pass scancels it);
        by UPDATE statements, as an array's 10,000 tasks would be 10,000 objects to load."""
        for chunk in _chunks(sorted(result.submitted), CHUNK):
            _lock(session, chunk)
            session.execute(update(Job), [{"id": row, "external_id": result.submitted[row]} for row in chunk])
            session.execute(
                update(Job)
                .where(Job.id.in_(chunk), Job.state == JobState.PENDING)
                .values(reason=literal(SUBMITTED) + Job.external_id),
                execution_options={"synchronize_session": False},
            )
        for chunk in _chunks(sorted(result.refused), CHUNK):
            for job in lifecycle.lock_jobs(session, chunk).values():
                if job.state == JobState.PENDING:
                    lifecycle.finish(session, self.clock, job, JobState.FAILED, result.refused[job.id])

    # -- jobs ---------------------------------------------------------------------------------------
    def _accounted_ends(self, slurm_ids: list[str]) -> dict[str, _End]:
        """How each of these jobs ended, from sacct (which takes `1234` and a task's `1234_7` alike), asked
        IDS_PER_COMMAND at a time: an array's tasks may vanish by the thousand while the head was away."""
        gone: dict[str, _End] = {}
        for chunk in _chunks(slurm_ids, IDS_PER_COMMAND):
            try:
                out = self.manager.commands.run(
                    ["sacct", "-n", "-P", "-X", "-j", ",".join(chunk), "-o", "JobID,State,ExitCode,End"]
                )
            except GpufleetError as exc:
                out, detail = "", str(exc)
            else:
                detail = "sacct has no record of it"
            gone.update((slurm_id, _accounted_end(out, slurm_id, detail)) for slurm_id in chunk)
        return gone

    def _update_jobs(self, session: Session, updates: list[tuple[int, SlurmJob]]) -> int:
        """Apply Slurm's word to the rows the plan picked, re-read under lock: one cancelled meanwhile stays so."""
        applied = 0
        for chunk in _chunks(updates, CHUNK):
            jobs = lifecycle.lock_jobs(session, [job_id for job_id, _ in chunk])
            for job_id, slurm in chunk:
                row = jobs.get(job_id)
                if row is not None and row.state not in FINAL_STATES:
                    job_rows.apply(session, self.clock, row, slurm)
                    applied += 1
            session.flush()
        return applied

    def _end_vanished(self, session: Session, gone: dict[str, _End]) -> None:
        for chunk in _chunks(sorted(gone), CHUNK):
            for job in session.scalars(
                select(Job)
                .where(Job.backend == BACKEND, Job.external_id.in_(chunk), Job.state.not_in(FINAL_STATES))
                .order_by(Job.id)
                .with_for_update()
            ):
                state, reason, code, ended = gone[job.external_id or ""]
                lifecycle.finish(session, self.clock, job, state, reason, code)
                if ended is not None:
                    job.ended_at = ended


def _mig_types(session: Session) -> dict[str, str]:
    """The Slurm type of each MIG profile the inventory has instances of (`batch.inventory_mig_types`), from
    the GPUs in MIG mode: read once per pass, and only by a pass that submits a job of MIG instances."""
    columns = session.scalars(select(Gpu.mig).where(Gpu.mig_mode == "enabled"))
    return inventory_mig_types(instance for column in columns for instance in mig_instances(column))


def _match(rows: list[_Row], slurm: SlurmJob) -> _Row | None:
    """The row for this Slurm job. Job ids restart after a clean slurmctld start, so an id alone is not
    enough: a gpufleet job's row is the one the comment names (an array task's: a task of the array it
    names), a direct one's the one submitted then."""
    for row in rows:
        if slurm.gpufleet_id is not None and slurm.gpufleet_id == _comment_id(row, slurm):
            return row
        if row.submitted_by == SUBMITTED_BY_SLURM and (
            slurm.submitted_at is None or row.submitted_at == slurm.submitted_at
        ):
            return row
    return None


def _comment_id(row: _Row, slurm: SlurmJob) -> int | None:
    return row.array_job_id if slurm.array_job_id is not None else row.id


def _by_comment(queue: list[SlurmJob]) -> dict[tuple[str, bool], SlurmJob]:
    """gpufleet's jobs in Slurm by (their whole comment, whether an array): where an sbatch whose answer was
    lost is found. The comment's stamp, not Slurm's submit time, tells this row's sbatch from another
    database's job with the same id: one submitted in the same second was once taken for it, and the row
    followed that job to its end without ever running. Any record of an array names the array."""
    return {(j.comment or "", j.array_job_id is not None): j for j in queue if j.gpufleet_id is not None}


def _submitted(job: _Pending, slurm_id: str, result: SyncResult) -> None:
    """Note `job` submitted as Slurm job `slurm_id`: each of an array's tasks as `<slurm_id>_<task>`."""
    if job.array_job_id is None:
        result.submitted[job.job_id] = slurm_id
        return
    result.arrays[job.array_job_id] = slurm_id
    result.submitted.update((row, task_name(slurm_id, task)) for task, row in job.tasks.items())


def _unstarted_rows(session: Session, array: str, rest: SlurmJob) -> list[_Task]:
    """gpufleet's rows of the tasks Slurm's record `rest` stands for (Slurm array `array`, not yet started):
    read by the gpufleet array its comment names, pending ones and those cancelled (for scancel) only."""
    if rest.gpufleet_id is None:
        return []
    query = select(Job.id, Job.external_id, Job.state, Job.reason).where(
        Job.array_job_id == rest.gpufleet_id,
        Job.backend == BACKEND,
        Job.external_id.is_not(None),
        Job.state.in_((JobState.PENDING, JobState.CANCELLED)),
    )
    tasks = []
    for row_id, name, state, reason in session.execute(query):
        parts = split_task_name(name or "")
        if parts is not None and parts[0] == array and rest.stands_for(parts[1]):
            tasks.append(_Task(row_id, name or "", state, reason))
    return tasks


def _unstarted(name: str, rests: dict[str, SlurmJob]) -> bool:
    """Whether `name` is a task Slurm still lists among its array's unstarted tasks."""
    parts = split_task_name(name)
    rest = rests.get(parts[0]) if parts is not None else None
    return rest is not None and parts is not None and rest.stands_for(parts[1])


def _to_cancel(
    queue: list[SlurmJob], rows: dict[str, list[_Row]], unstarted: dict[str, list[_Task]], live: set[str]
) -> list[str]:
    """What to scancel: each job or task cancelled in gpufleet that Slurm still runs or queues, by its name;
    a gpufleet array none of whose tasks is still live in gpufleet, by the array's id (one scancel for all)."""
    names: list[str] = []
    for slurm in queue:
        if slurm.state in FINAL_STATES:
            continue
        if slurm.array_pending is not None and slurm.array_job_id in unstarted:
            names.extend(t.name for t in unstarted[slurm.array_job_id] if t.state == JobState.CANCELLED)
            continue
        mine = _match(rows.get(slurm.slurm_name, []), slurm)
        if mine is not None and mine.state == JobState.CANCELLED:
            names.append(slurm.slurm_name)
    live_arrays = {_array_of(name) for name in live}
    whole = {_array_of(name) for name in names} & {a for a in unstarted if a not in live_arrays}
    return sorted(a for a in whole if a is not None) + [name for name in names if _array_of(name) not in whole]


def _array_of(name: str) -> str | None:
    parts = split_task_name(name)
    return parts[0] if parts is not None else None


def _plan_jobs(queue: list[SlurmJob], seen: _Seen, result: SyncResult) -> _Plan:
    """The rows Slurm's word changes (with Slurm's job), the pending reasons of an array's unstarted tasks,
    and the jobs to list anew (submitted to Slurm directly). Rows already ended are not changed; nor are the
    jobs this pass just submitted, whose rows learn their Slurm id in this pass's write."""
    plan = _Plan()
    for slurm in queue:
        if slurm.array_pending is not None and slurm.array_job_id in seen.unstarted:
            _plan_unstarted(slurm, seen.unstarted[slurm.array_job_id], plan)
            continue
        row = _match(seen.rows.get(slurm.slurm_name, []), slurm)
        if row is None:
            if _importable(slurm, result):
                plan.imports.append(slurm)
        elif row.state not in FINAL_STATES and _differs(row, slurm):
            plan.updates.append((row.id, slurm))
    return plan


def _plan_unstarted(rest: SlurmJob, tasks: list[_Task], plan: _Plan) -> None:
    """Pending unstarted tasks take the record's reason (one UPDATE for all); ended ones (an array cancelled
    in Slurm before they started) end as a job does."""
    pending = [t for t in tasks if t.state == JobState.PENDING]
    if rest.state in FINAL_STATES:
        plan.updates.extend((t.id, rest) for t in pending)
        return
    reason = job_rows.reason(rest)[:512]
    changed = [t.id for t in pending if t.reason != reason]
    if changed:
        plan.waiting.setdefault(reason, []).extend(changed)


def _importable(slurm: SlurmJob, result: SyncResult) -> bool:
    """A job Slurm lists that no row stands for: submitted to Slurm directly, unless this pass found it as
    an sbatch whose answer was lost. The rest of an array whose tasks cannot be read is left out."""
    if slurm.array_pending is not None and slurm.first_pending is None:
        return False
    ours = result.arrays if slurm.array_job_id is not None else result.submitted
    return slurm.gpufleet_id is None or slurm.gpufleet_id not in ours


def _wait(session: Session, waiting: dict[str, list[int]]) -> int:
    """Set the pending reason on rows of an array's unstarted tasks still pending, by UPDATE statements."""
    changed = 0
    for reason, ids in waiting.items():
        for chunk in _chunks(sorted(ids), CHUNK):
            _lock(session, chunk)
            done = session.execute(
                update(Job).where(Job.id.in_(chunk), Job.state == JobState.PENDING).values(reason=reason),
                execution_options={"synchronize_session": False},
            )
            changed += int(getattr(done, "rowcount", 0) or 0)
    return changed


def _lock(session: Session, ids: list[int]) -> None:
    """Lock these rows in id order (as `lifecycle.lock_jobs` does, without loading them) before an UPDATE:
    a cancel of the whole array locks them in that order too, and so never waits on this in a cycle."""
    session.execute(select(Job.id).where(Job.id.in_(ids)).order_by(Job.id).with_for_update()).all()


def _chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _accounted_end(out: str, slurm_id: str, detail: str) -> _End:
    found = parse_sacct_end(out, slurm_id)
    if found is None:
        return (
            JobState.FAILED,
            f"Slurm job {slurm_id} left Slurm's queue unseen and its end is unknown ({detail[:300]})",
            None,
            None,
        )
    state, word, code, ended = found
    return state, f"Slurm: {word} (from sacct)", code, ended


def _differs(row: _Row, slurm: SlurmJob) -> bool:
    if slurm.state in FINAL_STATES or (row.state, row.reason) != (slurm.state, job_rows.reason(slurm)[:512]):
        return True
    if slurm.started_at is not None and row.started_at != slurm.started_at:
        return True
    return job_rows.allocation(row.allocation, slurm) != row.allocation
