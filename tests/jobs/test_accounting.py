"""GPU time from the ranks: decayed fair-share use, budgets per period, the usage report, and output."""

import calendar
import math
from datetime import UTC, datetime

import pytest
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.auth.projects import BudgetPeriod
from gpufleet.core.clock import FakeClock
from gpufleet.core.db import transaction
from gpufleet.jobs import accounting, lifecycle, output
from gpufleet.jobs.models import JobState
from gpufleet.protocol.jobs import JobOutput
from tests.jobs.helpers import cluster, job, node_id, project, ranks, report, submit, tick, users

DAY = 86400.0


def test_decayed_use_is_the_integral_of_the_halving_weight() -> None:
    held = accounting.Held(job_id=1, user="a", project="p", gpus=4, start=0.0, end=3 * DAY)
    now, half = 10 * DAY, 7 * DAY
    steps = 30_000
    width = 3 * DAY / steps
    numeric = sum(4 * width * 0.5 ** ((now - (i + 0.5) * width) / half) for i in range(steps))
    assert accounting.decayed_gpu_seconds(held, now, half) == pytest.approx(numeric, rel=1e-6)
    assert accounting.decayed_gpu_seconds(held, 3 * DAY, 1e12) == pytest.approx(4 * 3 * DAY, rel=1e-6)
    still = accounting.Held(job_id=1, user="a", project="p", gpus=2, start=now - 100, end=None)
    assert accounting.decayed_gpu_seconds(still, now, half) == pytest.approx(200, rel=1e-3)


@pytest.mark.parametrize(
    ("period", "when", "start"),
    [
        (BudgetPeriod.WEEK, datetime(2026, 12, 3, 15, tzinfo=UTC), datetime(2026, 11, 30, tzinfo=UTC)),
        (BudgetPeriod.MONTH, datetime(2026, 12, 3, 15, tzinfo=UTC), datetime(2026, 12, 1, tzinfo=UTC)),
        (BudgetPeriod.QUARTER, datetime(2026, 12, 3, 15, tzinfo=UTC), datetime(2026, 10, 1, tzinfo=UTC)),
        (BudgetPeriod.QUARTER, datetime(2026, 2, 28, tzinfo=UTC), datetime(2026, 1, 1, tzinfo=UTC)),
    ],
)
def test_budget_periods_start_on_monday_the_first_and_the_quarter(
    period: BudgetPeriod, when: datetime, start: datetime
) -> None:
    assert accounting.period_start(period, when.timestamp()) == calendar.timegm(start.timetuple())


def test_projects_get_their_quota_budget_left_and_decayed_use(
    sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    cluster(sessions, clock, nodes=1, gpus=8)
    users(sessions, clock, "alice")
    project(sessions, clock, "vision", "alice", max_gpus=6, gpu_hours_budget=100)
    project(sessions, clock, "idle")
    one = submit(sessions, clock, project="vision", gpus_per_node=4)
    tick(sessions, clock)
    clock.advance(1800)
    report(sessions, clock, one)
    clock.advance(600)
    with transaction(sessions, readonly=True) as s:
        limits = accounting.project_limits(s, clock.now(), 7 * DAY)
    vision = limits["vision"]
    assert vision.max_gpus == 6
    assert vision.gpu_hours_left == pytest.approx(100 - 2.0)  # 4 GPUs for half an hour
    k = math.log(2) / (7 * DAY)
    assert vision.usage == pytest.approx(4 * (math.exp(-k * 600) - math.exp(-k * 2400)) / k)
    assert limits["idle"].usage == 0
    assert limits["idle"].gpu_hours_left is None


def test_the_usage_report_counts_gpu_hours_inside_the_window(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    cluster(sessions, clock, nodes=1, gpus=8)
    users(sessions, clock, "alice", "bob")
    project(sessions, clock, "vision", "alice")
    start = clock.now()
    a = submit(sessions, clock, user="alice", gpus_per_node=2)
    b = submit(sessions, clock, user="bob", gpus_per_node=4)
    tick(sessions, clock)
    clock.advance(3600)
    report(sessions, clock, a)
    clock.advance(3600)  # b still runs
    with transaction(sessions) as s:
        lifecycle.get_job(s, b).sampled_gpu_seconds = 100.0
        lifecycle.get_job(s, b).busy_gpu_seconds = 25.0
    with transaction(sessions, readonly=True) as s:
        by_user = accounting.usage_report(s, start, clock.now(), "user")
        by_project = accounting.usage_report(s, start, clock.now(), "project")
        later = accounting.usage_report(s, start + 5400, clock.now(), "job")
    assert [(r.key, r.gpu_hours, r.mean_gpu_util) for r in by_user.rows] == [("bob", 8.0, 25.0), ("alice", 2.0, None)]
    assert [(r.key, r.jobs) for r in by_project.rows] == [("(none)", 1), ("vision", 1)]
    assert [(r.key, r.gpu_hours) for r in later.rows] == [(str(b), 2.0)]


def test_output_is_stored_once_per_offset_bounded_and_read_by_cursor(
    sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    cluster(sessions, clock, nodes=2, gpus=8)
    users(sessions, clock, "alice")
    one = submit(sessions, clock)
    tick(sessions, clock)
    mine = node_id(sessions, ranks(sessions, one)[0].node)
    other = node_id(sessions, "n2" if ranks(sessions, one)[0].node == "n1" else "n1")

    def chunk(offset: int, data: str, stream: str = "stdout") -> JobOutput:
        return JobOutput(job_id=one, run=1, rank=0, stream=stream, offset=offset, data=data)  # type: ignore[arg-type]

    with transaction(sessions) as s:
        assert output.store(s, clock, [(mine, chunk(0, "hello ")), (mine, chunk(0, "hello "))], 20) == 1
        assert output.store(s, clock, [(other, chunk(6, "forged"))], 20) == 0
        assert output.store(s, clock, [(mine, chunk(6, "world\n")), (mine, chunk(0, "oops\n", "stderr"))], 20) == 2
        assert output.store(s, clock, [(mine, chunk(12, "x" * 50))], 20) == 1
        assert output.store(s, clock, [(mine, chunk(62, "more"))], 20) == 0
    with transaction(sessions, readonly=True) as s:
        first = output.read(s, lifecycle.get_job(s, one), after=0, limit=2)
        rest = output.read(s, lifecycle.get_job(s, one), after=first.next_after)
    assert [c.data for c in first.chunks] == ["hello ", "world\n"]
    assert not first.done
    assert [c.stream for c in rest.chunks] == ["stderr", "stdout"]
    assert rest.chunks[1].data.startswith("xxx\n[gpufleet: output truncated")  # 17 of 20 characters were used
    assert not rest.done  # the job still runs
    report(sessions, clock, one)
    with transaction(sessions, readonly=True) as s:
        final = output.read(s, lifecycle.get_job(s, one), after=rest.next_after)
    assert final.chunks == []
    assert final.done
    assert final.state is JobState.COMPLETED
    assert job(sessions, one).state is JobState.COMPLETED
