"""Inference services against the database: creation refused as a job would be, and the reconciler
(replace the dead, back off a crash loop, replace a replica failing its checks, scale, roll an update
one replica at a time) driven pass by pass with a fake clock and the agents' reports."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.core.clock import FakeClock
from gpufleet.core.db import transaction
from gpufleet.core.errors import Conflict, Forbidden, InvalidInput, NotFound
from gpufleet.jobs import inference
from gpufleet.jobs.models import Job, JobState, ServiceReplica
from gpufleet.jobs.schemas import ServiceChange, ServiceCreate
from tests.jobs.helpers import LIMITS, as_user, cluster, project, report, tick, users

# One database: service logic over the job tables that test_lifecycle runs on both.
pytestmark = pytest.mark.one_database

ALICE = as_user("alice")


@pytest.fixture
def ready(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    cluster(sessions, clock, nodes=2, gpus=2)
    users(sessions, clock, "alice", "bob")
    project(sessions, clock, "ml", "alice")
    project(sessions, clock, "other", "bob")


def create(sessions: sessionmaker[Session], clock: FakeClock, replicas: int = 2, **replica: Any) -> None:
    replica.setdefault("argv", ["serve"])
    replica.setdefault("project", "ml")
    replica.setdefault("gpus_per_node", 1)
    spec = ServiceCreate(name="embed", replicas=replicas, startup_s=60, replica=replica)
    with transaction(sessions) as s:
        inference.create(s, clock, ALICE, spec, LIMITS)


def reconcile(sessions: sessionmaker[Session], clock: FakeClock, healthy: dict[int, bool] | None = None) -> None:
    """One leader pass: the health checks' answers by job id, then the reconciler; then a scheduler pass."""
    with transaction(sessions) as s:
        by_job = {r.job_id: r.id for r in s.scalars(select(ServiceReplica))}
        inference.record_probes(s, clock, {by_job[j]: ok for j, ok in (healthy or {}).items() if j in by_job})
        inference.reconcile(s, clock, LIMITS)
    tick(sessions, clock)


def replicas(sessions: sessionmaker[Session]) -> list[tuple[int, int, str, bool]]:
    """(job id, revision, job state, healthy) of every replica."""
    with transaction(sessions, readonly=True) as s:
        rows = s.execute(
            select(ServiceReplica.job_id, ServiceReplica.revision, Job.state, ServiceReplica.healthy)
            .join(Job, Job.id == ServiceReplica.job_id)
            .order_by(ServiceReplica.id)
        )
        return [(j, rev, state.value, ok) for j, rev, state, ok in rows]


def service(sessions: sessionmaker[Session]) -> dict[str, Any]:
    with transaction(sessions, readonly=True) as s:
        return inference.out(s, inference.get(s, "embed")).model_dump()


def started(sessions: sessionmaker[Session], clock: FakeClock, replicas: int = 2) -> None:
    """A service whose replicas are placed, running, and known to the reconciler (addresses set)."""
    create(sessions, clock, replicas)
    tick(sessions, clock)
    run_all(sessions, clock)
    reconcile(sessions, clock)


def run_all(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    """The agents say every placed replica runs."""
    for job_id, _, state, _ in replicas(sessions):
        if state == "running":
            report(sessions, clock, job_id, "running")


@pytest.mark.usefixtures("ready")
def test_a_service_starts_its_replicas_as_jobs_with_their_own_ports(
    sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    started(sessions, clock)
    rows = replicas(sessions)
    assert [(rev, state) for _, rev, state, _ in rows] == [(1, "running"), (1, "running")]
    with transaction(sessions, readonly=True) as s:
        for job_id, *_ in rows:
            job = s.get(Job, job_id)
            assert job is not None
            assert (job.user, job.project) == ("alice", "ml")
            assert job.env["GPUFLEET_SERVICE_PORT"] == str(inference.replica_port(job_id))
            assert job.env["GPUFLEET_SERVICE_NAME"] == "embed"
            assert job.time_limit_s == LIMITS.max_time_limit_s  # runs until stopped
    for replica in service(sessions)["replica_list"]:  # the node's hostname and the replica's port
        assert replica["address"] == f"{replica['node']}.cluster:{inference.replica_port(replica['job_id'])}"


@pytest.mark.usefixtures("ready")
def test_creation_is_refused_as_its_job_would_be_and_leaves_nothing(
    sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    with pytest.raises(Forbidden, match="not a member of project other"):
        create(sessions, clock, project="other")
    with pytest.raises(NotFound):
        create(sessions, clock, environment="nosuch")
    with transaction(sessions, readonly=True) as s:
        assert inference.listing(s) == []
        assert list(s.scalars(select(Job))) == []
    create(sessions, clock)
    with pytest.raises(Conflict):
        create(sessions, clock)


@pytest.mark.usefixtures("ready")
def test_a_dead_replica_is_replaced_and_a_crash_loop_backs_off(
    sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    started(sessions, clock, 1)
    ((first, *_),) = replicas(sessions)
    reconcile(sessions, clock, {first: True})
    report(sessions, clock, first, "exited", "failed", exit_code=137)  # a working replica dies
    reconcile(sessions, clock)
    ((second, _, state, _),) = replicas(sessions)
    assert second != first
    assert state == "running"
    assert service(sessions)["restarts"] == 1

    report(sessions, clock, second, "running")
    report(sessions, clock, second, "exited", "failed", exit_code=1)  # dies before it was ever healthy
    reconcile(sessions, clock)
    assert replicas(sessions) == []  # backing off
    shown = service(sessions)
    assert "before it was ever healthy" in shown["message"]
    assert "in 2 s" in shown["message"]
    clock.advance(2.5)
    reconcile(sessions, clock)
    assert len(replicas(sessions)) == 1


@pytest.mark.usefixtures("ready")
def test_a_replica_failing_its_checks_is_replaced_only_after_its_startup(
    sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    started(sessions, clock, 1)
    ((job_id, *_),) = replicas(sessions)
    for _ in range(5):  # loading its model: failing checks within startup_s (60 s) are no failure
        reconcile(sessions, clock, {job_id: False})
    assert [j for j, *_ in replicas(sessions)] == [job_id]
    clock.advance(61)
    reconcile(sessions, clock, {job_id: False})
    rows = replicas(sessions)
    assert job_id not in [j for j, *_ in rows]
    with transaction(sessions, readonly=True) as s:
        ended = s.get(Job, job_id)
        assert ended is not None
        assert ended.state == JobState.CANCELLED
        assert "failed 6 health checks" in ended.reason


@pytest.mark.usefixtures("ready")
def test_scaling_down_stops_the_unhealthy_first_and_up_adds_replicas(
    sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    started(sessions, clock, 3)
    a, b, c = (j for j, *_ in replicas(sessions))
    reconcile(sessions, clock, {a: True, b: False, c: True})
    with transaction(sessions) as s:
        inference.scale(s, inference.get(s, "embed"), 2)
    reconcile(sessions, clock, {a: True, b: False, c: True})
    assert [j for j, *_ in replicas(sessions)] == [a, c]
    with transaction(sessions) as s:
        inference.scale(s, inference.get(s, "embed"), 4)
    reconcile(sessions, clock)
    assert len(replicas(sessions)) == 4  # 4 GPUs in the cluster: all placed
    assert service(sessions)["restarts"] == 0  # stopping on purpose is no restart


@pytest.mark.usefixtures("ready")
def test_an_update_rolls_one_replica_at_a_time_and_keeps_the_count_serving(
    sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    started(sessions, clock, 2)
    old = [j for j, *_ in replicas(sessions)]
    health = dict.fromkeys(old, True)
    reconcile(sessions, clock, health)
    with transaction(sessions) as s:
        inference.update(s, inference.get(s, "embed"), ServiceChange(argv=["serve", "--v2"]))
    for _ in range(10):
        reconcile(sessions, clock, health)
        run_all(sessions, clock)
        rows = replicas(sessions)
        serving = [j for j, _, state, ok in rows if state == "running" and health.get(j, False)]
        assert len(serving) >= 2, rows  # never fewer healthy replicas than wanted during the roll
        assert len(rows) <= 3  # one beyond the count at most
        for job_id, rev, state, _ in rows:
            if rev == 2 and state == "running":
                health[job_id] = True  # the new replica passes its checks at the next round
        if all(rev == 2 for _, rev, *_ in rows) and len(rows) == 2:
            break
    rows = replicas(sessions)
    assert [rev for _, rev, *_ in rows] == [2, 2]
    with transaction(sessions, readonly=True) as s:
        for job_id in old:
            ended = s.get(Job, job_id)
            assert ended is not None
            assert "replaced by revision 2" in ended.reason
        new = s.get(Job, rows[0][0])
        assert new is not None
        assert new.argv == ["serve", "--v2"]


@pytest.mark.usefixtures("ready")
def test_who_may_call_and_change_a_service(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    create(sessions, clock, replicas=1)
    users(sessions, clock, "carol")
    with transaction(sessions) as s:
        from gpufleet.auth import projects

        projects.add_member(s, clock, "ml", "carol")
    with transaction(sessions, readonly=True) as s:
        found = inference.get(s, "embed")
        assert inference.may_call(s, found, "alice", admin=False)
        assert inference.may_call(s, found, "carol", admin=False)  # a member of its project
        assert not inference.may_call(s, found, "bob", admin=False)
        assert not inference.may_call(s, found, None, admin=False)
        assert inference.may_call(s, found, None, admin=True)
        with pytest.raises(Forbidden):
            inference.check_owner(found, "carol", admin=False)
        inference.check_owner(found, "alice", admin=False)


@pytest.mark.usefixtures("ready")
def test_replicas_count_against_the_projects_quota_like_jobs(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    with transaction(sessions) as s:
        from gpufleet.auth import projects

        projects.set_quota(s, "ml", max_gpus=1, gpu_hours_budget=None)
    create(sessions, clock, replicas=2)
    tick(sessions, clock)
    rows = replicas(sessions)
    assert sorted(state for _, _, state, _ in rows) == ["pending", "running"]
    with transaction(sessions, readonly=True) as s:
        waiting = s.get(Job, next(j for j, _, state, _ in rows if state == "pending"))
        assert waiting is not None
        assert waiting.reason.startswith("quota")


@pytest.mark.usefixtures("ready")
def test_an_update_stops_the_unhealthy_old_replica_first(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    started(sessions, clock, 2)
    a, b = (j for j, *_ in replicas(sessions))
    reconcile(sessions, clock, {a: True, b: False})
    with transaction(sessions) as s:
        inference.update(s, inference.get(s, "embed"), ServiceChange(argv=["serve", "--v2"]))
    reconcile(sessions, clock, {a: True, b: False})  # starts the first new replica
    run_all(sessions, clock)
    new = next(j for j, rev, *_ in replicas(sessions) if rev == 2)
    reconcile(sessions, clock, {a: True, b: False, new: True})  # it is ready: one old one goes
    left = [j for j, rev, *_ in replicas(sessions) if rev == 1]
    assert left == [a]  # the failing one went, the healthy one keeps serving


@pytest.mark.usefixtures("ready")
def test_scaling_down_is_not_held_back_by_a_crash_loop(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    started(sessions, clock, 2)
    a, b = (j for j, *_ in replicas(sessions))
    report(sessions, clock, a, "exited", "failed", exit_code=1)  # never healthy: back-off
    reconcile(sessions, clock, {b: False})
    assert service(sessions)["message"]
    with transaction(sessions) as s:
        inference.scale(s, inference.get(s, "embed"), 0)
    reconcile(sessions, clock, {b: False})
    assert replicas(sessions) == []


@pytest.mark.usefixtures("ready")
def test_an_update_that_makes_no_valid_job_is_refused(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    started(sessions, clock, 1)
    too_many = {f"V{i}": "x" for i in range(128)}  # with GPUFLEET_SERVICE_NAME, one over the limit
    with transaction(sessions) as s, pytest.raises(InvalidInput, match="not valid"):
        inference.update(s, inference.get(s, "embed"), ServiceChange(env=too_many))
    assert service(sessions)["revision"] == 1


@pytest.mark.usefixtures("ready")
def test_a_ready_replica_leaves_the_rotation_after_two_failed_checks_not_one(
    sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    started(sessions, clock, 1)
    ((job_id, *_),) = replicas(sessions)
    reconcile(sessions, clock, {job_id: True})
    reconcile(sessions, clock, {job_id: False})  # one slow check on a busy node
    assert [ok for *_, ok in replicas(sessions)] == [True]
    reconcile(sessions, clock, {job_id: False})
    assert [ok for *_, ok in replicas(sessions)] == [False]
    reconcile(sessions, clock, {job_id: True})
    assert [ok for *_, ok in replicas(sessions)] == [True]
