"""gpufleet's jobs run by a real Slurm 22.05 (scripts/services/slurm.sh): submitted through gpufleet, given
their GPUs by Slurm (CUDA_VISIBLE_DEVICES in the job), followed to their end, cancelled; jobs submitted to
Slurm directly listed too; Slurm refusing a job fails it with Slurm's reason; drains set or lifted in
Slurm by hand mirrored on the node row."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, event, select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.core.clock import SystemClock
from gpufleet.core.db import transaction
from gpufleet.inventory import service as inventory
from gpufleet.inventory.models import Node
from gpufleet.inventory.schemas import NodeSettings
from gpufleet.jobs import lifecycle
from gpufleet.jobs.models import Job, JobState
from gpufleet.jobs.slurm.batch import BatchOptions
from gpufleet.jobs.slurm.commands import SlurmCommands
from gpufleet.jobs.slurm.manager import SlurmWorkloadManager
from gpufleet.jobs.slurm.sync import SlurmSync, SyncResult
from gpufleet.protocol.inventory import GpuInfo, NodeInventory
from gpufleet.protocol.jobs import DEFAULT_PATH
from tests.jobs.helpers import ADMIN, LIMITS, users
from tests.slurm.conftest import SlurmCluster, sinfo_node, wait_until

pytestmark = pytest.mark.slurm
SHOW = '"gpus=$CUDA_VISIBLE_DEVICES greeting=$GREETING user=$(id -un) path=$PATH"'
RUN_AS = "nobody"  # the head runs as root here and submits as the job's user (sbatch --uid)


@pytest.fixture
def commands(slurm_cluster: SlurmCluster) -> SlurmCommands:
    return SlurmCommands(slurm_cluster.conf, timeout_s=30)


@pytest.fixture
def sync(
    slurm_cluster: SlurmCluster, commands: SlurmCommands, sessions: sessionmaker[Session], slurm_lock: None
) -> Iterator[SlurmSync]:
    """A head's Slurm pass over a database holding the Slurm node (4 GPUs) and the user nobody; the Slurm
    queue emptied and the node undrained before and after."""
    clock = SystemClock()
    commands.run(["scancel", "--full", "--user=nobody"])
    _undrain(commands, slurm_cluster.node)
    with transaction(sessions) as s:
        (node,) = inventory.add_nodes(s, clock, [slurm_cluster.node], NodeSettings())
        inventory.apply_inventory(
            s,
            clock,
            node,
            NodeInventory(
                hostname=slurm_cluster.node,
                cpus=2,
                memory_total_mib=4096,  # more than the RealMemory=1000 slurm.conf gives the node
                gpu_source="nvml",
                gpus=[
                    GpuInfo(
                        index=i, uuid=f"GPU-{i}", model="fake", pci_bus_id=f"00000000:{i:02x}:00.0", memory_total_mib=1
                    )
                    for i in range(slurm_cluster.gpus)
                ],
            ),
        )
    users(sessions, clock, RUN_AS)
    manager = SlurmWorkloadManager(commands, clock)
    yield SlurmSync(sessions, clock, manager, BatchOptions(output_dir=slurm_cluster.jobout, run_as_others=True))
    commands.run(["scancel", "--full", "--user=nobody"])
    _undrain(commands, slurm_cluster.node)


def _undrain(commands: SlurmCommands, node: str) -> None:
    state = sinfo_node(commands, node)
    if "drain" in state or state.startswith("down"):
        commands.run(["scontrol", "update", f"nodename={node}", "state=resume"])


def submit(sessions: sessionmaker[Session], **spec: object) -> int:
    from gpufleet.jobs import submission
    from gpufleet.jobs.schemas import JobSubmit

    spec.setdefault("user", RUN_AS)
    with transaction(sessions) as s:
        return submission.submit(s, SystemClock(), ADMIN, JobSubmit(**spec), LIMITS, backend="slurm").id


def row(sessions: sessionmaker[Session], job_id: int) -> Job:
    with transaction(sessions, readonly=True) as s:
        found = lifecycle.get_job(s, job_id)
        s.expunge_all()
        return found


def settle(
    sync: SlurmSync, sessions: sessionmaker[Session], job_id: int, states: set[JobState], timeout_s: float = 30
) -> Job:
    """Run passes until the job's row is in one of `states`."""
    last: list[SyncResult] = []

    def reached() -> bool:
        last[:] = [sync.once()]
        return row(sessions, job_id).state in states

    wait_until(f"job {job_id} to reach {sorted(s.value for s in states)} (last pass: {last})", reached, timeout_s)
    return row(sessions, job_id)


def test_a_job_runs_in_slurm_on_the_gpus_it_asked_for(
    sync: SlurmSync, sessions: sessionmaker[Session], slurm_cluster: SlurmCluster
) -> None:
    job_id = submit(
        sessions,
        name="two-gpus",
        gpus_per_node=2,
        time_limit_s=120,
        env={"GREETING": "hello, world\nand 'more'"},
        script=f"#!/bin/bash\necho {SHOW}\nsleep 2\nexit 3\n",
        workdir="/tmp",
    )
    first = sync.once()
    assert first.problem is None
    slurm_id = first.submitted[job_id]
    running = settle(sync, sessions, job_id, {JobState.RUNNING})
    assert running.allocation == {slurm_cluster.node: [0, 1]}
    done = settle(sync, sessions, job_id, {JobState.FAILED})
    assert done.external_id == slurm_id
    assert done.exit_code == 3
    assert done.reason == "Slurm: failed (NonZeroExitCode)"
    assert done.allocation == {slurm_cluster.node: [0, 1]}
    assert done.started_at is not None
    assert done.ended_at is not None
    output = (slurm_cluster.jobout / f"gpufleet-{slurm_id}.out").read_text()
    assert output == f"gpus=0,1 greeting=hello, world\nand 'more' user=nobody path={DEFAULT_PATH}\n"


def test_cancel_in_gpufleet_scancels_the_slurm_job(sync: SlurmSync, sessions: sessionmaker[Session]) -> None:
    job_id = submit(sessions, argv=["sleep", "300"], gpus_per_node=1, time_limit_s=600, workdir="/tmp")
    running = settle(sync, sessions, job_id, {JobState.RUNNING})
    assert running.reason == f"running in Slurm as job {running.external_id}"
    with transaction(sessions) as s:
        lifecycle.cancel(s, SystemClock(), job_id, "user:admin", user=None, admin=True)
    result = sync.once()
    assert result.cancelled == [running.external_id]

    def slurm_state() -> str:
        return sync.manager.commands.run(
            ["squeue", "-h", "-t", "all", "-j", str(running.external_id), "-o", "%T"]
        ).strip()

    wait_until("Slurm to cancel the job", lambda: slurm_state() == "CANCELLED")
    sync.once()
    after = row(sessions, job_id)
    assert (after.state, after.reason) == (JobState.CANCELLED, "cancelled by user:admin")


def test_a_job_slurm_refuses_fails_with_slurms_reason(sync: SlurmSync, sessions: sessionmaker[Session]) -> None:
    # gpufleet's inventory says the node has 4 GiB; slurm.conf says 1000 MiB, and Slurm decides.
    job_id = submit(sessions, argv=["true"], gpus_per_node=1, mem_per_node_mib=2000, workdir="/tmp")
    result = sync.once()
    assert job_id in result.refused
    failed = row(sessions, job_id)
    assert failed.state == JobState.FAILED
    assert failed.external_id is None
    assert failed.reason.startswith("Slurm refused: sbatch ")
    assert "Requested node configuration is not available" in failed.reason


def test_jobs_submitted_to_slurm_directly_are_listed(
    sync: SlurmSync, sessions: sessionmaker[Session], slurm_cluster: SlurmCluster
) -> None:
    out = sync.manager.commands.run(
        [
            "sbatch",
            "--parsable",
            "--uid=nobody",
            "--gres=gpu:1",
            "-J",
            "by-hand",
            "-D",
            "/tmp",
            "-o",
            "/dev/null",
            "--wrap",
            "sleep 60",
        ]
    )
    slurm_id = out.strip()
    sync.once()
    with transaction(sessions, readonly=True) as s:
        found = s.scalars(select(Job).where(Job.external_id == slurm_id)).one()
        assert (found.name, found.user, found.submitted_by, found.backend) == ("by-hand", "nobody", "slurm", "slurm")
        assert found.gpus_per_node == 1
        assert found.state in (JobState.PENDING, JobState.RUNNING)
    sync.once()  # a second pass updates that row rather than adding another
    with transaction(sessions, readonly=True) as s:
        assert len(s.scalars(select(Job).where(Job.external_id == slurm_id)).all()) == 1


def test_drains_set_and_lifted_in_slurm_by_hand_show_on_the_node(
    sync: SlurmSync, sessions: sessionmaker[Session], slurm_cluster: SlurmCluster
) -> None:
    name = slurm_cluster.node

    def node() -> Node:
        with transaction(sessions, readonly=True) as s:
            found = s.scalars(select(Node).where(Node.name == name)).one()
            s.expunge_all()
            return found

    sync.once()
    assert node().wlm_state == "idle"
    assert node().drained_at is None
    sync.manager.commands.run(["scontrol", "update", f"nodename={name}", "state=drain", "reason=bad fan"])
    sync.once()
    drained = node()
    assert (drained.wlm_state, drained.drain_reason, drained.drained_by) == ("drained", "bad fan", "slurm:root")
    sync.manager.commands.run(["scontrol", "update", f"nodename={name}", "state=resume"])
    sync.once()
    assert node().drained_at is None
    # Slurm shows a resumed node "idle*" (not responding) until its next ping of slurmd.
    wait_until("the node to be idle", lambda: sync.once() is not None and node().wlm_state == "idle")


def test_a_pass_with_nothing_new_from_slurm_writes_nothing(sync: SlurmSync, engine: Engine) -> None:
    """On SQLite a write transaction holds the one write lock the health pass needs to drain a node at once:
    a pass that learns nothing new must not take it."""
    sync.once()  # the node's Slurm state, and any job Slurm still lists from other tests, written down
    sync.once()
    statements: list[str] = []

    def record(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        statements.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    try:
        result = sync.once()
    finally:
        event.remove(engine, "before_cursor_execute", record)
    assert (result.problem, result.updated, result.imported, result.nodes) == (None, 0, 0, 0)
    writes = [s for s in statements if any(w in s for w in ("IMMEDIATE", "INSERT", "UPDATE", "DELETE"))]
    assert writes == []
    assert statements  # it did read
