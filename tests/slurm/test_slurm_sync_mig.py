"""A job of MIG instances through the Slurm sync, against the scripted Slurm of test_slurm_sync_arrays: its
sbatch asks for the GRES type Slurm gives the profile's instances in the inventory (what `gpufleet slurm
config` renders), not NVIDIA's profile name; and the GPU rows are read only by a pass that submits one."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy import Engine, event
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.core.clock import FakeClock
from gpufleet.core.db import transaction
from gpufleet.jobs import submission
from gpufleet.jobs.models import Job, JobState
from gpufleet.jobs.schemas import JobSubmit
from gpufleet.jobs.slurm.batch import BatchOptions
from gpufleet.jobs.slurm.commands import SlurmCommands
from gpufleet.jobs.slurm.manager import SlurmWorkloadManager
from gpufleet.jobs.slurm.sync import SlurmSync
from tests.jobs.helpers import ADMIN, LIMITS, users
from tests.sharing.test_mig_reconcile import H200, SEVEN_1G, add_node
from tests.slurm.test_slurm_sync_arrays import ScriptedSlurm


@pytest.fixture
def slurm() -> ScriptedSlurm:
    return ScriptedSlurm()


@pytest.fixture
def sync(sessions: sessionmaker[Session], clock: FakeClock, slurm: ScriptedSlurm) -> SlurmSync:
    """Node n1: an H200 of 7 x 1g.18gb (16384 MiB each), one of 3g.71gb + 4g.71gb (65536 MiB each, as the
    agent reported them), and a whole one. User alice."""
    add_node(sessions, clock, "n1", [(H200, SEVEN_1G), (H200, ["3g.71gb", "4g.71gb"]), (H200, None)])
    users(sessions, clock, "alice")
    manager = SlurmWorkloadManager(SlurmCommands("/x/slurm.conf", runner=slurm), clock)
    return SlurmSync(sessions, clock, manager, BatchOptions(run_as_others=True), user="root")


def submit(sessions: sessionmaker[Session], clock: FakeClock, **spec: object) -> int:
    with transaction(sessions) as s:
        job = JobSubmit.model_validate({"argv": ["nvidia-smi", "-L"], "user": "alice"} | spec)
        return submission.submit(s, clock, ADMIN, job, LIMITS, backend="slurm").id


@contextmanager
def statements(engine: Engine) -> Iterator[list[str]]:
    said: list[str] = []

    def record(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        said.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield said
    finally:
        event.remove(engine, "before_cursor_execute", record)


def gres(slurm: ScriptedSlurm) -> list[str]:
    return [a for call in slurm.calls_of("sbatch") for a in call if a.startswith("--gres=")]


def test_a_mig_job_asks_slurm_for_the_type_its_instances_have(
    sync: SlurmSync, slurm: ScriptedSlurm, sessions: sessionmaker[Session], clock: FakeClock, engine: Engine
) -> None:
    sliced = submit(sessions, clock, gpus_per_node=2, gpu_profile="1g.18gb")
    three = submit(sessions, clock, gpus_per_node=1, gpu_profile="3g.71gb")
    whole = submit(sessions, clock, gpus_per_node=1)
    with statements(engine) as said:
        result = sync.once()
    assert result.problem is None
    assert sorted(result.submitted) == [sliced, three, whole]
    # 1g.18gb: 16384 MiB, Slurm's 1g.16gb; 3g.71gb: 65536 MiB here (the tables say 66560, 3g.65gb)
    assert gres(slurm) == ["--gres=gpu:1g.16gb:2", "--gres=gpu:3g.64gb:1", "--gres=gpu:1"]
    assert len([s for s in said if "FROM gpus" in s]) == 1  # once for the pass, not once a job


def test_a_pass_without_a_mig_job_reads_no_gpu_rows(
    sync: SlurmSync, slurm: ScriptedSlurm, sessions: sessionmaker[Session], clock: FakeClock, engine: Engine
) -> None:
    submit(sessions, clock, gpus_per_node=1)
    with statements(engine) as said:
        sync.once()
        sync.once()  # nothing to submit
    assert gres(slurm) == ["--gres=gpu:1"]
    assert [s for s in said if "FROM gpus" in s] == []


def test_a_mig_job_whose_slurm_type_cannot_be_told_fails_with_the_reason(
    sync: SlurmSync, slurm: ScriptedSlurm, sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    """No A100 80GB or H100 here: 3g.40gb passes submission's check only where one is in the inventory, so the
    inventory gets an H100 in MIG mode that has no instance of it yet."""
    add_node(sessions, clock, "n2", [(("NVIDIA H100 80GB HBM3", 81559), ["1g.10gb"])])
    job_id = submit(sessions, clock, gpus_per_node=1, gpu_profile="3g.40gb")
    result = sync.once()
    assert slurm.calls_of("sbatch") == []
    assert "Slurm names MIG profile 3g.40gb 3g.39gb or 3g.40gb by GPU model" in result.refused[job_id]
    with transaction(sessions, readonly=True) as s:
        assert s.get_one(Job, job_id).state is JobState.FAILED
