"""Tasks: per-target results counted right under concurrency, failures isolated, limits and stagger
honoured, a stopped head's tasks interrupted, and the API and CLI that follow them."""

from __future__ import annotations

import json
import threading
import time

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker
from typer.testing import CliRunner

from gpufleet.cli.app import app as cli_app
from gpufleet.cli.state import CliState
from gpufleet.core.clock import FakeClock
from gpufleet.core.db import transaction
from gpufleet.core.errors import InvalidInput, NotFound
from gpufleet.tasks import service
from gpufleet.tasks.runner import TargetResult, TaskContext, TaskRunner
from tests.conftest import cli_through


def _task(sessions: sessionmaker[Session], clock: FakeClock, targets: list[str], kind: str = "test.run") -> int:
    with transaction(sessions) as s:
        return service.create(s, clock, kind=kind, targets=targets, params={"n": 1}, created_by="alice").id


def test_every_target_is_counted_once_when_many_finish_at_once(
    sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    names = [f"node{i:03d}" for i in range(24)]
    task_id = _task(sessions, clock, names)
    runner = TaskRunner(sessions, clock)

    def work(ctx: TaskContext) -> str:
        ctx.fan_out(names, lambda n: TargetResult(not n.endswith("7"), f"{n} done", {"n": n}), limit=8)
        return "all tried"

    runner.start(task_id, work)
    runner.wait(task_id, 30)
    with transaction(sessions, readonly=True) as s:
        task = service.get(s, task_id)
        assert (task.state, task.total, task.done, task.failed) == ("failed", 24, 24, 2)
        assert task.summary == "all tried"
        assert [t.target for t in task.targets] == names  # the caller's order
        assert {t.target for t in task.targets if t.state == "failed"} == {"node007", "node017"}
        assert all(t.data == {"n": t.target} and t.detail == f"{t.target} done" for t in task.targets)


def test_an_exception_fails_only_its_target_and_a_clean_run_succeeds(
    sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    def flaky(name: str) -> TargetResult:
        if name == "b":
            raise OSError("connection refused")
        if name == "c":
            raise InvalidInput("no BMC recorded for c")
        return TargetResult(True)

    task_id = _task(sessions, clock, ["a", "b", "c", "d"])
    runner = TaskRunner(sessions, clock)
    runner.start(task_id, lambda ctx: ctx.fan_out(["a", "b", "c", "d"], flaky, limit=2))
    runner.wait(task_id, 30)
    with transaction(sessions, readonly=True) as s:
        task = service.get(s, task_id)
        results = {t.target: (t.state, t.detail) for t in task.targets}
    assert results == {
        "a": ("ok", ""),
        "b": ("failed", "OSError: connection refused"),
        "c": ("failed", "no BMC recorded for c"),
        "d": ("ok", ""),
    }
    assert task.state == "failed"
    assert task.summary == "2 ok, 2 failed"

    ok_id = _task(sessions, clock, ["x"])
    runner.start(ok_id, lambda ctx: ctx.fan_out(["x"], lambda _: TargetResult(True), limit=1))
    runner.wait(ok_id, 30)
    with transaction(sessions, readonly=True) as s:
        assert service.get(s, ok_id).state == "succeeded"


def test_work_that_raises_fails_the_task_and_skips_targets_it_never_reached(
    sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    task_id = _task(sessions, clock, ["a", "b"])

    def work(ctx: TaskContext) -> None:
        ctx.finished("a", True)
        raise InvalidInput("image 'gpu' does not exist")

    runner = TaskRunner(sessions, clock)
    runner.start(task_id, work)
    runner.wait(task_id, 30)
    with transaction(sessions, readonly=True) as s:
        task = service.get(s, task_id)
        assert (task.state, task.summary) == ("failed", "image 'gpu' does not exist")
        assert [(t.target, t.state) for t in task.targets] == [("a", "ok"), ("b", "skipped")]
        assert task.done == 2


@pytest.mark.parametrize("limit", [1, 3])
def test_fan_out_never_runs_more_than_the_limit_at_once(
    sessions: sessionmaker[Session], clock: FakeClock, limit: int
) -> None:
    names = [f"n{i}" for i in range(9)]
    task_id = _task(sessions, clock, names)
    active, peak, lock = [0], [0], threading.Lock()

    def slow(_: str) -> TargetResult:
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.05)
        with lock:
            active[0] -= 1
        return TargetResult(True)

    ctx = TaskContext(task_id, {}, sessions, clock)
    ctx.fan_out(names, slow, limit=limit)
    assert peak[0] == limit


def test_stagger_spaces_the_starts(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    names = ["a", "b", "c", "d"]
    task_id = _task(sessions, clock, names)
    starts: list[float] = []
    ctx = TaskContext(task_id, {}, sessions, clock)
    ctx.fan_out(names, lambda _: (starts.append(time.monotonic()), TargetResult(True))[1], limit=4, stagger_s=0.1)
    gaps = [b - a for a, b in zip(sorted(starts), sorted(starts)[1:], strict=False)]
    assert len(gaps) == 3
    assert min(gaps) >= 0.09


def test_a_task_given_up_as_lost_acts_on_no_further_target(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    """A head that was stalled, not dead, wakes after another took its task over (`supersede`, before a
    retry): the targets it had not begun are left alone, and its end does not overwrite the verdict."""
    names = ["a", "b", "c"]
    task_id = _task(sessions, clock, names)
    acted: list[str] = []

    def work(ctx: TaskContext) -> str:
        def act(node: str) -> TargetResult:
            acted.append(node)
            if node == "a":  # the head stalls mid-task; meanwhile another gives the task up
                with transaction(sessions) as s:
                    service.supersede(s, clock, task_id, "its head stopped beating; tried again")
            return TargetResult(True, "rebooted")

        ctx.fan_out(names, act, limit=1)
        return "done"

    runner = TaskRunner(sessions, clock)
    runner.start(task_id, work)
    runner.wait(task_id, 10)
    assert acted == ["a"]  # b and c: no second reboot beside the retry
    with transaction(sessions, readonly=True) as s:
        task = service.get(s, task_id)
        assert task.state == "interrupted"
        assert task.summary == "interrupted: its head stopped beating; tried again"
        assert {t.target: t.state for t in task.targets} == {"a": "failed", "b": "failed", "c": "failed"}
    with transaction(sessions) as s:  # an ended task is not given up again
        service.supersede(s, clock, task_id, "again")
    with transaction(sessions, readonly=True) as s:
        assert service.get(s, task_id).summary.endswith("tried again")


def test_duplicate_targets_are_refused_and_nothing_is_written(
    sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    with pytest.raises(InvalidInput, match="once"), transaction(sessions) as s:
        service.create(s, clock, kind="power.on", targets=["a", "a"], params={}, created_by="alice")
    with transaction(sessions, readonly=True) as s:
        assert service.list_tasks(s) == []
        with pytest.raises(NotFound):
            service.get(s, 1)


def test_a_stopped_heads_tasks_are_interrupted_once_their_heartbeat_is_stale(
    sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    stale = _task(sessions, clock, ["a", "b"])
    with transaction(sessions) as s:
        service.mark_running(s, clock, stale)
        service.target_finished(s, clock, stale, "a", state="ok", detail="", data=None)
    clock.advance(30)
    fresh = _task(sessions, clock, ["c"])
    with transaction(sessions) as s:
        service.mark_running(s, clock, fresh)
    clock.advance(45)  # the first has not beaten for 75 s, the second for 45 s
    assert TaskRunner(sessions, clock).interrupt_stale() == 1
    with transaction(sessions, readonly=True) as s:
        task = service.get(s, stale)
        assert task.state == "interrupted"
        assert [(t.target, t.state) for t in task.targets] == [("a", "ok"), ("b", "failed")]
        assert (task.done, task.failed) == (2, 1)
        assert service.get(s, fresh).state == "running"


def test_the_api_lists_and_shows_tasks_and_the_cli_follows_one(
    client: TestClient, sessions: sessionmaker[Session], clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    power = _task(sessions, clock, ["node001", "node002"], kind="power.on")
    _task(sessions, clock, ["node001"], kind="image.sync")
    runner: TaskRunner = client.app.state.ctx.tasks  # type: ignore[attr-defined]
    gate = threading.Event()

    def work(ctx: TaskContext) -> None:
        gate.wait(10)
        ctx.fan_out(["node001", "node002"], lambda n: TargetResult(n == "node001", f"{n}: On"), limit=2)

    runner.start(power, work)
    running = client.get(f"/api/v1/tasks/{power}").json()
    assert running["state"] in ("queued", "running")
    assert [t["state"] for t in running["targets"]] == ["pending", "pending"]
    gate.set()
    runner.wait(power, 30)

    assert [t["kind"] for t in client.get("/api/v1/tasks").json()] == ["image.sync", "power.on"]
    assert [t["id"] for t in client.get("/api/v1/tasks", params={"kind": "power."}).json()] == [power]
    done = client.get(f"/api/v1/tasks/{power}").json()
    assert (done["state"], done["done"], done["failed"]) == ("failed", 2, 1)
    assert client.get("/api/v1/tasks/999").status_code == 404

    # The CLI's real HeadClient, its requests answered by the same app: `task wait` prints the
    # per-node results and exits 1 for a failed task.
    cli_through(client, monkeypatch)
    result = CliRunner().invoke(cli_app, ["task", "wait", str(power), "-o", "json"], obj=CliState())
    assert result.exit_code == 1, result.output
    assert json.loads(result.stdout)["targets"][1]["detail"] == "node002: On"
    table = CliRunner().invoke(cli_app, ["task", "show", str(power)], obj=CliState())
    assert table.exit_code == 0, table.output
    assert "node002: On" in table.stdout
    assert "1 ok, 1 failed" in table.stdout


def test_the_tasks_page_shows_progress_and_each_targets_result(
    client: TestClient, sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    from tests.api.dashboard_helpers import logged_in

    task_id = _task(sessions, clock, ["node001", "node002", "node003"], kind="image.sync")
    with transaction(sessions) as s:
        service.mark_running(s, clock, task_id)
        service.target_finished(s, clock, task_id, "node001", state="ok", detail="12 files", data=None)
        service.target_finished(s, clock, task_id, "node002", state="failed", detail="rsync: exit 23", data=None)
    browser = logged_in(client)  # a viewer may follow tasks
    page = browser.get("/tasks")
    assert page.status_code == 200
    assert f'<tr data-task="{task_id}" data-state="running">' in page.text
    assert '<progress max="3" value="2"></progress> 2/3' in page.text
    assert "No task yet" not in page.text
    detail = browser.get(f"/tasks/{task_id}")
    assert detail.status_code == 200
    assert '<tr data-target="node002" data-state="failed">' in detail.text
    assert "<code>rsync: exit 23</code>" in detail.text
    assert '<tr data-target="node003" data-state="pending">' in detail.text
    assert browser.get("/tasks/999").status_code == 404
    assert "No task yet" in browser.get("/tasks", params={"kind": "power."}).text


def test_a_running_head_keeps_looking_for_a_stopped_heads_tasks(
    sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    """A head restarted within a minute of its predecessor finds nothing stale at start; it must find
    the task once its heartbeat has aged, not leave it running for good."""
    runner = TaskRunner(sessions, clock)
    runner.watch(every_s=0.05)
    try:
        orphan = _task(sessions, clock, ["a"])
        with transaction(sessions) as s:
            service.mark_running(s, clock, orphan)
        time.sleep(0.2)
        with transaction(sessions, readonly=True) as s:
            assert service.get(s, orphan).state == "running"  # its head may still be alive
        clock.advance(61)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with transaction(sessions, readonly=True) as s:
                if service.get(s, orphan).state == "interrupted":
                    break
            time.sleep(0.05)
        with transaction(sessions, readonly=True) as s:
            assert service.get(s, orphan).state == "interrupted"
    finally:
        runner.close()
