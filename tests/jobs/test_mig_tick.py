"""MIG through the scheduler pass against the database: a node with one GPU sliced into 7 x 1g.18gb and one
whole GPU. Whole-GPU jobs get the whole GPU only, a slice job one MIG device of its own (its GPU index the
device's GPU), a GPU bound for another layout no new job; a 1g rank counts 1/7 of a GPU in accounting,
submission's quota and budget; an unknown profile is refused at submission."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.core.clock import FakeClock
from gpufleet.core.db import transaction
from gpufleet.core.errors import InvalidInput
from gpufleet.inventory import categories
from gpufleet.inventory.models import Node
from gpufleet.jobs import accounting
from gpufleet.jobs.models import Job, JobState
from gpufleet.jobs.schemas import JobSubmit
from gpufleet.protocol.mig import PROFILES
from tests.jobs.helpers import as_user, job, project, ranks, report, submit, tick, users
from tests.sharing.helpers import H200, SEVEN_1G, T4, add_node

ONE_G = "1g.18gb"
DEVICES = {f"MIG-n1-0-{k}" for k in range(7)}

# Above the database: tests/sharing/test_mig_reconcile.py runs the MIG queries on both.
pytestmark = pytest.mark.one_database


@pytest.fixture
def mixed(sessions: sessionmaker[Session], clock: FakeClock) -> sessionmaker[Session]:
    """Node n1: GPU 0 in MIG mode (7 x 1g.18gb), GPU 1 whole. No layout declared. User alice."""
    add_node(sessions, clock, "n1", [(H200, SEVEN_1G), (H200, None)])
    users(sessions, clock, "alice")
    return sessions


def declare_on_node(sessions: sessionmaker[Session], name: str, layout: str) -> None:
    with transaction(sessions) as s:
        node = s.scalars(select(Node).where(Node.name == name)).one()
        categories.update_node_settings(s, node, set_={"mig_layout": layout})


def placed(sessions: sessionmaker[Session], job_id: int) -> tuple[list[int], list[str]]:
    """The job's one rank's GPU indexes and UUIDs."""
    (rank,) = ranks(sessions, job_id)
    return list(rank.gpu_indexes), list(rank.gpu_uuids)


def test_a_whole_gpu_job_lands_on_the_whole_gpu_never_the_sliced_one(
    mixed: sessionmaker[Session], clock: FakeClock
) -> None:
    first = submit(mixed, clock, gpus_per_node=1)
    second = submit(mixed, clock, gpus_per_node=1)
    pair = submit(mixed, clock, gpus_per_node=2)  # the node's two GPUs, but one of them is sliced
    assert set(tick(mixed, clock).placed) == {first}
    assert placed(mixed, first) == ([1], ["GPU-n1-1"])
    assert job(mixed, second).state is JobState.PENDING
    assert job(mixed, second).reason.startswith("resources")
    assert job(mixed, pair).reason.startswith("unschedulable")
    report(mixed, clock, first)
    assert tick(mixed, clock).placed == [second]
    assert placed(mixed, second) == ([1], ["GPU-n1-1"])
    report(mixed, clock, second)
    tick(mixed, clock)
    assert job(mixed, pair).state is JobState.PENDING
    assert ranks(mixed, pair) == []


def test_a_slice_job_gets_one_mig_device_and_its_gpu_index(mixed: sessionmaker[Session], clock: FakeClock) -> None:
    sliced = submit(mixed, clock, gpus_per_node=1, gpu_profile=ONE_G)
    assert tick(mixed, clock).placed == [sliced]
    indexes, uuids = placed(mixed, sliced)
    assert indexes == [0]
    assert len(uuids) == 1
    assert uuids[0] in DEVICES
    assert job(mixed, sliced).allocation == {"n1": [0]}
    # Two instances of one job: two devices, both on GPU 0.
    two = submit(mixed, clock, gpus_per_node=2, gpu_profile=ONE_G)
    assert tick(mixed, clock).placed == [two]
    indexes, more = placed(mixed, two)
    assert indexes == [0, 0]
    assert len(set(more)) == 2
    assert set(more) <= DEVICES - set(uuids)


def test_slice_jobs_never_share_a_device(mixed: sessionmaker[Session], clock: FakeClock) -> None:
    early = submit(mixed, clock, gpus_per_node=1, gpu_profile=ONE_G)  # placed alone, in a pass of its own
    tick(mixed, clock)
    later = [submit(mixed, clock, gpus_per_node=1, gpu_profile=ONE_G) for _ in range(7)]
    whole = submit(mixed, clock, gpus_per_node=1)
    assert set(tick(mixed, clock).placed) == {*later[:6], whole}
    held = {j: placed(mixed, j)[1][0] for j in [early, *later[:6]]}
    assert set(held.values()) == DEVICES  # seven jobs, seven devices, none twice
    assert placed(mixed, whole) == ([1], ["GPU-n1-1"])  # the whole GPU, beside the slices
    assert job(mixed, later[6]).state is JobState.PENDING
    # One ends: the last one gets exactly its device.
    report(mixed, clock, later[2])
    assert tick(mixed, clock).placed == [later[6]]
    assert placed(mixed, later[6]) == ([0], [held[later[2]]])


def test_a_gpu_bound_for_another_layout_takes_no_new_job(mixed: sessionmaker[Session], clock: FakeClock) -> None:
    running = submit(mixed, clock, gpus_per_node=1, gpu_profile=ONE_G)
    tick(mixed, clock)
    declare_on_node(mixed, "n1", "none")  # GPU 0 is to become whole; GPU 1 already is
    sliced = submit(mixed, clock, gpus_per_node=1, gpu_profile=ONE_G)
    whole = submit(mixed, clock, gpus_per_node=1)
    assert tick(mixed, clock).placed == [whole]
    assert placed(mixed, whole) == ([1], ["GPU-n1-1"])
    assert job(mixed, sliced).state is JobState.PENDING
    assert job(mixed, running).state is JobState.RUNNING  # what runs is left alone
    report(mixed, clock, running)
    tick(mixed, clock)
    assert job(mixed, sliced).state is JobState.PENDING  # its devices are free, but going away


def test_a_whole_gpu_bound_for_slices_takes_no_whole_job(mixed: sessionmaker[Session], clock: FakeClock) -> None:
    declare_on_node(mixed, "n1", "all-1g.18gb")  # GPU 0 matches; GPU 1 is to be sliced
    whole = submit(mixed, clock, gpus_per_node=1)
    sliced = submit(mixed, clock, gpus_per_node=1, gpu_profile=ONE_G)
    assert tick(mixed, clock).placed == [sliced]
    assert placed(mixed, sliced)[1][0] in DEVICES
    assert job(mixed, whole).state is JobState.PENDING


def test_a_layout_a_gpu_cannot_take_leaves_its_whole_gpus_usable(
    sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    add_node(sessions, clock, "t", [(T4, None)], layout="all-1g.18gb")  # a T4 has no MIG: shown, not applied
    users(sessions, clock, "alice")
    whole = submit(sessions, clock, gpus_per_node=1)
    assert tick(sessions, clock).placed == [whole]
    assert placed(sessions, whole) == ([0], ["GPU-t-0"])


def test_the_pass_counts_running_instances_against_the_quota(mixed: sessionmaker[Session], clock: FakeClock) -> None:
    add_node(mixed, clock, "n2", [(H200, [ONE_G] * 7)])
    project(mixed, clock, "vision", "alice", max_gpus=1)
    first = [submit(mixed, clock, as_user("alice"), project="vision", gpu_profile=ONE_G) for _ in range(5)]
    assert len(tick(mixed, clock).placed) == 5
    later = [submit(mixed, clock, as_user("alice"), project="vision", gpu_profile=ONE_G) for _ in range(3)]
    assert set(tick(mixed, clock).placed) == set(later[:2])  # 5/7 + 2/7 = 1 GPU: the quota
    assert job(mixed, later[2]).reason.startswith("quota")
    report(mixed, clock, first[0])
    assert tick(mixed, clock).placed == [later[2]]


def test_a_finished_1g_rank_of_700_s_counts_100_gpu_seconds(mixed: sessionmaker[Session], clock: FakeClock) -> None:
    project(mixed, clock, "vision", "alice")
    start = clock.now()
    sliced = submit(mixed, clock, as_user("alice"), project="vision", gpus_per_node=1, gpu_profile=ONE_G)
    whole = submit(mixed, clock, as_user("alice"), project="vision", gpus_per_node=1)
    tick(mixed, clock)
    clock.advance(700)
    report(mixed, clock, sliced)
    report(mixed, clock, whole)
    clock.advance(300)
    with transaction(mixed, readonly=True) as s:
        held = {h.job_id: h for h in accounting.holdings(s, start - 1)}
        by_job = {row.key: row.gpu_hours for row in accounting.usage_report(s, start, clock.now(), "job").rows}
        by_project = accounting.usage_report(s, start, clock.now(), "project").rows
        limits = accounting.project_limits(s, clock.now(), 1e8)
    assert held[sliced].gpus == pytest.approx(1 / 7)
    assert held[sliced].seconds_within(start, clock.now()) == pytest.approx(100)
    assert held[whole].seconds_within(start, clock.now()) == pytest.approx(700)
    assert by_job == {str(sliced): round(100 / 3600, 4), str(whole): round(700 / 3600, 4)}
    assert [(r.key, r.jobs, r.gpu_hours) for r in by_project] == [("vision", 2, round(800 / 3600, 4))]
    assert limits["vision"].usage == pytest.approx(800, rel=1e-4)


# -- submission ---------------------------------------------------------------------------------------


def _jobs(sessions: sessionmaker[Session]) -> int:
    with transaction(sessions, readonly=True) as s:
        return s.scalar(select(func.count()).select_from(Job)) or 0


def test_a_profile_no_gpu_offers_is_refused_naming_the_offered_ones(
    mixed: sessionmaker[Session], clock: FakeClock
) -> None:
    with pytest.raises(InvalidInput, match=r"1g\.99gb") as refused:
        submit(mixed, clock, gpus_per_node=1, gpu_profile="1g.99gb")
    for offered in PROFILES["H200"]:
        assert offered in str(refused.value)
    assert "1g.10gb" not in str(refused.value)  # an A100/H100 profile: no such GPU here
    assert _jobs(mixed) == 0
    # An H200 profile no layout makes yet is taken: it waits for one.
    waiting = submit(mixed, clock, gpus_per_node=1, gpu_profile="3g.71gb")
    tick(mixed, clock)
    assert job(mixed, waiting).state is JobState.PENDING


def test_a_profile_on_a_cluster_without_mig_is_refused(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    add_node(sessions, clock, "t", [(T4, None)])
    users(sessions, clock, "alice")
    with pytest.raises(InvalidInput, match="no GPU here has MIG"):
        submit(sessions, clock, gpus_per_node=1, gpu_profile=ONE_G)


def test_a_slice_job_runs_on_one_node_and_asks_for_one_device_or_more() -> None:
    with pytest.raises(ValidationError, match="one node"):
        JobSubmit(argv=["x"], nodes=2, gpus_per_node=1, gpu_profile=ONE_G)
    with pytest.raises(ValidationError, match="one node"):
        JobSubmit(argv=["x"], gpus_per_node=0, gpu_profile=ONE_G)
    with pytest.raises(ValidationError):
        JobSubmit(argv=["x"], gpu_profile="18gb")


@pytest.mark.parametrize(
    ("profile", "count", "allowed"),
    [
        (ONE_G, 7, True),  # 7 x 1/7 = 1 GPU
        (ONE_G, 8, False),  # 8/7
        ("3g.71gb", 2, True),  # 6/7
        ("3g.71gb", 3, False),  # 9/7
        ("7g.141gb", 1, True),
        (None, 1, True),
        (None, 2, False),
    ],
)
def test_the_quota_counts_instances_as_their_share_of_a_gpu(
    mixed: sessionmaker[Session], clock: FakeClock, profile: str | None, count: int, allowed: bool
) -> None:
    project(mixed, clock, "vision", "alice", max_gpus=1)
    spec = {"project": "vision", "gpus_per_node": count, "gpu_profile": profile}
    if allowed:
        submit(mixed, clock, as_user("alice"), **spec)
        assert _jobs(mixed) == 1
    else:
        with pytest.raises(InvalidInput, match="over project vision's quota"):
            submit(mixed, clock, as_user("alice"), **spec)
        assert _jobs(mixed) == 0


def test_the_budget_counts_instances_as_their_share_of_a_gpu(mixed: sessionmaker[Session], clock: FakeClock) -> None:
    project(mixed, clock, "vision", "alice", gpu_hours_budget=1)
    # 1 GPU-hour: a 1g job may ask 7 hours (7 x 1/7), not more.
    spec = {"project": "vision", "gpus_per_node": 1, "gpu_profile": ONE_G}
    submit(mixed, clock, as_user("alice"), time_limit_s=7 * 3600, **spec)
    with pytest.raises(InvalidInput, match="whole budget"):
        submit(mixed, clock, as_user("alice"), time_limit_s=7 * 3600 + 600, **spec)
    assert _jobs(mixed) == 1


# -- gpu_sharing changed under running jobs: a GPU is never given two ways ------------------------------


def set_sharing(sessions: sessionmaker[Session], name: str, value: str) -> None:
    with transaction(sessions) as s:
        node = s.scalars(select(Node).where(Node.name == name)).one()
        categories.update_node_settings(s, node, set_={"gpu_sharing": value})


@pytest.fixture
def one_gpu(sessions: sessionmaker[Session], clock: FakeClock) -> sessionmaker[Session]:
    """Node s1 with one whole H200; user alice."""
    add_node(sessions, clock, "s1", [(H200, None)])
    users(sessions, clock, "alice")
    return sessions


def test_a_gpu_held_whole_is_not_shared_when_the_node_starts_sharing(
    one_gpu: sessionmaker[Session], clock: FakeClock
) -> None:
    whole = submit(one_gpu, clock, gpus_per_node=1)
    assert tick(one_gpu, clock).placed == [whole]
    set_sharing(one_gpu, "s1", "time-slicing:4")
    replica = submit(one_gpu, clock, gpus_per_node=1, gpu_profile="shared")
    assert tick(one_gpu, clock).placed == []
    report(one_gpu, clock, whole)  # its GPU is free: now it is shared
    assert tick(one_gpu, clock).placed == [replica]
    assert placed(one_gpu, replica)[1] == ["GPU-s1-0@time-slicing:0/4"]


def test_replicas_of_another_mode_keep_the_gpu_until_they_end(one_gpu: sessionmaker[Session], clock: FakeClock) -> None:
    set_sharing(one_gpu, "s1", "time-slicing:2")
    first = [submit(one_gpu, clock, gpus_per_node=1, gpu_profile="shared") for _ in range(2)]
    assert sorted(tick(one_gpu, clock).placed) == sorted(first)
    set_sharing(one_gpu, "s1", "mps:2")
    later = submit(one_gpu, clock, gpus_per_node=1, gpu_profile="shared")
    whole = submit(one_gpu, clock, gpus_per_node=1)
    assert tick(one_gpu, clock).placed == []  # neither 2 more MPS clients beside 2 time-sliced ones...
    set_sharing(one_gpu, "s1", "exclusive")
    assert tick(one_gpu, clock).placed == []  # ...nor the whole GPU under running replicas
    for job_id in first:
        report(one_gpu, clock, job_id)
    assert tick(one_gpu, clock).placed == [whole]
    assert job(one_gpu, later).state is JobState.PENDING
