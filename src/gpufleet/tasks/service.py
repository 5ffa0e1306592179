"""Tasks in the database: created by the request that asks for a slow action, updated by the head that runs it.

A slow action over many nodes (bulk power, image sync, a package install, an Ansible run) must not hold an
HTTP request open: the request creates a task and returns it, a `TaskRunner` thread does the work and
records each target's result as it lands, and anyone can follow it with `GET /api/v1/tasks/{id}`.
Functions here take a session and never commit.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from gpufleet.core.clock import Clock, to_datetime
from gpufleet.core.errors import Conflict, InvalidInput, NotFound
from gpufleet.tasks.models import Task, TaskTarget

QUEUED, RUNNING, SUCCEEDED, FAILED, INTERRUPTED = "queued", "running", "succeeded", "failed", "interrupted"
FINISHED_STATES = frozenset({SUCCEEDED, FAILED, INTERRUPTED})
PENDING, OK, SKIPPED = "pending", "ok", "skipped"  # target states, with RUNNING and FAILED
DETAIL_LIMIT = 4000  # a target's detail is the tail of a program's output, not all of it


class Superseded(Conflict):
    """The task is no longer running here: another head marked it interrupted when its heartbeats stopped
    (a stalled head, not a dead one), and may have started its work again as a new task."""


def create(
    session: Session,
    clock: Clock,
    *,
    kind: str,
    targets: Sequence[str],
    params: dict[str, Any],
    created_by: str,
) -> Task:
    """A queued task over `targets` (in the order given; each at most once). Raises InvalidInput on duplicates."""
    if len(set(targets)) != len(targets):
        raise InvalidInput("a task names each target once")
    task = Task(
        kind=kind,
        state=QUEUED,
        params=params,
        created_by=created_by,
        created_at=to_datetime(clock.now()),
        total=len(targets),
        done=0,
        failed=0,
        targets=[TaskTarget(position=i, target=t, state=PENDING, detail="") for i, t in enumerate(targets)],
    )
    session.add(task)
    session.flush()
    return task


def get(session: Session, task_id: int) -> Task:
    task = session.get(Task, task_id)
    if task is None:
        raise NotFound(f"no task {task_id}")
    return task


def list_tasks(session: Session, *, kind: str | None = None, limit: int = 50) -> list[Task]:
    """The newest tasks first; `kind` matches exactly or as a prefix ending in '.' ("power." for every power task)."""
    query = select(Task).order_by(Task.id.desc()).limit(limit)
    if kind:
        query = query.where(Task.kind.startswith(kind) if kind.endswith(".") else Task.kind == kind)
    return list(session.scalars(query))


def mark_running(session: Session, clock: Clock, task_id: int) -> None:
    now = to_datetime(clock.now())
    session.execute(update(Task).where(Task.id == task_id).values(state=RUNNING, started_at=now, heartbeat_at=now))


def still_ours(session: Session, task_id: int, target: str) -> None:
    """Raises Superseded when the task has ended elsewhere: the head that runs it was taken for dead, so it
    must not act on another target (the fence that keeps a stalled head, once it wakes, from rebooting a
    node a second time beside the retry)."""
    state = session.scalar(select(Task.state).where(Task.id == task_id))
    if state is None or state in FINISHED_STATES:
        raise Superseded(f"task {task_id} is {state or 'gone'}: another head took its work over; {target} left alone")


def target_running(session: Session, clock: Clock, task_id: int, target: str) -> None:
    session.execute(
        update(TaskTarget)
        .where(TaskTarget.task_id == task_id, TaskTarget.target == target)
        .values(state=RUNNING, started_at=to_datetime(clock.now()))
    )


def target_finished(
    session: Session,
    clock: Clock,
    task_id: int,
    target: str,
    *,
    state: str,
    detail: str,
    data: dict[str, Any] | None,
) -> None:
    """Record one target's result and count it on the task, in one statement each so concurrent
    targets never lose a count. A target already finished keeps its first result."""
    done = session.execute(
        update(TaskTarget)
        .where(
            TaskTarget.task_id == task_id,
            TaskTarget.target == target,
            TaskTarget.state.in_((PENDING, RUNNING)),
        )
        .values(state=state, detail=detail[-DETAIL_LIMIT:], data=data, finished_at=to_datetime(clock.now()))
    )
    if getattr(done, "rowcount", 0) != 1:
        return
    session.execute(
        update(Task)
        .where(Task.id == task_id)
        .values(
            done=Task.done + 1,
            failed=Task.failed + (1 if state == FAILED else 0),
            heartbeat_at=to_datetime(clock.now()),
        )
    )


def finish(session: Session, clock: Clock, task_id: int, *, error: str | None, summary: str | None) -> str:
    """End the task: failed if the work raised or any target failed, else succeeded. Targets never
    reached (the work stopped early) are marked skipped. Returns the final state; a task interrupted
    meanwhile (`supersede`, `interrupt_stale`) stays interrupted."""
    task = get(session, task_id)
    if task.state == INTERRUPTED:
        return INTERRUPTED
    now = to_datetime(clock.now())
    for target in task.targets:
        if target.state in (PENDING, RUNNING):
            target.state = SKIPPED if target.state == PENDING else FAILED
            target.detail = target.detail or ("not reached" if target.state == SKIPPED else "interrupted")
            target.finished_at = now
            task.done += 1
            task.failed += 1 if target.state == FAILED else 0
    task.state = FAILED if error or task.failed else SUCCEEDED
    task.summary = (error or summary or _default_summary(task))[:1024]
    task.finished_at = now
    return task.state


def _default_summary(task: Task) -> str:
    ok = sum(1 for t in task.targets if t.state == OK)
    skipped = sum(1 for t in task.targets if t.state == SKIPPED)
    parts = [f"{ok} ok", f"{task.failed} failed"] + ([f"{skipped} skipped"] if skipped else [])
    return ", ".join(parts)


def heartbeat(session: Session, clock: Clock, task_ids: Sequence[int]) -> None:
    if task_ids:
        session.execute(update(Task).where(Task.id.in_(task_ids)).values(heartbeat_at=to_datetime(clock.now())))


def interrupt_stale(session: Session, clock: Clock, stale_after_s: float) -> int:
    """Mark interrupted the unfinished tasks whose head stopped beating: it died or was restarted.
    Their unfinished targets are marked too, so no one waits on them. Returns how many."""
    cutoff = to_datetime(clock.now() - stale_after_s)
    stale = session.scalars(
        select(Task).where(
            Task.state.in_((QUEUED, RUNNING)),
            (Task.heartbeat_at < cutoff) | (Task.heartbeat_at.is_(None) & (Task.created_at < cutoff)),
        )
    ).all()
    now = to_datetime(clock.now())
    for task in stale:
        _interrupt(task, now, "interrupted: the head stopped", "interrupted: the head running it stopped")
    return len(stale)


def supersede(session: Session, clock: Clock, task_id: int, why: str) -> None:
    """Give up an unfinished task whose head stopped beating, before its work is started again as a new
    task: it is marked interrupted, so its head, if only stalled, acts on no further target
    (`still_ours`) and its end changes nothing (`finish`)."""
    task = session.get(Task, task_id)
    if task is not None and task.state not in FINISHED_STATES:
        _interrupt(task, to_datetime(clock.now()), f"interrupted: {why}", f"interrupted: {why}"[:1024])


def _interrupt(task: Task, now: datetime, detail: str, summary: str) -> None:
    for target in task.targets:
        if target.state in (PENDING, RUNNING):
            target.state, target.detail, target.finished_at = FAILED, detail[:DETAIL_LIMIT], now
            task.done += 1
            task.failed += 1
    task.state, task.finished_at, task.summary = INTERRUPTED, now, summary
