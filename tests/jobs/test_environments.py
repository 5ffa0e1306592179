"""Runtime environments against the database: the catalog, which nodes' drivers run an environment, and
jobs submitted in one (what they carry, where the scheduler puts them, why they wait)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from pydantic import ValidationError
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.core.clock import FakeClock, to_datetime
from gpufleet.core.db import transaction
from gpufleet.core.errors import Conflict, InvalidInput, NotFound
from gpufleet.inventory import service as inventory
from gpufleet.inventory.schemas import NodeSettings
from gpufleet.inventory.states import NodeState
from gpufleet.jobs import environments
from gpufleet.jobs.environments import NodeFit
from gpufleet.jobs.models import Environment, Job, JobState
from gpufleet.jobs.schemas import EnvironmentIn
from gpufleet.jobs.tick import DRIVER_REASON
from gpufleet.protocol.jobs import DEFAULT_PATH, MAX_ENV
from tests.jobs.helpers import gpu_report, job, node_id, ranks, set_node, submit, tick, users

# One database: resolution logic (test_lifecycle runs the job tables on both).
pytestmark = pytest.mark.one_database

OLD = "535.183.01"  # runs CUDA up to 12.2
NEW = "550.127.05"  # runs CUDA 12.4: 550.127.05 >= 550.54.14 as numbers, though not as text
IMAGE = "nvcr.io/nvidia/pytorch:24.05-py3"


def gpu_node(
    sessions: sessionmaker[Session], clock: FakeClock, name: str, drivers: list[str | None], **values: Any
) -> None:
    """A node, up and healthy, whose GPUs report these drivers (one GPU each); no GPUs: a CPU-only node."""
    with transaction(sessions) as s:
        (node,) = inventory.add_nodes(s, clock, [name], NodeSettings())
        report = gpu_report(name, drivers)
        inventory.apply_inventory(s, clock, node, report)
        node.state = NodeState.UP
        node.health = "healthy"
        for key, value in values.items():
            setattr(node, key, value)


def add_env(sessions: sessionmaker[Session], clock: FakeClock, **spec: Any) -> Environment:
    spec.setdefault("name", "pytorch")
    spec.setdefault("version", "24.05")
    spec.setdefault("cuda", "12.4")
    if "python_prefix" not in spec:
        spec.setdefault("image", IMAGE)
    with transaction(sessions) as s:
        env = environments.add(s, clock, "user:admin", EnvironmentIn(**spec))
        s.flush()
        s.expunge(env)
        return env


def get_env(sessions: sessionmaker[Session], ref: str) -> Environment:
    with transaction(sessions, readonly=True) as s:
        env = environments.get(s, ref)
        s.expunge(env)
        return env


def all_envs(sessions: sessionmaker[Session]) -> list[tuple[str, str | None, str]]:
    with transaction(sessions, readonly=True) as s:
        return [(e.ref, e.image, e.description) for e in environments.listing(s)]


def fits(sessions: sessionmaker[Session], ref: str) -> list[NodeFit]:
    with transaction(sessions, readonly=True) as s:
        return environments.check(environments.fleet(s), environments.get(s, ref))


def drivers_by_name(sessions: sessionmaker[Session], *names: str) -> dict[str, tuple[int, ...] | None]:
    with transaction(sessions, readonly=True) as s:
        found = environments.node_drivers(s)
    return {name: found.get(node_id(sessions, name)) for name in names}


def count_jobs(sessions: sessionmaker[Session]) -> int:
    with transaction(sessions, readonly=True) as s:
        return s.scalar(select(func.count()).select_from(Job)) or 0


# --- the catalog ----------------------------------------------------------------------------------


def test_add_takes_the_driver_from_the_cuda_version(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    env = add_env(sessions, clock, cuda="12.4.1", pytorch="2.4.0", description="NGC PyTorch")
    assert (env.ref, env.min_driver, env.driver_given) == ("pytorch:24.05", "550.54.14", False)
    assert (env.image, env.python_prefix, env.cuda, env.pytorch) == (IMAGE, None, "12.4.1", "2.4.0")
    assert env.created_by == "user:admin"
    assert get_env(sessions, "pytorch:24.05").min_driver == "550.54.14"  # stored, not only returned


def test_add_keeps_a_driver_it_is_given(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    # CUDA 12.x minor version compatibility: the environment says it runs on the 12.0 driver.
    env = add_env(sessions, clock, version="compat", cuda="12.4", min_driver="525.60.13")
    assert (env.min_driver, env.driver_given) == ("525.60.13", True)
    # A CUDA version the table lacks is accepted only with its driver, written as NVIDIA writes it.
    env = add_env(sessions, clock, version="next", cuda="14.2", min_driver="600.1.2")
    assert (env.min_driver, env.driver_given) == ("600.01.02", True)


def test_a_cuda_version_outside_the_table_needs_a_driver(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    with pytest.raises(InvalidInput, match="--min-driver"):
        add_env(sessions, clock, cuda="14.2")
    assert all_envs(sessions) == []


def test_the_same_name_and_version_twice_is_a_conflict(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    add_env(sessions, clock, description="first")
    with pytest.raises(Conflict, match=r"pytorch:24\.05 exists"):
        add_env(sessions, clock, image="other/image:1", description="second")
    assert all_envs(sessions) == [("pytorch:24.05", IMAGE, "first")]
    add_env(sessions, clock, version="24.06", description="another version is fine")
    assert [ref for ref, _, _ in all_envs(sessions)] == ["pytorch:24.05", "pytorch:24.06"]


def test_a_conflict_leaves_the_transaction_usable(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    add_env(sessions, clock)
    with transaction(sessions) as s:
        with pytest.raises(Conflict):
            environments.add(
                s, clock, "user:admin", EnvironmentIn(name="pytorch", version="24.05", image=IMAGE, cuda="12.4")
            )
        environments.add(
            s, clock, "user:admin", EnvironmentIn(name="pytorch", version="24.06", image=IMAGE, cuda="12.4")
        )
    assert [ref for ref, _, _ in all_envs(sessions)] == ["pytorch:24.05", "pytorch:24.06"]


def test_get_a_version_or_the_last_added(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    add_env(sessions, clock, version="24.05")
    add_env(sessions, clock, version="23.10", cuda="12.2")  # added last, though an older release
    add_env(sessions, clock, name="jax", version="0.4", cuda="12.0")
    assert get_env(sessions, "pytorch").ref == "pytorch:23.10"
    assert get_env(sessions, "pytorch:24.05").ref == "pytorch:24.05"
    assert get_env(sessions, "pytorch:24.05").min_driver == "550.54.14"
    assert get_env(sessions, "jax").ref == "jax:0.4"
    for unknown in ("tensorflow", "pytorch:99.99", "jax:0.5"):
        with pytest.raises(NotFound, match=unknown):
            get_env(sessions, unknown)


def test_remove_needs_the_version(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    add_env(sessions, clock, version="24.05")
    add_env(sessions, clock, version="24.06")
    for bare in ("pytorch", "pytorch:"):  # "pytorch:" must not mean "the last added" here
        with transaction(sessions) as s, pytest.raises(InvalidInput, match="pytorch:VERSION"):
            environments.remove(s, bare)
    assert len(all_envs(sessions)) == 2
    with transaction(sessions) as s:
        assert environments.remove(s, "pytorch:24.06").ref == "pytorch:24.06"
    assert [ref for ref, _, _ in all_envs(sessions)] == ["pytorch:24.05"]
    assert get_env(sessions, "pytorch").ref == "pytorch:24.05"  # the last added left: the one before it
    with transaction(sessions) as s, pytest.raises(NotFound):
        environments.remove(s, "pytorch:24.06")


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"python_prefix": "/opt/envs/torch"}, "not both"),  # an image and a prefix
        ({"image": None}, "not both and not neither"),
        ({"image": None, "python_prefix": "opt/envs/torch"}, "python_prefix"),
        ({"image": None, "python_prefix": "/opt/envs/torch x"}, "python_prefix"),
        ({"cuda": "12"}, "cuda"),
        ({"cuda": "twelve"}, "cuda"),
        ({"cuda": "12.4.1.1"}, "cuda"),
        ({"min_driver": "550.54.14.1"}, "min_driver"),
        ({"min_driver": "latest"}, "min_driver"),
        ({"image": "bad image"}, "image"),
        ({"name": "PyTorch"}, "name"),
        ({"name": "pytorch:24.05"}, "name"),
        ({"version": "-1"}, "version"),
        ({"description": "a\x00b"}, "NUL"),
        ({"gpus": 1}, "gpus"),
    ],
)
def test_environment_in_refuses_malformed_specs(change: dict[str, Any], match: str) -> None:
    spec: dict[str, Any] = {"name": "pytorch", "version": "24.05", "image": IMAGE, "cuda": "12.4"} | change
    with pytest.raises(ValidationError, match=match):
        EnvironmentIn(**spec)


def test_environment_in_accepts_a_python_prefix_alone() -> None:
    spec = EnvironmentIn(name="torch-venv", version="2.4.0+cu124", python_prefix="/opt/envs/torch-2.4", cuda="12.4")
    assert (spec.image, spec.python_prefix, spec.min_driver) == (None, "/opt/envs/torch-2.4", None)


# --- which nodes run an environment ---------------------------------------------------------------


def test_node_drivers_takes_the_oldest_readable_driver(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    gpu_node(sessions, clock, "mixed", [NEW, OLD, "550.54.14"])
    gpu_node(sessions, clock, "text-order", ["550.54.14", "550.127.05"])  # the oldest as numbers, not text
    gpu_node(sessions, clock, "partly-garbled", ["garbage", NEW, None])
    gpu_node(sessions, clock, "garbled", ["n/a", "550.54.14.99"])
    gpu_node(sessions, clock, "silent", [None, None])
    gpu_node(sessions, clock, "cpu", [])
    assert drivers_by_name(sessions, "mixed", "text-order", "partly-garbled", "garbled", "silent", "cpu") == {
        "mixed": (535, 183, 1),
        "text-order": (550, 54, 14),
        "partly-garbled": (550, 127, 5),
        "garbled": None,
        "silent": None,
        "cpu": None,
    }


def test_check_says_which_nodes_run_it_and_why_not(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    gpu_node(sessions, clock, "a-old", [OLD, OLD])
    gpu_node(sessions, clock, "b-new", [NEW, NEW])
    gpu_node(sessions, clock, "c-unknown", [None, None])
    gpu_node(sessions, clock, "d-drained", [NEW], drained_at=to_datetime(clock.now()), drain_reason="repair")
    gpu_node(sessions, clock, "e-cpu", [])
    gpu_node(sessions, clock, "f-ancient", ["440.33.01"])
    gpu_node(sessions, clock, "g-down", [NEW], state=NodeState.DOWN)
    gpu_node(sessions, clock, "h-lost", [], expected_gpus=4)  # its GPUs fell off the bus: still a GPU node
    add_env(sessions, clock)
    found = {fit.node: fit for fit in fits(sessions, "pytorch")}
    assert list(found) == ["a-old", "b-new", "c-unknown", "d-drained", "f-ancient", "g-down", "h-lost"]

    old = found["a-old"]
    assert (old.driver, old.ok) == (OLD, False)
    assert old.reason == "driver 535.183.01, which runs CUDA up to 12.2; CUDA 12.4 needs 550.54.14 or newer"
    assert found["b-new"] == NodeFit("b-new", NEW, True, True, "driver 550.127.05 >= 550.54.14")
    assert found["c-unknown"] == NodeFit(
        "c-unknown", None, False, True, "its NVIDIA driver is not known (no GPU inventory reported)"
    )
    assert (found["h-lost"].driver, found["h-lost"].ok) == (None, False)
    drained = found["d-drained"]
    assert (drained.driver, drained.ok, drained.takes_jobs) == (NEW, True, False)
    assert "takes no jobs now" in drained.reason
    assert "drained" in drained.reason
    assert (found["g-down"].ok, found["g-down"].takes_jobs) == (True, False)
    # What can run it now: b-new alone (d-drained and g-down have the driver but take no jobs).
    assert environments.runnable(list(found.values())) == 1
    assert "takes no jobs now (down" in found["g-down"].reason
    ancient = found["f-ancient"]
    assert (ancient.driver, ancient.ok) == ("440.33.01", False)
    assert ancient.reason == "driver 440.33.01; CUDA 12.4 needs 550.54.14 or newer"  # older than the whole table


def test_check_names_a_given_driver_as_the_environments_own(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    gpu_node(sessions, clock, "n1", [OLD])
    add_env(sessions, clock, version="pinned", min_driver="560.28.03")
    (fit,) = fits(sessions, "pytorch:pinned")
    assert not fit.ok
    assert fit.reason == "driver 535.183.01, which runs CUDA up to 12.2; it names 560.28.03 or newer"


# --- jobs in an environment -----------------------------------------------------------------------


@pytest.fixture
def fleet(sessions: sessionmaker[Session], clock: FakeClock) -> sessionmaker[Session]:
    """n1 has an old driver, n2 a new one: 8 GPUs each. alice may submit."""
    gpu_node(sessions, clock, "n1", [OLD] * 8)
    gpu_node(sessions, clock, "n2", [NEW] * 8)
    users(sessions, clock, "alice")
    return sessions


def test_a_job_in_an_image_environment_carries_it(fleet: sessionmaker[Session], clock: FakeClock) -> None:
    add_env(fleet, clock, version="24.05")
    add_env(fleet, clock, version="24.06", cuda="12.5")
    queued = job(fleet, submit(fleet, clock, environment="pytorch:24.05", env={"SEED": "1"}))
    assert queued.container == IMAGE
    assert queued.environment == "pytorch:24.05"
    assert queued.min_driver == "550.54.14"
    assert queued.env == {"GPUFLEET_ENVIRONMENT": "pytorch:24.05", "SEED": "1"}
    latest = job(fleet, submit(fleet, clock, environment="pytorch"))
    assert (latest.environment, latest.min_driver) == ("pytorch:24.06", "555.42.02")
    assert latest.env == {"GPUFLEET_ENVIRONMENT": "pytorch:24.06"}
    same = job(fleet, submit(fleet, clock, environment="pytorch:24.05", container=IMAGE))  # naming it again is fine
    assert same.container == IMAGE
    plain = job(fleet, submit(fleet, clock))
    assert (plain.environment, plain.min_driver, plain.container, plain.env) == (None, None, None, {})


def test_a_job_in_a_python_environment_gets_its_paths(fleet: sessionmaker[Session], clock: FakeClock) -> None:
    add_env(fleet, clock, name="torch", version="2.4", python_prefix="/opt/envs/torch-2.4")
    queued = job(fleet, submit(fleet, clock, environment="torch:2.4"))
    assert queued.container is None
    assert queued.env == {
        "GPUFLEET_ENVIRONMENT": "torch:2.4",
        "VIRTUAL_ENV": "/opt/envs/torch-2.4",
        "PATH": f"/opt/envs/torch-2.4/bin:{DEFAULT_PATH}",
    }
    # The job's own --export values win, but it cannot claim to run in another environment.
    mine = {"PATH": "/home/alice/bin:/usr/bin", "GPUFLEET_ENVIRONMENT": "other:1", "SEED": "7"}
    queued = job(fleet, submit(fleet, clock, environment="torch", env=mine))
    assert queued.env == {
        "GPUFLEET_ENVIRONMENT": "torch:2.4",
        "VIRTUAL_ENV": "/opt/envs/torch-2.4",
        "PATH": "/home/alice/bin:/usr/bin",
        "SEED": "7",
    }
    assert queued.min_driver == "550.54.14"


def test_a_job_refused_for_its_environment_queues_nothing(fleet: sessionmaker[Session], clock: FakeClock) -> None:
    add_env(fleet, clock)
    with pytest.raises(InvalidInput, match=re.escape(f"runs in {IMAGE}")):
        submit(fleet, clock, environment="pytorch:24.05", container="ubuntu:24.04")
    with pytest.raises(NotFound, match="pytorch:99"):
        submit(fleet, clock, environment="pytorch:99")
    assert count_jobs(fleet) == 0


def test_the_scheduler_puts_environment_jobs_only_on_new_drivers(
    fleet: sessionmaker[Session], clock: FakeClock
) -> None:
    add_env(fleet, clock)
    ids = [submit(fleet, clock, environment="pytorch") for _ in range(9)]
    plain = submit(fleet, clock, gpus_per_node=8)
    result = tick(fleet, clock)
    assert sorted(result.placed) == sorted([*ids[:8], plain])
    assert {r.node for i in ids[:8] for r in ranks(fleet, i)} == {"n2"}
    assert [r.node for r in ranks(fleet, plain)] == ["n1"]  # the old node is no worse for jobs needing no driver
    # The ninth fits on no new-enough node now; one will free up, so it waits for resources.
    waiting = job(fleet, ids[8])
    assert waiting.state is JobState.PENDING
    assert waiting.reason.startswith("resources")


def test_the_scheduler_leaves_the_old_node_idle_rather_than_break_the_job(
    fleet: sessionmaker[Session], clock: FakeClock
) -> None:
    add_env(fleet, clock)
    set_node(fleet, "n2", drained_at=to_datetime(clock.now()))
    queued = submit(fleet, clock, environment="pytorch")
    assert tick(fleet, clock).placed == []
    assert ranks(fleet, queued) == []
    waiting = job(fleet, queued)
    assert waiting.state is JobState.PENDING
    assert waiting.reason == DRIVER_REASON.format(driver="550.54.14")


def test_a_job_needing_a_driver_no_node_has_waits_and_says_which(
    fleet: sessionmaker[Session], clock: FakeClock
) -> None:
    add_env(fleet, clock, name="cuda13", version="1", cuda="13.0")
    queued = submit(fleet, clock, environment="cuda13:1")  # accepted: a node may be upgraded
    assert job(fleet, queued).min_driver == "580.65.06"
    tick(fleet, clock)
    waiting = job(fleet, queued)
    assert waiting.state is JobState.PENDING
    assert waiting.reason == DRIVER_REASON.format(driver="580.65.06")
    assert "580.65.06" in waiting.reason
    assert waiting.reason.startswith("unschedulable")
    # Once a node's agent reports a new-enough driver, the next pass runs it there.
    with transaction(fleet) as s:
        node = inventory.get_node(s, "n2")
        report = gpu_report("n2", ["580.95.05"] * 8)
        inventory.apply_inventory(s, clock, node, report)
    assert tick(fleet, clock).placed == [queued]
    assert [r.node for r in ranks(fleet, queued)] == ["n2"]


def test_the_environments_variables_count_against_the_limit(fleet: sessionmaker[Session], clock: FakeClock) -> None:
    """A Python environment adds three variables: a job already at the limit is refused at submit, not when
    its start message no longer validates at placement."""
    add_env(fleet, clock, image=None, python_prefix="/opt/envs/torch")
    variables = {f"V{i}": "x" for i in range(MAX_ENV - 1)}
    with pytest.raises(InvalidInput, match=f"at most {MAX_ENV}"):
        submit(fleet, clock, argv=["train"], user="alice", environment="pytorch", env=variables)
    assert count_jobs(fleet) == 0


def test_a_job_that_fits_nowhere_for_another_reason_is_not_blamed_on_the_driver(
    fleet: sessionmaker[Session], clock: FakeClock
) -> None:
    add_env(fleet, clock)
    queued = submit(fleet, clock, argv=["train"], user="alice", environment="pytorch", gpus_per_node=8, nodes=2)
    tick(fleet, clock)
    assert job(fleet, queued).reason.startswith("unschedulable")
    assert "driver" in job(fleet, queued).reason  # two nodes are up: only the driver keeps it off n1
    set_node(fleet, "n1", drained_at=to_datetime(clock.now()))
    tick(fleet, clock)
    assert job(fleet, queued).reason.startswith("unschedulable")
    assert "driver" not in job(fleet, queued).reason  # one node takes jobs: whatever the driver, no pair


def test_a_cpu_only_environment_needs_no_driver_and_runs_anywhere(
    sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    gpu_node(sessions, clock, "old1", [OLD])
    gpu_node(sessions, clock, "unknown1", [None])
    env = add_env(sessions, clock, name="tokenize", version="1", cuda=None, python_prefix="/opt/envs/tok")
    assert (env.cuda, env.min_driver) == (None, None)
    with transaction(sessions, readonly=True) as s:
        fits = environments.check(environments.fleet(s), environments.get(s, "tokenize"))
    assert {f.node: (f.ok, f.takes_jobs) for f in fits} == {"old1": (True, True), "unknown1": (True, True)}
    assert all("needs no NVIDIA driver" in f.reason for f in fits)
    users(sessions, clock, "alice")
    job_id = submit(sessions, clock, environment="tokenize", gpus_per_node=1)
    assert job(sessions, job_id).min_driver is None
    tick(sessions, clock)
    assert job(sessions, job_id).state == JobState.RUNNING
