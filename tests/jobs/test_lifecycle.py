"""Jobs against the database: submit-time refusals, placement, the agents' reports, cancel, node
failures, requeue, time limits, and the rule that a rank holds its GPUs until its agent lets go."""

import pytest
from pydantic import ValidationError
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.core.clock import FakeClock
from gpufleet.core.db import transaction
from gpufleet.core.errors import Conflict, Forbidden, InvalidInput, NotFound
from gpufleet.inventory.states import NodeState
from gpufleet.jobs import dispatch, lifecycle
from gpufleet.jobs.models import Job, JobState, RankState
from gpufleet.jobs.schemas import JobSubmit
from gpufleet.protocol.jobs import JobCancel, JobStart, RankRef
from tests.jobs.helpers import (
    ADMIN,
    TICK,
    as_user,
    cluster,
    job,
    node_id,
    project,
    ranks,
    report,
    set_node,
    submit,
    tick,
    users,
)


@pytest.fixture
def setup(sessions: sessionmaker[Session], clock: FakeClock) -> sessionmaker[Session]:
    cluster(sessions, clock, nodes=2, gpus=8)
    users(sessions, clock, "alice", "bob")
    project(sessions, clock, "vision", "alice")
    return sessions


def _count_jobs(sessions: sessionmaker[Session]) -> int:
    with transaction(sessions, readonly=True) as s:
        return s.scalar(select(func.count()).select_from(Job)) or 0


@pytest.mark.parametrize(
    ("who", "spec", "error", "match"),
    [
        (ADMIN, {"user": "nobody-here"}, NotFound, "nobody-here"),
        (ADMIN, {"user": None}, InvalidInput, "--user"),
        (as_user("alice"), {"user": "bob"}, Forbidden, "another user"),
        (as_user("alice"), {"project": "nope"}, NotFound, "nope"),
        (as_user("bob"), {"project": "vision"}, Forbidden, "not a member"),
        (as_user("alice"), {"gpus_per_node": 9}, InvalidInput, "largest has 8"),
        (as_user("alice"), {"nodes": 3, "gpus_per_node": 1}, InvalidInput, "2 node"),
        (as_user("alice"), {"cpus_per_node": 65}, InvalidInput, "65 CPUs"),
        (as_user("alice"), {"category": "a100"}, InvalidInput, "category a100"),
        (as_user("alice"), {"time_limit_s": 8 * 86400}, InvalidInput, "maximum"),
        (as_user("alice"), {"priority": 5}, Forbidden, "priority"),
    ],
)
def test_refused_at_submit_with_the_reason_and_nothing_written(
    setup: sessionmaker[Session], clock: FakeClock, who: object, spec: dict[str, object], error: type, match: str
) -> None:
    with pytest.raises(error, match=match):
        submit(setup, clock, who, **spec)  # type: ignore[arg-type]
    assert _count_jobs(setup) == 0


def test_quota_and_budget_over_the_whole_are_refused(setup: sessionmaker[Session], clock: FakeClock) -> None:
    project(setup, clock, "small", "alice", max_gpus=2, gpu_hours_budget=10)
    with pytest.raises(InvalidInput, match="quota of 2"):
        submit(setup, clock, as_user("alice"), project="small", gpus_per_node=4)
    with pytest.raises(InvalidInput, match=r"budget of 10\.0"):
        submit(setup, clock, as_user("alice"), project="small", gpus_per_node=2, time_limit_s=6 * 3600)
    assert _count_jobs(setup) == 0


@pytest.mark.parametrize(
    "spec",
    [
        {"argv": [], "script": None},
        {"argv": ["x"], "script": "echo"},
        {"argv": ["x"], "env": {"1BAD": "v"}},
        {"argv": ["x"], "workdir": "relative/dir"},
        {"argv": ["x"], "nodes": 0},
        {"argv": ["x" * 5000]},
        {"argv": ["x"], "container": "bad image name"},
    ],
)
def test_malformed_specs_are_refused_by_the_schema(spec: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        JobSubmit(**spec)  # type: ignore[arg-type]


def test_a_user_in_one_project_is_charged_to_it_by_default(setup: sessionmaker[Session], clock: FakeClock) -> None:
    assert job(setup, submit(setup, clock, as_user("alice"))).project == "vision"
    assert job(setup, submit(setup, clock, as_user("bob"))).project is None
    project(setup, clock, "nlp", "alice")
    with pytest.raises(InvalidInput, match="several projects"):
        submit(setup, clock, as_user("alice"))


def test_a_gang_and_small_jobs_are_placed_without_sharing_a_gpu(setup: sessionmaker[Session], clock: FakeClock) -> None:
    small = [submit(setup, clock, gpus_per_node=1) for _ in range(4)]
    gang = submit(setup, clock, nodes=2, gpus_per_node=4)  # packing leaves n1 half full: room for it
    result = tick(setup, clock)
    assert sorted(result.placed) == sorted([*small, gang])
    held = [(r.node, g) for j in [*small, gang] for r in ranks(setup, j) for g in r.gpu_indexes]
    assert len(held) == len(set(held)) == 4 + 8
    gang_ranks = ranks(setup, gang)
    assert [r.rank for r in gang_ranks] == [0, 1]
    assert {r.node for r in gang_ranks} == {"n1", "n2"}
    assert all(r.gpu_uuids == [f"GPU-{r.node}-{i}" for i in r.gpu_indexes] for r in gang_ranks)
    assert job(setup, gang).state is JobState.RUNNING


def test_a_project_at_its_quota_waits_with_reason_quota(setup: sessionmaker[Session], clock: FakeClock) -> None:
    project(setup, clock, "tiny", "bob", max_gpus=2)
    ids = [submit(setup, clock, user="bob", project="tiny") for _ in range(3)]
    tick(setup, clock)
    states = [job(setup, i).state for i in ids]
    assert states.count(JobState.RUNNING) == 2
    waiting = job(setup, ids[2])
    assert waiting.state is JobState.PENDING
    assert waiting.reason.startswith("quota")
    report(setup, clock, ids[0])  # one ends: the third may start
    tick(setup, clock)
    assert job(setup, ids[2]).state is JobState.RUNNING


def test_the_higher_priority_job_starts_first(setup: sessionmaker[Session], clock: FakeClock) -> None:
    blocker = submit(setup, clock, nodes=2, gpus_per_node=8)
    tick(setup, clock)
    low = submit(setup, clock, nodes=2, gpus_per_node=8)
    clock.advance(1)
    high = submit(setup, clock, nodes=2, gpus_per_node=8, priority=10)
    tick(setup, clock)
    assert job(setup, low).state is job(setup, high).state is JobState.PENDING
    report(setup, clock, blocker, rank=0)
    report(setup, clock, blocker, rank=1)
    assert job(setup, blocker).state is JobState.COMPLETED
    tick(setup, clock)
    assert job(setup, high).state is JobState.RUNNING
    assert job(setup, low).state is JobState.PENDING


def test_a_failed_rank_fails_the_job_and_stops_the_others(setup: sessionmaker[Session], clock: FakeClock) -> None:
    gang = submit(setup, clock, nodes=2, gpus_per_node=8)
    tick(setup, clock)
    with transaction(setup) as s:
        dispatch.outgoing(s, clock, [node_id(setup, "n1"), node_id(setup, "n2")])
    clock.advance(30)
    report(setup, clock, gang, outcome="failed", rank=1, exit_code=3)
    done = job(setup, gang)
    assert (done.state, done.exit_code) == (JobState.FAILED, 3)
    assert "rank 1 on n2 exited with code 3" in done.reason
    survivor = ranks(setup, gang)[0]
    assert survivor.state is not RankState.EXITED
    assert survivor.cancel is not None
    assert done.gpu_seconds == pytest.approx(16 * 30)


def test_a_report_about_another_nodes_rank_is_refused(setup: sessionmaker[Session], clock: FakeClock) -> None:
    one = submit(setup, clock)
    tick(setup, clock)
    other = "n2" if ranks(setup, one)[0].node == "n1" else "n1"
    with pytest.raises(Forbidden, match=f"job {one} run 1 rank 0 of node"):
        report(setup, clock, one, node=other)
    assert job(setup, one).state is JobState.RUNNING


def test_cancel_ends_the_job_but_its_gpus_stay_held_until_the_agent_lets_go(
    setup: sessionmaker[Session], clock: FakeClock
) -> None:
    running = submit(setup, clock, nodes=2, gpus_per_node=8)
    tick(setup, clock)
    with transaction(setup) as s:
        dispatch.outgoing(s, clock, [node_id(setup, "n1"), node_id(setup, "n2")])  # the starts go out
    with pytest.raises(Forbidden), transaction(setup) as s:
        lifecycle.cancel(s, clock, running, "user:bob", user="bob", admin=False)
    with transaction(setup) as s:
        lifecycle.cancel(s, clock, running, "user:alice", user="alice", admin=False)
    assert job(setup, running).state is JobState.CANCELLED
    waiting = submit(setup, clock, gpus_per_node=1)
    tick(setup, clock)
    assert job(setup, waiting).state is JobState.PENDING  # every GPU is still held by the cancelled job
    with transaction(setup) as s:
        sent = dispatch.outgoing(s, clock, [node_id(setup, "n1"), node_id(setup, "n2")])
    assert sorted((type(m).__name__, m.rank) for _, m in sent) == [("JobCancel", 0), ("JobCancel", 1)]
    report(setup, clock, running, outcome="cancelled", rank=0)
    tick(setup, clock)
    assert job(setup, waiting).state is JobState.RUNNING
    with pytest.raises(Conflict, match="already ended"), transaction(setup) as s:
        lifecycle.cancel(s, clock, running, "user:alice", user="alice", admin=False)


def test_a_pending_job_cancelled_never_starts(setup: sessionmaker[Session], clock: FakeClock) -> None:
    pending = submit(setup, clock)
    with transaction(setup) as s:
        lifecycle.cancel(s, clock, pending, "token:admin", user=None, admin=True)
    tick(setup, clock)
    assert job(setup, pending).state is JobState.CANCELLED
    assert ranks(setup, pending) == []


def test_a_start_is_resent_until_answered_and_carries_what_torchrun_needs(
    setup: sessionmaker[Session], clock: FakeClock
) -> None:
    gang = submit(setup, clock, nodes=2, gpus_per_node=2, env={"A": "1"}, time_limit_s=600)
    tick(setup, clock)
    nodes = [node_id(setup, "n1"), node_id(setup, "n2")]
    with transaction(setup) as s:
        first = dispatch.outgoing(s, clock, nodes)
    starts = sorted((m for _, m in first if isinstance(m, JobStart)), key=lambda m: m.rank)
    assert [m.rank for m in starts] == [0, 1]
    rank0_node = ranks(setup, gang)[0].node
    assert all(m.world_size == 2 and m.master_addr == f"{rank0_node}.cluster" for m in starts)
    assert all(m.master_port == dispatch.master_port(gang) and m.env == {"A": "1"} for m in starts)
    assert starts[0].gpu_uuids == [f"GPU-{rank0_node}-{i}" for i in starts[0].gpu_indexes]
    assert starts[0].user == "alice"
    assert starts[0].time_limit_s == pytest.approx(600)
    with transaction(setup) as s:
        assert dispatch.outgoing(s, clock, nodes) == []  # not before RESEND_S
    clock.advance(dispatch.RESEND_S + 1)
    report(setup, clock, gang, state="running", rank=0)
    with transaction(setup) as s:
        again = dispatch.outgoing(s, clock, nodes)
    assert [(type(m).__name__, m.rank) for _, m in again] == [("JobStart", 1)]
    assert isinstance(again[0][1], JobStart)
    assert again[0][1].time_limit_s == pytest.approx(600 - dispatch.RESEND_S - 1)


@pytest.mark.parametrize("requeue", [False, True])
def test_a_node_going_down_gives_node_fail_or_a_requeue(
    setup: sessionmaker[Session], clock: FakeClock, requeue: bool
) -> None:
    one = submit(setup, clock, gpus_per_node=8, requeue=requeue)
    tick(setup, clock)
    first = ranks(setup, one)[0]
    report(setup, clock, one, state="running")
    set_node(setup, first.node, state=NodeState.DOWN)
    tick(setup, clock)  # notices the failure, and (requeue) places the job again on the other node
    after = job(setup, one)
    if not requeue:
        assert after.state is JobState.NODE_FAIL
        assert f"node {first.node} is down" in after.reason
        return
    assert after.state is JobState.RUNNING
    assert after.run == 2
    second = next(r for r in ranks(setup, one) if r.run == 2)
    assert second.node != first.node
    old = next(r for r in ranks(setup, one) if r.run == 1)
    assert old.state is RankState.RUNNING
    assert old.cancel == "requeued"


def test_a_rank_the_agent_lost_ends_the_job_and_a_stray_rank_is_stopped(
    setup: sessionmaker[Session], clock: FakeClock
) -> None:
    lost = submit(setup, clock, gpus_per_node=8)
    stray = submit(setup, clock, gpus_per_node=8)
    tick(setup, clock)
    report(setup, clock, lost, state="running")
    report(setup, clock, stray, state="running")
    with transaction(setup) as s:
        lifecycle.cancel(s, clock, stray, "token:admin", user=None, admin=True)
    stray_rank = ranks(setup, stray)[0]
    lost_rank = ranks(setup, lost)[0]
    with transaction(setup) as s:
        # The lost job's node restarted its agent (holds nothing); the stray job's node still holds it.
        lifecycle.ranks_held(s, clock, node_id(setup, lost_rank.node), [], TICK.max_requeues)
        if stray_rank.node != lost_rank.node:
            held = [RankRef(job_id=stray, run=1, rank=0)]
            lifecycle.ranks_held(s, clock, node_id(setup, stray_rank.node), held, TICK.max_requeues)
    ended = job(setup, lost)
    assert ended.state is JobState.NODE_FAIL
    assert "no longer holds" in ended.reason
    assert ranks(setup, lost)[0].outcome == "lost"
    if stray_rank.node != lost_rank.node:
        with transaction(setup) as s:
            sent = dispatch.outgoing(s, clock, [node_id(setup, stray_rank.node)])
        assert [type(m) for _, m in sent] == [JobCancel]


def test_a_job_past_its_limit_with_a_silent_agent_times_out(setup: sessionmaker[Session], clock: FakeClock) -> None:
    one = submit(setup, clock, time_limit_s=100)
    tick(setup, clock)
    clock.advance(100 + lifecycle.TIMEOUT_GRACE_S - 1)
    tick(setup, clock)
    assert job(setup, one).state is JobState.RUNNING
    clock.advance(2)
    tick(setup, clock)
    assert job(setup, one).state is JobState.TIMEOUT


def test_drained_and_failed_nodes_take_no_new_jobs(setup: sessionmaker[Session], clock: FakeClock) -> None:
    from gpufleet.core.clock import to_datetime

    set_node(setup, "n1", drained_at=to_datetime(clock.now()), drain_reason="gpufleet: xid 79")
    set_node(setup, "n2", health="failed")
    one = submit(setup, clock)
    tick(setup, clock)
    assert job(setup, one).state is JobState.PENDING
    assert job(setup, one).reason.startswith("unschedulable")
    set_node(setup, "n2", health="healthy")
    tick(setup, clock)
    assert ranks(setup, one)[0].node == "n2"


def test_a_pass_places_nothing_that_changed_since_its_snapshot(setup: sessionmaker[Session], clock: FakeClock) -> None:
    """The pass plans from a read-only snapshot and re-checks before it writes."""
    from gpufleet.core.clock import to_datetime
    from gpufleet.jobs import tick as passes

    cancelled = submit(setup, clock, gpus_per_node=8)
    drained = submit(setup, clock, gpus_per_node=8)
    with transaction(setup, readonly=True) as s:
        found = passes.plan(s, clock, TICK)
    assert {p.job_id for p in found.placements} == {str(cancelled), str(drained)}
    with transaction(setup) as s:
        lifecycle.cancel(s, clock, cancelled, "token:admin", user=None, admin=True)
    node = next(iter(next(p for p in found.placements if p.job_id == str(drained)).allocation))
    set_node(setup, node, drained_at=to_datetime(clock.now()), drain_reason="by hand")
    with transaction(setup) as s:
        result = passes.apply(s, clock, found, TICK)
    assert result.placed == []
    assert job(setup, cancelled).state is JobState.CANCELLED
    assert job(setup, drained).state is JobState.PENDING
    assert ranks(setup, cancelled) == ranks(setup, drained) == []


def test_a_held_rank_the_head_has_no_live_record_of_is_returned_to_be_stopped(
    setup: sessionmaker[Session], clock: FakeClock
) -> None:
    one = submit(setup, clock, gpus_per_node=8)
    tick(setup, clock)
    node = ranks(setup, one)[0].node
    report(setup, clock, one, outcome="completed")  # ended and recorded; then the agent restarts holding it
    held = [RankRef(job_id=one, run=1, rank=0), RankRef(job_id=424242, run=1, rank=0)]
    with transaction(setup) as s:
        strays = lifecycle.ranks_held(s, clock, node_id(setup, node), held, TICK.max_requeues)
    assert [(r.job_id, r.run, r.rank) for r in strays] == [(one, 1, 0), (424242, 1, 0)]


def test_a_pass_never_places_on_a_gpu_taken_since_its_snapshot(setup: sessionmaker[Session], clock: FakeClock) -> None:
    """Two leaders overlapping (a stalled old one): the second apply finds the GPUs taken and waits."""
    from gpufleet.jobs import tick as passes

    first = submit(setup, clock, gpus_per_node=8, nodes=2)
    with transaction(setup, readonly=True) as s:
        stale = passes.plan(s, clock, TICK)
    tick(setup, clock)  # the new leader places it
    second = submit(setup, clock, gpus_per_node=8, nodes=2)
    with transaction(setup, readonly=True) as s:
        also_stale = passes.plan(s, clock, TICK)
    # The old leader's plan, re-aimed at the second job: it must not land on the first job's GPUs.
    also_stale.placements = [type(p)(str(second), p.allocation) for p in stale.placements]
    with transaction(setup) as s:
        assert passes.apply(s, clock, also_stale, TICK).placed == []
    assert job(setup, first).state is JobState.RUNNING
    assert job(setup, second).state is JobState.PENDING
