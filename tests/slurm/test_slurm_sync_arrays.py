"""The Slurm sync and job arrays against a scripted Slurm whose squeue records are the ones captured from
Slurm 22.05.8 (tests/fixtures/slurm/squeue-json-array.json), renumbered: one sbatch per array, however
many tasks, each row named `<array>_<task>`, the unstarted tasks kept pending (not taken for vanished),
cancel by task or by array, sacct asked once for many vanished tasks, and an array of more tasks than
SQLite's default bound-parameter limit (32,766) read and written without hitting it.

tests/slurm/test_slurm_jobs.py runs the same against the real Slurm (with its MaxArraySize of 1001)."""

from __future__ import annotations

import copy
import json
import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from sqlalchemy import Engine, event, func, select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.core.clock import FakeClock
from gpufleet.core.db import transaction
from gpufleet.jobs import lifecycle, submission
from gpufleet.jobs.models import Job, JobState
from gpufleet.jobs.schemas import JobSubmit
from gpufleet.jobs.slurm.batch import BatchOptions
from gpufleet.jobs.slurm.commands import Completed, SlurmCommands
from gpufleet.jobs.slurm.manager import SlurmWorkloadManager
from gpufleet.jobs.slurm.queue import job_comment
from gpufleet.jobs.slurm.sync import MAX_SUBMITS_PER_PASS, SlurmSync
from tests.conftest import FIXTURES
from tests.jobs.helpers import ADMIN, LIMITS, cluster, users

SLURM = FIXTURES / "slurm"
ARRAY = "77"  # the Slurm array job id the scripted sbatch answers
SQLITE_DEFAULT_MAX_VARIABLES = 32_766  # SQLite's own default; Debian builds raise it to 250,000


def _captured() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The captured document, a running task's record and the record of the unstarted rest."""
    document = json.loads((SLURM / "squeue-json-array.json").read_text())
    by_state = {j["job_state"]: j for j in document["jobs"]}
    return document, by_state["RUNNING"], by_state["PENDING"]


class ScriptedSlurm:
    """sbatch answers ARRAY; squeue lists `records`; sinfo the captured idle node; sacct `sacct`."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self.sacct = ""
        self.calls: list[list[str]] = []
        self.document, self.running, self.rest = _captured()

    def __call__(self, argv: Sequence[str], *, env: Mapping[str, str], timeout_s: float) -> Completed:
        self.calls.append(list(argv))
        if argv[0] == "squeue":
            return Completed(tuple(argv), 0, json.dumps(self.document | {"jobs": self.records}), "")
        if argv[0] == "sinfo":
            return Completed(tuple(argv), 0, (SLURM / "sinfo-json-idle.json").read_text(), "")
        if argv[0] == "sbatch":
            return Completed(tuple(argv), 0, f"{ARRAY}\n", "")
        if argv[0] == "sacct":
            return Completed(tuple(argv), 0, self.sacct, "")
        return Completed(tuple(argv), 0, "", "")

    def calls_of(self, program: str) -> list[list[str]]:
        return [c for c in self.calls if c[0] == program]

    def task(self, comment: int | str, task: int, job_id: int, submitted: float) -> dict[str, Any]:
        """The captured running task's record, as task `task` of ARRAY (`comment`: the whole comment, or the
        gpufleet id of one in the form without a stamp)."""
        record = copy.deepcopy(self.running)
        record.update(
            job_id=job_id, array_job_id=int(ARRAY), array_task_id=task, comment=_comment(comment), user_name="alice"
        )
        record["submit_time"] = int(submitted)
        return record

    def unstarted(self, comment: int | str, tasks: str, submitted: float, state: str = "PENDING") -> dict[str, Any]:
        """The captured record of the unstarted rest, standing for `tasks` of ARRAY."""
        record = copy.deepcopy(self.rest)
        record.update(
            job_id=int(ARRAY),
            array_job_id=int(ARRAY),
            array_task_string=tasks,
            comment=_comment(comment),
            user_name="alice",
            job_state=state,
        )
        record["submit_time"] = int(submitted)
        return record


def _comment(comment: int | str) -> str:
    return comment if isinstance(comment, str) else f"gpufleet:{comment}"


def comment_of(sessions: sessionmaker[Session], first: int) -> str:
    """The comment gpufleet gives the sbatch of the array whose first task's row is `first`."""
    with transaction(sessions, readonly=True) as s:
        return job_comment(first, s.get_one(Job, first).submitted_at)


@pytest.fixture
def limited(engine: Engine) -> Engine:
    """The test database with SQLite's default bound-parameter limit, whatever this build's is."""

    @event.listens_for(engine, "connect")
    def _limit(connection: Any, _record: Any) -> None:
        if isinstance(connection, sqlite3.Connection):
            connection.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, SQLITE_DEFAULT_MAX_VARIABLES)

    engine.dispose()  # connections opened before now had the build's limit
    return engine


@pytest.fixture
def slurm() -> ScriptedSlurm:
    return ScriptedSlurm()


@pytest.fixture
def sync(limited: Engine, sessions: sessionmaker[Session], clock: FakeClock, slurm: ScriptedSlurm) -> SlurmSync:
    cluster(sessions, clock, nodes=1, gpus=4)
    users(sessions, clock, "alice")
    manager = SlurmWorkloadManager(SlurmCommands("/x/slurm.conf", runner=slurm), clock)
    return SlurmSync(sessions, clock, manager, BatchOptions(run_as_others=True), user="root")


def submit_array(sessions: sessionmaker[Session], clock: FakeClock, spec: str) -> int:
    with transaction(sessions) as s:
        job = JobSubmit(argv=["sh", "-c", "echo $GPUFLEET_ARRAY_TASK_ID"], user="alice", array=spec, gpus_per_node=1)
        return submission.submit(s, clock, ADMIN, job, LIMITS, backend="slurm").id


def tasks(sessions: sessionmaker[Session], first: int) -> list[Job]:
    with transaction(sessions, readonly=True) as s:
        found = list(s.scalars(select(Job).where(Job.array_job_id == first).order_by(Job.array_task_id)))
        s.expunge_all()
        return found


def counts(sessions: sessionmaker[Session], first: int) -> dict[tuple[JobState, str], int]:
    """How many of the array's rows are in each (state, reason)."""
    with transaction(sessions, readonly=True) as s:
        rows = s.execute(
            select(Job.state, Job.reason, func.count()).where(Job.array_job_id == first).group_by(Job.state, Job.reason)
        )
        return {(state, reason): n for state, reason, n in rows}


def test_an_array_larger_than_sqlites_parameter_limit_is_one_sbatch_and_stays_pending(
    sync: SlurmSync, slurm: ScriptedSlurm, sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    size = 40_000  # over SQLITE_DEFAULT_MAX_VARIABLES: an IN (...) of every task's name would fail
    first = submit_array(sessions, clock, f"0-{size - 1}%50")
    result = sync.once()
    assert result.problem is None
    (sbatch,) = slurm.calls_of("sbatch")
    assert f"--array=0-{size - 1}%50" in sbatch
    assert f"--comment={comment_of(sessions, first)}" in sbatch
    assert result.arrays == {first: ARRAY}
    assert len(result.submitted) == size
    rows = tasks(sessions, first)
    assert all(t.external_id == f"{ARRAY}_{t.array_task_id}" for t in rows)
    assert rows[7].reason == f"submitted to Slurm as job {ARRAY}_7"

    # Slurm starts tasks 0 and 1 (records of their own); 2-39999 are one record, held by the throttle.
    submitted = clock.now() + 1
    slurm.records = [slurm.task(first, 0, 78, submitted), slurm.task(first, 1, 79, submitted)]
    slurm.records.append(slurm.unstarted(first, f"2-{size - 1}%50", submitted))
    second = sync.once()
    assert second.problem is None
    assert slurm.calls_of("sbatch") == [sbatch]  # nothing submitted twice
    assert slurm.calls_of("sacct") == []  # no task taken for one that left Slurm unseen
    assert counts(sessions, first) == {
        (JobState.RUNNING, f"running in Slurm as job {ARRAY}_0"): 1,
        (JobState.RUNNING, f"running in Slurm as job {ARRAY}_1"): 1,
        (JobState.PENDING, "Slurm: JobArrayTaskLimit"): size - 2,
    }
    assert tasks(sessions, first)[1].allocation == {"sim001": []}  # the captured task holds no GPU
    third = sync.once()  # Slurm said nothing new: nothing written
    assert (third.updated, third.imported, third.cancelled) == (0, 0, [])

    # Cancelling the whole array in gpufleet is one scancel of the array in Slurm.
    with transaction(sessions) as s:
        lifecycle.cancel_array(s, clock, first, "user:alice", user="alice", admin=False)
    assert sync.once().cancelled == [ARRAY]
    assert slurm.calls_of("scancel") == [["scancel", ARRAY]]


def test_a_task_cancelled_alone_is_scancelled_by_its_name(
    sync: SlurmSync, slurm: ScriptedSlurm, sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    first = submit_array(sessions, clock, "0-5")
    sync.once()
    rows = tasks(sessions, first)
    submitted = clock.now() + 1
    slurm.records = [slurm.task(first, 0, 78, submitted), slurm.unstarted(first, "1-5", submitted)]
    with transaction(sessions) as s:
        for row in (rows[0], rows[3]):  # a running task and one not started
            lifecycle.cancel(s, clock, row.id, "user:alice", user="alice", admin=False)
    assert sorted(sync.once().cancelled) == [f"{ARRAY}_0", f"{ARRAY}_3"]
    states = [t.state for t in tasks(sessions, first)]
    assert [i for i, state in enumerate(states) if state == JobState.CANCELLED] == [0, 3]
    assert states.count(JobState.PENDING) == 4


def test_tasks_gone_unseen_are_ended_from_one_sacct_and_the_rest_wait(
    sync: SlurmSync, slurm: ScriptedSlurm, sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    first = submit_array(sessions, clock, "0-5")
    sync.once()
    # Tasks 0 and 1 ended while the head was away (Slurm forgot them); 2-5 have not started.
    slurm.records = [slurm.unstarted(first, "2-5", clock.now() + 1)]
    slurm.sacct = f"{ARRAY}_0|COMPLETED|0:0|2026-11-30T09:32:00\n{ARRAY}_1|FAILED|4:0|2026-11-30T09:32:05\n"
    sync.once()
    assert slurm.calls_of("sacct") == [
        ["sacct", "-n", "-P", "-X", "-j", f"{ARRAY}_0,{ARRAY}_1", "-o", "JobID,State,ExitCode,End"]
    ]
    ended = [(t.state, t.exit_code) for t in tasks(sessions, first)]
    assert ended == [(JobState.COMPLETED, 0), (JobState.FAILED, 4), *[(JobState.PENDING, None)] * 4]


def test_an_array_cancelled_in_slurm_before_it_started_ends_its_tasks(
    sync: SlurmSync, slurm: ScriptedSlurm, sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    first = submit_array(sessions, clock, "0-3")
    sync.once()
    slurm.records = [slurm.unstarted(first, "0-3", clock.now() + 1, state="CANCELLED")]
    sync.once()
    assert {(t.state, t.reason) for t in tasks(sessions, first)} == {
        (JobState.CANCELLED, "Slurm: cancelled (JobArrayTaskLimit)")  # Slurm keeps the reason it pended for
    }
    assert slurm.calls_of("scancel") == []


def test_a_lost_sbatch_answer_is_found_by_the_arrays_comment(
    sync: SlurmSync, slurm: ScriptedSlurm, sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    first = submit_array(sessions, clock, "0-3")
    submitted, comment = clock.now() + 1, comment_of(sessions, first)
    slurm.records = [slurm.task(comment, 0, 78, submitted), slurm.unstarted(comment, "1-3", submitted)]
    result = sync.once()
    assert slurm.calls_of("sbatch") == []
    assert result.arrays == {first: ARRAY}
    assert result.imported == 0  # gpufleet's own array, not one submitted to Slurm directly
    assert [t.external_id for t in tasks(sessions, first)] == [f"{ARRAY}_{i}" for i in range(4)]


@pytest.mark.parametrize("other", ["gpufleet:{first}:1", "gpufleet:{first}"], ids=["another-stamp", "no-stamp"])
def test_another_databases_array_with_the_same_id_is_never_taken_for_this_one(
    sync: SlurmSync, slurm: ScriptedSlurm, sessions: sessionmaker[Session], clock: FakeClock, other: str
) -> None:
    """A second head on this Slurm, or this one before its database was reset, submitted its job 1 in the same
    second: that job is not this row's lost sbatch. Taken for it, the row once followed the other job to its end
    and never ran (tests/slurm/test_slurm_jobs.py in CI)."""
    first = submit_array(sessions, clock, "4,9")
    theirs = other.format(first=first)
    slurm.records = [slurm.task(theirs, 4, 78, clock.now()), slurm.task(theirs, 9, 79, clock.now())]
    for record in slurm.records:
        record["job_state"] = "COMPLETED"
    result = sync.once()
    (sbatch,) = slurm.calls_of("sbatch")
    assert f"--comment={comment_of(sessions, first)}" in sbatch
    assert result.arrays == {first: ARRAY}
    assert {t.state for t in tasks(sessions, first)} == {JobState.PENDING}


def test_the_submit_limit_counts_arrays_and_never_splits_one(
    sync: SlurmSync, slurm: ScriptedSlurm, sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    first = submit_array(sessions, clock, f"0-{MAX_SUBMITS_PER_PASS * 2}")
    with transaction(sessions) as s:
        for _ in range(MAX_SUBMITS_PER_PASS):
            spec = JobSubmit(argv=["true"], user="alice", gpus_per_node=1)
            submission.submit(s, clock, ADMIN, spec, LIMITS, backend="slurm")
    result = sync.once()
    assert len(slurm.calls_of("sbatch")) == MAX_SUBMITS_PER_PASS  # the array and 199 jobs
    assert len(result.arrays) == 1
    assert all(t.external_id is not None for t in tasks(sessions, first))


def test_an_array_submitted_to_slurm_directly_is_a_row_per_record(
    sync: SlurmSync, slurm: ScriptedSlurm, sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    submitted = clock.now() + 1
    running, rest = slurm.task(0, 0, 78, submitted), slurm.unstarted(0, "1-3999", submitted)
    running["comment"] = rest["comment"] = ""
    slurm.records = [running, rest]
    assert sync.once().imported == 2  # not a row per unstarted task

    def imported() -> list[tuple[str | None, JobState]]:
        with transaction(sessions, readonly=True) as s:
            return [(j.external_id, j.state) for j in s.scalars(select(Job).order_by(Job.id))]

    # The rest is named by its first task, whose row it becomes when that task starts.
    assert imported() == [(f"{ARRAY}_0", JobState.RUNNING), (f"{ARRAY}_1", JobState.PENDING)]
    task_1 = copy.deepcopy(running) | {"job_id": 80, "array_task_id": 1}
    rest["array_task_string"] = "2-3999"
    slurm.records = [running, task_1, rest]
    assert sync.once().imported == 1
    assert imported() == [
        (f"{ARRAY}_0", JobState.RUNNING),
        (f"{ARRAY}_1", JobState.RUNNING),
        (f"{ARRAY}_2", JobState.PENDING),
    ]
    assert slurm.calls_of("sacct") == []
