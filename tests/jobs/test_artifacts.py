"""The model and dataset registries against the database (jobs.artifacts): registering, who may use what,
what a job carries, the node caches the agents report, and the scheduler's data locality (in the database
through a tick, then as a pure function over random clusters)."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

import tests.jobs.test_scheduler as base
from gpufleet.core.clock import FakeClock
from gpufleet.core.db import transaction
from gpufleet.core.errors import Conflict, Forbidden, InvalidInput, NotFound
from gpufleet.jobs import artifacts, submission
from gpufleet.jobs.models import Artifact, Job, NodeArtifact
from gpufleet.jobs.scheduler import JobRequest, NodeView, Policy, ProjectLimits, RunningJob, schedule
from gpufleet.jobs.schemas import ArtifactIn, JobSubmit
from gpufleet.protocol.artifacts import CacheEntry, NodeCache
from tests.jobs.helpers import (
    ADMIN,
    LIMITS,
    as_user,
    cluster,
    job,
    node_id,
    project,
    ranks,
    submit,
    tick,
    users,
)

# One database: resolution logic (test_lifecycle runs the job tables on both).
pytestmark = pytest.mark.one_database

SHA_A = "a" * 64
SHA_B = "b" * 64
SHA_C = "c" * 64


def register(sessions: sessionmaker[Session], clock: FakeClock, **spec: Any) -> Artifact:
    spec.setdefault("kind", "dataset")
    spec.setdefault("name", "imagenet")
    spec.setdefault("version", "1")
    spec.setdefault("location", "/shared/datasets/imagenet")
    spec.setdefault("sha256", SHA_A)
    spec.setdefault("size_bytes", 1000)
    with transaction(sessions) as s:
        row = artifacts.register(s, clock, "user:admin", ArtifactIn(**spec))
        s.flush()
        s.expunge(row)
        return row


@pytest.fixture
def teams(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    """Two nodes; alice in alpha, bob in beta, carol in gamma."""
    cluster(sessions, clock, nodes=2)
    users(sessions, clock, "alice", "bob", "carol")
    project(sessions, clock, "alpha", "alice")
    project(sessions, clock, "beta", "bob")
    project(sessions, clock, "gamma", "carol")


def _report(sessions: sessionmaker[Session], node: str, *shas: str, uses: int = 1) -> None:
    entries = [CacheEntry(sha256=s, size_bytes=10, copied_at=100.0, last_used_at=200.0, uses=uses) for s in shas]
    with transaction(sessions) as s:
        artifacts.record_cache(s, node_id(sessions, node), NodeCache(limit_bytes=10**9, entries=entries))


# --- the registry ----------------------------------------------------------------------------------


def test_register_then_list_show_and_remove(sessions: sessionmaker[Session], clock: FakeClock, teams: None) -> None:
    row = register(sessions, clock, project="alpha", shared_with=["beta", "alpha", "beta"], licence="cc-by-4.0")
    assert (row.ref, row.project, row.shared_with, row.created_by) == ("imagenet:1", "alpha", ["beta"], "user:admin")
    register(sessions, clock, version="2", sha256=SHA_B)
    register(sessions, clock, kind="model", name="imagenet", version="1", sha256=SHA_C)  # another registry
    with transaction(sessions, readonly=True) as s:
        assert [r.ref for r in artifacts.listing(s, "dataset")] == ["imagenet:1", "imagenet:2"]
        assert [r.ref for r in artifacts.listing(s, "model")] == ["imagenet:1"]
        assert artifacts.get(s, "dataset", "imagenet").version == "2"  # a bare name: the one registered last
        assert artifacts.get(s, "dataset", "imagenet:1").sha256 == SHA_A
        with pytest.raises(NotFound, match="no dataset imagenet:3"):
            artifacts.get(s, "dataset", "imagenet:3")
    with transaction(sessions) as s:
        with pytest.raises(InvalidInput, match="imagenet:VERSION"):
            artifacts.remove(s, "dataset", "imagenet")
        artifacts.remove(s, "dataset", "imagenet:2")
    with transaction(sessions, readonly=True) as s:
        assert [r.ref for r in artifacts.listing(s, "dataset")] == ["imagenet:1"]
        assert artifacts.get(s, "dataset", "imagenet").version == "1"


def test_a_duplicate_version_is_a_conflict_and_the_session_stays_usable(
    sessions: sessionmaker[Session], clock: FakeClock, teams: None
) -> None:
    register(sessions, clock)

    def spec(version: str) -> ArtifactIn:
        return ArtifactIn(kind="dataset", name="imagenet", version=version, location="/x", sha256=SHA_B, size_bytes=1)

    with transaction(sessions) as s:
        with pytest.raises(Conflict, match="dataset imagenet:1 exists"):
            artifacts.register(s, clock, "user:admin", spec("1"))
        # The same transaction goes on (the failed insert was a savepoint).
        artifacts.register(s, clock, "user:admin", spec("1b"))
    with transaction(sessions, readonly=True) as s:
        assert s.scalar(select(func.count()).select_from(Artifact)) == 2


def test_unknown_projects_and_unstageable_locations_are_refused(
    sessions: sessionmaker[Session], clock: FakeClock, teams: None
) -> None:
    with pytest.raises(NotFound, match="nope"):
        register(sessions, clock, project="nope")
    with pytest.raises(NotFound, match="nobody"):
        register(sessions, clock, project="alpha", shared_with=["nobody"])
    with pytest.raises(InvalidInput, match="absolute path"):
        register(sessions, clock, location="s3://bucket/imagenet")
    with pytest.raises(InvalidInput, match="absolute path"):
        register(sessions, clock, location="datasets/imagenet")
    with transaction(sessions, readonly=True) as s:
        assert s.scalar(select(func.count()).select_from(Artifact)) == 0


# --- who may use what ------------------------------------------------------------------------------


def test_for_job_refuses_another_projects_dataset_and_allows_owner_shared_and_open(
    sessions: sessionmaker[Session], clock: FakeClock, teams: None
) -> None:
    register(sessions, clock, name="private", project="alpha", shared_with=["beta"], sha256=SHA_A)
    register(sessions, clock, name="open", sha256=SHA_B)
    register(sessions, clock, kind="model", name="llama", project="alpha", sha256=SHA_C)
    with transaction(sessions, readonly=True) as s:
        owner = artifacts.for_job(s, "alpha", "llama", ["private", "open"])
        assert [(r.kind, r.ref, r.sha256) for r in owner] == [
            ("model", "llama:1", SHA_C),
            ("dataset", "private:1", SHA_A),
            ("dataset", "open:1", SHA_B),
        ]
        assert owner[1].source == "/shared/datasets/imagenet"
        assert owner[1].size_bytes == 1000
        assert [r.ref for r in artifacts.for_job(s, "beta", None, ["private:1"])] == ["private:1"]
        for who in ("gamma", None):
            assert [r.ref for r in artifacts.for_job(s, who, None, ["open"])] == ["open:1"]
        with pytest.raises(Forbidden) as refused:
            artifacts.for_job(s, "gamma", None, ["open", "private"])
        assert "dataset private:1 belongs to project alpha and beta" in str(refused.value)
        assert "project gamma may not use it" in str(refused.value)
        with pytest.raises(Forbidden, match="a job with no project may not use it"):
            artifacts.for_job(s, None, None, ["private"])
        with pytest.raises(Forbidden, match="model llama:1 belongs to project alpha;"):
            artifacts.for_job(s, "beta", "llama", [])
        with pytest.raises(NotFound, match="no dataset missing"):
            artifacts.for_job(s, "alpha", None, ["missing"])


def test_one_checksum_named_twice_is_staged_once(
    sessions: sessionmaker[Session], clock: FakeClock, teams: None
) -> None:
    register(sessions, clock, name="one", sha256=SHA_A)
    register(sessions, clock, name="same-bytes", sha256=SHA_A)
    with transaction(sessions, readonly=True) as s:
        assert [r.ref for r in artifacts.for_job(s, None, None, ["one", "same-bytes", "one:1"])] == ["one:1"]


def test_a_submitted_job_carries_what_it_stages_and_another_project_is_refused(
    sessions: sessionmaker[Session], clock: FakeClock, teams: None
) -> None:
    register(sessions, clock, project="alpha")
    register(sessions, clock, kind="model", name="llama", location="file:///shared/llama.bin", sha256=SHA_C)
    job_id = submit(sessions, clock, as_user("alice"), datasets=["imagenet"], model="llama:1")
    stored = job(sessions, job_id)
    assert stored.project == "alpha"
    assert stored.artifacts == [
        {"kind": "model", "name": "llama", "version": "1", "sha256": SHA_C, "size_bytes": 1000,
         "source": "file:///shared/llama.bin"},
        {"kind": "dataset", "name": "imagenet", "version": "1", "sha256": SHA_A, "size_bytes": 1000,
         "source": "/shared/datasets/imagenet"},
    ]  # fmt: skip
    # Removing the registration later changes nothing for the queued job.
    with transaction(sessions) as s:
        artifacts.remove(s, "dataset", "imagenet:1")
    assert len(job(sessions, job_id).artifacts) == 2

    register(sessions, clock, name="secret", project="alpha", sha256=SHA_B)
    with pytest.raises(Forbidden, match="dataset secret:1 belongs to project alpha; project beta may not use it"):
        submit(sessions, clock, as_user("bob"), datasets=["secret"])
    with pytest.raises(Forbidden, match="project beta may not use it"):
        submit(sessions, clock, ADMIN, user="bob", project="beta", datasets=["secret"])  # not even for an admin
    with transaction(sessions, readonly=True) as s:
        assert [j.user for j in s.scalars(select(Job))] == ["alice"]


def test_slurm_jobs_cannot_stage_models_or_datasets(
    sessions: sessionmaker[Session], clock: FakeClock, teams: None
) -> None:
    register(sessions, clock)
    spec = JobSubmit(argv=["train"], user="alice", datasets=["imagenet"])
    with transaction(sessions) as s:
        with pytest.raises(InvalidInput, match="staged by gpufleet's agents"):
            submission.submit(s, clock, ADMIN, spec, LIMITS, backend="slurm")
        plain = submission.submit(s, clock, ADMIN, JobSubmit(argv=["train"], user="alice"), LIMITS, backend="slurm")
        assert plain.artifacts == []


# --- node caches -----------------------------------------------------------------------------------


def test_record_cache_replaces_a_nodes_rows(sessions: sessionmaker[Session], clock: FakeClock, teams: None) -> None:
    register(sessions, clock, name="one", sha256=SHA_A)
    register(sessions, clock, name="two", sha256=SHA_B, project="beta")
    _report(sessions, "n1", SHA_A, SHA_B, uses=3)
    _report(sessions, "n2", SHA_A)
    with transaction(sessions, readonly=True) as s:
        assert artifacts.cached_by_node(s, {SHA_A, SHA_B, SHA_C}) == {
            node_id(sessions, "n1"): frozenset({SHA_A, SHA_B}),
            node_id(sessions, "n2"): frozenset({SHA_A}),
        }
        # Only the checksums asked for (a pass asks for what queued jobs need), none when none are asked.
        assert artifacts.cached_by_node(s, {SHA_B}) == {node_id(sessions, "n1"): frozenset({SHA_B})}
        assert artifacts.cached_by_node(s, set()) == {}
        shown = artifacts.node_cache(s, node_id(sessions, "n1"))
        assert sorted((e.sha256, e.uses, e.artifacts[0]) for e in shown) == [
            (SHA_A, 3, "dataset one:1"),
            (SHA_B, 3, "dataset two:1"),
        ]
        assert shown[0].copied_at == datetime.fromtimestamp(100.0, shown[0].copied_at.tzinfo)
        one = artifacts.get(s, "dataset", "one")
        assert artifacts.out(s, one).nodes == ["n1", "n2"]
    _report(sessions, "n1", SHA_C)  # n1 evicted both, copied something unregistered
    _report(sessions, "n2")  # n2 emptied
    with transaction(sessions, readonly=True) as s:
        assert artifacts.cached_by_node(s, {SHA_A, SHA_B, SHA_C}) == {node_id(sessions, "n1"): frozenset({SHA_C})}
        assert s.scalar(select(func.count()).select_from(NodeArtifact)) == 1
        assert artifacts.out(s, artifacts.get(s, "dataset", "one")).nodes == []
        assert [e.artifacts for e in artifacts.node_cache(s, node_id(sessions, "n1"))] == [[]]


# --- data locality through a tick ------------------------------------------------------------------


def test_a_job_goes_to_the_node_caching_its_dataset_even_where_pack_would_not(
    sessions: sessionmaker[Session], clock: FakeClock, teams: None
) -> None:
    register(sessions, clock)
    filler = submit(sessions, clock, gpus_per_node=4)
    tick(sessions, clock)
    assert ranks(sessions, filler)[0].node == "n1"
    # Pack now puts a one-GPU job on n1, the fuller node ...
    plain = submit(sessions, clock, gpus_per_node=1)
    tick(sessions, clock)
    assert ranks(sessions, plain)[0].node == "n1"
    # ... but a job whose dataset n2 caches goes to n2: no copy before it starts.
    _report(sessions, "n2", SHA_A)
    local = submit(sessions, clock, gpus_per_node=1, datasets=["imagenet"])
    tick(sessions, clock)
    assert ranks(sessions, local)[0].node == "n2"


def test_without_a_fitting_holder_placement_is_as_usual(
    sessions: sessionmaker[Session], clock: FakeClock, teams: None
) -> None:
    register(sessions, clock)
    full = submit(sessions, clock, gpus_per_node=8)
    tick(sessions, clock)
    holder = ranks(sessions, full)[0].node
    other = "n2" if holder == "n1" else "n1"
    _report(sessions, holder, SHA_A)  # the holder has no GPU free
    waiting = submit(sessions, clock, gpus_per_node=1, datasets=["imagenet"])
    tick(sessions, clock)
    assert ranks(sessions, waiting)[0].node == other


# --- data locality as a pure function --------------------------------------------------------------

DATA = [SHA_A, SHA_B, SHA_C]


@st.composite
def data_scenarios(
    draw: st.DrawFn,
) -> tuple[list[NodeView], list[RunningJob], list[JobRequest], dict[str, ProjectLimits], Policy]:
    nodes, running, queue, projects, policy = draw(base.scenarios())
    nodes = [replace(n, cached=draw(st.frozensets(st.sampled_from(DATA)))) for n in nodes]
    queue = [replace(j, data=draw(st.frozensets(st.sampled_from(DATA)))) for j in queue]
    return nodes, running, queue, projects, policy


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data_scenarios())
def test_placement_with_data_keeps_every_invariant(
    case: tuple[list[NodeView], list[RunningJob], list[JobRequest], dict[str, ProjectLimits], Policy],
) -> None:
    """The scheduler's properties (no GPU given twice, gangs whole, CPUs and quotas kept, the reservation
    never delayed) hold with nodes caching data and jobs asking for it."""
    base.test_invariants.hypothesis.inner_test(case)  # type: ignore[attr-defined]
    base.test_nothing_placed_delays_the_reservation.hypothesis.inner_test(case)  # type: ignore[attr-defined]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 8), st.frozensets(st.sampled_from(DATA)), st.sampled_from([None, "a"])),
        min_size=1,
        max_size=6,
    ),
    st.integers(0, 8),
    st.frozensets(st.sampled_from(DATA), min_size=1),
    st.sampled_from(["pack", "spread"]),
)
def test_a_lone_job_lands_on_a_fitting_node_holding_the_most_of_its_data(
    shape: list[tuple[int, frozenset[str], str | None]], gpus: int, data: frozenset[str], placement: str
) -> None:
    nodes = [
        NodeView(name=f"n{i}", gpu_count=8, gpus=frozenset(range(free)), cpus_free=16, category=cat, cached=cached)
        for i, (free, cached, cat) in enumerate(shape)
    ]
    request = JobRequest(id="j", project="p", gpus_per_node=gpus, data=data)
    d = schedule(nodes, [], [request], {}, 0.0, Policy(default=placement))  # type: ignore[arg-type]
    fitting = [n for n in nodes if len(n.gpus) >= gpus]
    if not fitting:
        assert d.placements == []
        return
    (placed,) = d.placements
    (name,) = placed.allocation
    chosen = next(n for n in nodes if n.name == name)
    best = max(len(n.cached & data) for n in fitting)
    assert len(chosen.cached & data) == best
    if best == 0:  # no holder fits: exactly where it would go without data
        plain = schedule(nodes, [], [replace(request, data=frozenset())], {}, 0.0, Policy(default=placement))  # type: ignore[arg-type]
        assert placed == plain.placements[0]
