"""Job arrays against the database: submit (every task in one bulk insert, its variables, refusals that
write nothing), the throttle over scheduler passes, cancel (whole and per task, and by whom), and the
list with an array's pending tasks collapsed into one row or expanded."""

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from pydantic import ValidationError
from sqlalchemy import Engine, event, func, select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.core.clock import FakeClock
from gpufleet.core.db import transaction
from gpufleet.core.errors import Conflict, Forbidden, InvalidInput, NotFound
from gpufleet.jobs import dispatch, lifecycle, queries, submission
from gpufleet.jobs.models import Job, JobState
from gpufleet.jobs.schemas import MAX_COMMAND_BYTES, JobSubmit, ServiceCreate
from gpufleet.jobs.tick import plan
from gpufleet.protocol.jobs import MAX_ENV
from tests.jobs.helpers import (
    ADMIN,
    LIMITS,
    TICK,
    as_user,
    cluster,
    job,
    node_id,
    project,
    ranks,
    report,
    submit,
    tick,
    users,
)

THROTTLED = "array throttle: 3 of the array's tasks run at once (%3)"


@pytest.fixture
def setup(sessions: sessionmaker[Session], clock: FakeClock) -> sessionmaker[Session]:
    cluster(sessions, clock, nodes=2, gpus=8)
    users(sessions, clock, "alice", "bob")
    project(sessions, clock, "vision", "alice")
    return sessions


def _tasks(sessions: sessionmaker[Session], array_job_id: int) -> list[Job]:
    with transaction(sessions, readonly=True) as s:
        found = list(s.scalars(select(Job).where(Job.array_job_id == array_job_id).order_by(Job.array_task_id)))
        s.expunge_all()
        return found


def _count_jobs(sessions: sessionmaker[Session]) -> int:
    with transaction(sessions, readonly=True) as s:
        return s.scalar(select(func.count()).select_from(Job)) or 0


@contextmanager
def _statements(engine: Engine) -> Iterator[list[tuple[str, int]]]:
    """Each statement the engine runs while inside: its SQL's first words and how many rows of
    parameters it carried (executemany)."""
    seen: list[tuple[str, int]] = []

    def record(_conn: Any, _cursor: Any, statement: str, parameters: Any, _context: Any, many: bool) -> None:
        seen.append((" ".join(statement.split()[:3]), len(parameters) if many else 1))

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", record)


def test_an_array_is_queued_in_one_bulk_insert_each_task_with_its_variables(
    setup: sessionmaker[Session], clock: FakeClock, engine: Engine
) -> None:
    with _statements(engine) as seen:
        first = submit(setup, clock, as_user("alice"), array="0-12:4,100%3", env={"LR": "0.1"})
    inserts = [(sql, rows) for sql, rows in seen if sql.startswith("INSERT INTO jobs")]
    # The first task alone (its id is the array's job id), then the others in one statement; on
    # PostgreSQL the driver may page an executemany, but never a statement per task.
    assert len(inserts) <= 2
    assert sum(rows for _, rows in inserts) == 5
    tasks = _tasks(setup, first)
    assert [t.array_task_id for t in tasks] == [0, 4, 8, 12, 100]
    assert tasks[0].id == first
    assert all(t.array_job_id == first and t.array_throttle == 3 for t in tasks)
    assert all(t.state is JobState.PENDING and t.user == "alice" and t.project == "vision" for t in tasks)
    for task in tasks:
        assert task.env == {
            "LR": "0.1",
            "GPUFLEET_ARRAY_JOB_ID": str(first),
            "GPUFLEET_ARRAY_TASK_ID": str(task.array_task_id),
            "GPUFLEET_ARRAY_TASK_COUNT": "5",
            "GPUFLEET_ARRAY_TASK_MIN": "0",
            "GPUFLEET_ARRAY_TASK_MAX": "100",
        }
    with transaction(setup, readonly=True) as s:
        shown = queries.job_detail(s, lifecycle.get_job(s, tasks[2].id), reveal=True)
    assert (shown.array_job_id, shown.array_task_id, shown.array_tasks, shown.array_throttle) == (first, 8, 5, 3)


def test_a_plain_job_has_no_array_fields(setup: sessionmaker[Session], clock: FakeClock) -> None:
    plain = job(setup, submit(setup, clock))
    assert (plain.array_job_id, plain.array_task_id, plain.array_throttle) == (None, None, None)
    assert not any(name.startswith("GPUFLEET_ARRAY") for name in plain.env)


def test_an_array_is_all_or_nothing_in_its_transaction(setup: sessionmaker[Session], clock: FakeClock) -> None:
    with pytest.raises(RuntimeError), transaction(setup) as s:
        spec = JobSubmit(argv=["train"], array="0-99")
        submission.submit(s, clock, as_user("alice"), spec, LIMITS)
        raise RuntimeError("the route failed after the submit")
    assert _count_jobs(setup) == 0


def _just_under_the_byte_limit() -> dict[str, Any]:
    """A command and environment 50 bytes under the limit, which the array's variables then pass."""
    spec: dict[str, Any] = {"argv": ["x" * 4000] * 10, "script": None, "env": {"PAD": ""}}
    spec["env"]["PAD"] = "y" * (MAX_COMMAND_BYTES - 50 - len(json.dumps(spec).encode()))
    JobSubmit(**{k: v for k, v in spec.items() if v is not None})  # valid alone
    return {"argv": spec["argv"], "env": spec["env"]}


@pytest.mark.parametrize(
    ("who", "spec", "error", "match"),
    [
        (as_user("alice"), {"array": "9-0"}, InvalidInput, "backwards"),
        (as_user("alice"), {"array": "0-200000"}, InvalidInput, "at most 100000"),
        (as_user("alice"), {"array": "0-9", "gpus_per_node": 9}, InvalidInput, "largest has 8"),
        (as_user("bob"), {"array": "0-9", "project": "vision"}, Forbidden, "not a member"),
        (as_user("alice"), {"array": "0-9", "user": "bob"}, Forbidden, "another user"),
        (as_user("alice"), {"array": "0-9", "model": "nope"}, NotFound, "nope"),
        (
            as_user("alice"),
            {"array": "0-9", "env": {f"V{i}": "x" for i in range(MAX_ENV - 4)}},
            InvalidInput,
            "5 more",
        ),
        (as_user("alice"), {"array": "0-9", **_just_under_the_byte_limit()}, InvalidInput, "array's variables exceed"),
    ],
)
def test_refusals_write_nothing(
    setup: sessionmaker[Session], clock: FakeClock, who: Any, spec: dict[str, Any], error: type, match: str
) -> None:
    with pytest.raises(error, match=match):
        submit(setup, clock, who, **spec)
    assert _count_jobs(setup) == 0


def test_under_slurm_an_array_queues_its_tasks_for_the_slurm_sync(
    setup: sessionmaker[Session], clock: FakeClock
) -> None:
    """The tasks wait, unsubmitted, for the Slurm sync to hand them to one sbatch --array
    (tests/slurm/test_slurm_arrays.py runs that against a real Slurm)."""
    with transaction(setup) as s:
        spec = JobSubmit(argv=["x"], user="alice", array="0-3%2")
        first = submission.submit(s, clock, ADMIN, spec, LIMITS, backend="slurm").id
    tasks = _tasks(setup, first)
    assert [(t.array_task_id, t.array_throttle, t.backend, t.external_id) for t in tasks] == [
        (i, 2, "slurm", None) for i in range(4)
    ]
    assert {t.state for t in tasks} == {JobState.PENDING}
    assert {t.reason for t in tasks} == {"submitted: waiting to go to Slurm"}
    assert [t.env["GPUFLEET_ARRAY_TASK_ID"] for t in tasks] == ["0", "1", "2", "3"]


def test_a_throttled_array_never_runs_more_than_n_tasks_as_they_end(
    setup: sessionmaker[Session], clock: FakeClock
) -> None:
    first = submit(setup, clock, array="0-9%3", gpus_per_node=1)
    other = submit(setup, clock, gpus_per_node=1)  # a job beside the array is not held back by it
    done: list[int] = []
    for _ in range(6):
        tick(setup, clock)
        tasks = _tasks(setup, first)
        running = [t for t in tasks if t.state is JobState.RUNNING]
        assert len(running) == min(3, 10 - len(done))
        # Lowest task ids first: the ones running are the lowest not yet done.
        assert [t.array_task_id for t in running] == sorted(t.array_task_id for t in tasks if t.id not in done)[:3]
        assert {t.reason for t in tasks if t.state is JobState.PENDING} <= {THROTTLED}
        for task in running[:2]:  # two end each round
            report(setup, clock, task.id)
            done.append(task.id)
        clock.advance(1)
    assert job(setup, other).state is JobState.RUNNING
    while len(done) < 10:
        tick(setup, clock)
        for task in [t for t in _tasks(setup, first) if t.state is JobState.RUNNING]:
            report(setup, clock, task.id)
            done.append(task.id)
    assert all(t.state is JobState.COMPLETED for t in _tasks(setup, first))


def test_the_throttle_reason_is_written_once(setup: sessionmaker[Session], clock: FakeClock) -> None:
    first = submit(setup, clock, array="0-4%3", gpus_per_node=1)
    tick(setup, clock)
    held = [t for t in _tasks(setup, first) if t.state is JobState.PENDING]
    assert [t.reason for t in held] == [THROTTLED, THROTTLED]
    with transaction(setup, readonly=True) as s:
        assert plan(s, clock, TICK).reasons == {}  # unchanged reasons are not written again


def test_an_unthrottled_array_is_scheduled_like_jobs(setup: sessionmaker[Session], clock: FakeClock) -> None:
    first = submit(setup, clock, array="0-19", gpus_per_node=1)
    placed = tick(setup, clock).placed
    assert len(placed) == 16  # every GPU of the two nodes
    waiting = [t for t in _tasks(setup, first) if t.state is JobState.PENDING]
    assert len(waiting) == 4
    assert all(t.reason.startswith("resources") for t in waiting)


def test_cancel_a_whole_array_by_its_user_or_a_job_admin(setup: sessionmaker[Session], clock: FakeClock) -> None:
    first = submit(setup, clock, as_user("alice"), array="0-5%2", gpus_per_node=1)
    tick(setup, clock)
    running = [t.id for t in _tasks(setup, first) if t.state is JobState.RUNNING]
    with transaction(setup) as s:
        dispatch.outgoing(s, clock, [node_id(setup, "n1"), node_id(setup, "n2")])  # the starts go out
    report(setup, clock, running[0])  # task 0 completes
    with pytest.raises(Forbidden, match="belongs to alice"), transaction(setup) as s:
        lifecycle.cancel_array(s, clock, first, "user:bob", user="bob", admin=False)
    assert len([t for t in _tasks(setup, first) if t.state is JobState.PENDING]) == 4
    with transaction(setup) as s:
        ended = lifecycle.cancel_array(s, clock, first, "user:alice", user="alice", admin=False)
    assert len(ended) == 5  # all but the task that had completed
    tasks = _tasks(setup, first)
    assert [t.state for t in tasks] == [JobState.COMPLETED] + [JobState.CANCELLED] * 5
    assert all(t.reason == "cancelled by user:alice" and t.ended_at is not None for t in tasks[1:])
    # The running task's rank is told to stop; the pending ones never start.
    assert [r.cancel for r in ranks(setup, running[1])] == ["job cancelled"]
    tick(setup, clock)
    assert all(ranks(setup, t.id) == [] for t in tasks[2:])
    with pytest.raises(Conflict, match="already ended"), transaction(setup) as s:
        lifecycle.cancel_array(s, clock, first, "token:admin", user=None, admin=True)
    with pytest.raises(NotFound, match="no such job array"), transaction(setup) as s:
        lifecycle.cancel_array(s, clock, first + 1000, "token:admin", user=None, admin=True)


def test_a_job_admin_cancels_anyones_array(setup: sessionmaker[Session], clock: FakeClock) -> None:
    first = submit(setup, clock, as_user("alice"), array="0-2")
    with transaction(setup) as s:
        assert len(lifecycle.cancel_array(s, clock, first, "token:admin", user=None, admin=True)) == 3


def test_cancel_one_task_leaves_the_others(setup: sessionmaker[Session], clock: FakeClock) -> None:
    first = submit(setup, clock, as_user("alice"), array="0-3")
    third = _tasks(setup, first)[2].id
    with transaction(setup) as s:
        lifecycle.cancel(s, clock, third, "user:alice", user="alice", admin=False)
    assert [t.state for t in _tasks(setup, first)] == [JobState.PENDING] * 2 + [JobState.CANCELLED, JobState.PENDING]


def _listed(sessions: sessionmaker[Session], **kwargs: Any) -> list[tuple[int, str, str | None, int | None]]:
    with transaction(sessions, readonly=True) as s:
        rows = queries.list_job_rows(s, **kwargs)
    return [(r.id, r.state.value, r.array_pending, r.array_pending_count) for r in rows]


def test_the_list_collapses_an_arrays_pending_tasks_into_one_row(
    setup: sessionmaker[Session], clock: FakeClock
) -> None:
    before = submit(setup, clock, gpus_per_node=1)
    first = submit(setup, clock, array="0-9%2", gpus_per_node=1)
    after = submit(setup, clock, gpus_per_node=8, nodes=2)  # waits: the array's tasks hold GPUs
    tick(setup, clock)
    ids = [t.id for t in _tasks(setup, first)]
    assert _listed(setup) == [
        (ids[1], "running", None, None),
        (ids[0], "running", None, None),
        (before, "running", None, None),
        (after, "pending", None, None),
        (ids[2], "pending", "2-9", 8),
    ]
    with transaction(setup, readonly=True) as s:
        row = queries.list_job_rows(s, states=[JobState.PENDING])[1]
    assert (row.array_job_id, row.array_task_id, row.array_tasks, row.array_throttle) == (first, 2, 10, 2)
    # Paging works on the list as shown.
    assert [r[0] for r in _listed(setup, limit=2, offset=3)] == [after, ids[2]]
    # Expanded: every task, as any job.
    expanded = _listed(setup, expand=True)
    assert len(expanded) == 12
    assert all(pending is None for _, _, pending, _ in expanded)
    # One array, and one task of it.
    assert [r[0] for r in _listed(setup, array_job_id=first)] == [ids[1], ids[0], *reversed(ids[2:])]
    assert [r[0] for r in _listed(setup, array_job_id=first, array_task_id=7)] == [ids[7]]
    # A task cancelled alone leaves a gap in the pending ids.
    with transaction(setup) as s:
        lifecycle.cancel(s, clock, ids[5], "token:admin", user=None, admin=True)
    assert (ids[2], "pending", "2-4,6-9", 7) in _listed(setup)


def test_two_arrays_and_filters_collapse_apart(setup: sessionmaker[Session], clock: FakeClock) -> None:
    mine = submit(setup, clock, as_user("alice"), array="1,3,5-7", gpus_per_node=8, nodes=2)
    theirs = submit(setup, clock, as_user("bob"), array="0-2", gpus_per_node=8, nodes=2)
    assert _listed(setup, states=[JobState.PENDING]) == [(theirs, "pending", "0-2", 3), (mine, "pending", "1,3,5-7", 5)]
    assert _listed(setup, user="bob") == [(theirs, "pending", "0-2", 3)]
    assert _listed(setup, states=[JobState.RUNNING]) == []


def test_a_service_replica_is_never_an_array() -> None:
    with pytest.raises(ValidationError, match="not a job array"):
        ServiceCreate(name="embed", replica=JobSubmit(argv=["serve"], array="0-3"))
