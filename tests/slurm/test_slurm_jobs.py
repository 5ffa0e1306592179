"""gpufleet's jobs run by a real Slurm 22.05 (scripts/services/slurm.sh): submitted through gpufleet, given
their GPUs by Slurm (CUDA_VISIBLE_DEVICES in the job), followed to their end, cancelled; job arrays as one
sbatch --array, throttled, each task mapped back to its row and cancelled alone or with its array; jobs
submitted to Slurm directly listed too; Slurm refusing a job fails it with Slurm's reason; drains set or
lifted in Slurm by hand mirrored on the node row."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, event, select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.core.clock import SystemClock
from gpufleet.core.db import transaction
from gpufleet.inventory import service as inventory
from gpufleet.inventory.models import Node
from gpufleet.inventory.schemas import NodeSettings
from gpufleet.jobs import lifecycle
from gpufleet.jobs.models import FINAL_STATES, Job, JobState
from gpufleet.jobs.slurm.batch import BatchOptions
from gpufleet.jobs.slurm.commands import SlurmCommands
from gpufleet.jobs.slurm.manager import SlurmWorkloadManager
from gpufleet.jobs.slurm.sync import SlurmSync, SyncResult
from gpufleet.protocol.inventory import GpuInfo, NodeInventory
from gpufleet.protocol.jobs import DEFAULT_PATH
from tests.jobs.helpers import ADMIN, LIMITS, users
from tests.slurm.conftest import SlurmCluster, slurm_says, wait_until

pytestmark = pytest.mark.slurm
SHOW = '"gpus=$CUDA_VISIBLE_DEVICES greeting=$GREETING user=$(id -un) path=$PATH"'
RUN_AS = "nobody"  # the head runs as root here and submits as the job's user (sbatch --uid)
ARRAY_IDS = 'echo "$GPUFLEET_ARRAY_TASK_ID $SLURM_ARRAY_TASK_ID $GPUFLEET_ARRAY_JOB_ID"; sleep 2'


@pytest.fixture
def commands(slurm_cluster: SlurmCluster) -> SlurmCommands:
    return SlurmCommands(slurm_cluster.conf, timeout_s=30)


@pytest.fixture
def sync(
    slurm_cluster: SlurmCluster, sessions: sessionmaker[Session], slurm_node: str, commands: SlurmCommands
) -> SlurmSync:
    """A head's Slurm pass over a database holding the Slurm node (4 GPUs) and the user nobody; the Slurm
    node quiet before and after (`slurm_node`)."""
    clock = SystemClock()
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
    return SlurmSync(sessions, clock, manager, BatchOptions(output_dir=slurm_cluster.jobout, run_as_others=True))


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

    commands = sync.manager.commands
    node = commands.run(["sinfo", "-h", "-N", "-o", "%N"]).split()[0]  # the test Slurm has one node
    wait_until(
        f"job {job_id} to reach {sorted(s.value for s in states)}",
        reached,
        timeout_s,
        describe=lambda: f"the row: {_said(row(sessions, job_id))}; last pass: {last}; {slurm_says(commands, node)}",
    )
    return row(sessions, job_id)


def _said(job: Job) -> str:
    return f"{job.state.value} as Slurm job {job.external_id}, {job.reason!r}"


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


def array_rows(sessions: sessionmaker[Session], first: int) -> list[Job]:
    with transaction(sessions, readonly=True) as s:
        found = list(s.scalars(select(Job).where(Job.array_job_id == first).order_by(Job.array_task_id)))
        s.expunge_all()
        return found


def slurm_tasks(commands: SlurmCommands, array: str, states: str = "all") -> list[tuple[str, str, str]]:
    """(task name, array job id, state) of each task of the array as Slurm lists them, one a line (-r)."""
    out = commands.run(["squeue", "-h", "-r", "-t", states, "-j", array, "-o", "%i|%F|%T"])
    return [(name, owner, state) for name, owner, state in (line.split("|") for line in out.split())]


def test_an_array_is_one_sbatch_whose_tasks_map_back_to_their_rows(
    sync: SlurmSync, sessions: sessionmaker[Session], slurm_cluster: SlurmCluster
) -> None:
    first = submit(
        sessions, name="sweep", array="0-3%2", argv=["sh", "-c", ARRAY_IDS], time_limit_s=120, workdir="/tmp"
    )
    result = sync.once()
    assert (result.problem, result.refused) == (None, {})
    array = result.arrays[first]
    names = [f"{array}_{task}" for task in range(4)]
    assert [t.external_id for t in array_rows(sessions, first)] == names
    # One sbatch: Slurm lists the four tasks under one array job id.
    listed = slurm_tasks(sync.manager.commands, array)
    assert sorted(name for name, _, _ in listed) == names
    assert {owner for _, owner, _ in listed} == {array}
    most = {"slurm": 0, "gpufleet": 0}  # tasks seen running at once

    def all_done() -> bool:
        sync.once()
        running = [n for n, _, state in slurm_tasks(sync.manager.commands, array) if state == "RUNNING"]
        rows = array_rows(sessions, first)
        most["slurm"] = max(most["slurm"], len(running))
        most["gpufleet"] = max(most["gpufleet"], sum(r.state == JobState.RUNNING for r in rows))
        ended_badly = [
            (r.external_id, r.state, r.reason) for r in rows if r.state in FINAL_STATES - {JobState.COMPLETED}
        ]
        assert ended_badly == []  # e.g. a task still waiting in Slurm taken for one gone unseen
        return all(r.state == JobState.COMPLETED for r in rows)

    wait_until("every task of the array to complete", all_done, 60)
    assert 1 <= most["slurm"] <= 2  # the %2 throttle, enforced by Slurm
    assert 1 <= most["gpufleet"] <= 2
    for row in array_rows(sessions, first):
        assert (row.exit_code, row.reason) == (0, "Slurm: completed")
        assert row.started_at is not None
        output = (slurm_cluster.jobout / f"gpufleet-{row.external_id}.out").read_text()
        assert output == f"{row.array_task_id} {row.array_task_id} {first}\n"  # its own id, and gpufleet's array


def test_an_array_tasks_bash_script_gets_its_task_id_and_keeps_its_sbatch_lines(
    sync: SlurmSync, sessions: sessionmaker[Session], slurm_cluster: SlurmCluster
) -> None:
    script = '#!/bin/bash\n#SBATCH --nice=7\necho "$GPUFLEET_ARRAY_TASK_ID $SLURM_ARRAY_TASK_ID"\n'
    first = submit(sessions, array="4,9", script=script, time_limit_s=60, workdir="/tmp")
    wait_until(
        "both tasks to complete",
        lambda: sync.once() is not None and {r.state for r in array_rows(sessions, first)} == {JobState.COMPLETED},
    )
    for row in array_rows(sessions, first):
        task = row.array_task_id
        assert (slurm_cluster.jobout / f"gpufleet-{row.external_id}.out").read_text() == f"{task} {task}\n"
        # The #SBATCH line above the added one was still read by sbatch.
        nice = sync.manager.commands.run(["squeue", "-h", "-t", "all", "-j", str(row.external_id), "-o", "%y"])
        assert nice.strip() == "7"


def test_cancelling_a_task_or_the_array_cancels_them_in_slurm(sync: SlurmSync, sessions: sessionmaker[Session]) -> None:
    first = submit(sessions, array="0-5%1", argv=["sleep", "300"], time_limit_s=600, workdir="/tmp")
    running = settle(sync, sessions, first, {JobState.RUNNING})  # task 0; 1-5 wait for the throttle
    array = (running.external_id or "").split("_")[0]
    commands = sync.manager.commands

    def pending() -> list[str]:
        return sorted(name for name, _, _ in slurm_tasks(commands, array, "pending"))

    rows = array_rows(sessions, first)
    with transaction(sessions) as s:
        lifecycle.cancel(s, SystemClock(), rows[3].id, "user:admin", user=None, admin=True)
    assert sync.once().cancelled == [f"{array}_3"]  # a task not started yet, by its name
    wait_until("task 3 to leave Slurm's queue", lambda: pending() == [f"{array}_{t}" for t in (1, 2, 4, 5)])
    states = [r.state for r in array_rows(sessions, first)]
    assert states == [JobState.RUNNING, JobState.PENDING, JobState.PENDING, JobState.CANCELLED, *states[4:]]
    assert states[4:] == [JobState.PENDING, JobState.PENDING]

    with transaction(sessions) as s:
        lifecycle.cancel_array(s, SystemClock(), first, "user:admin", user=None, admin=True)
    assert sync.once().cancelled == [array]  # every task ended in gpufleet: the whole array, one scancel
    wait_until("Slurm to end every task", lambda: slurm_tasks(commands, array, "pending,running") == [])
    sync.once()
    assert {(r.state, r.reason) for r in array_rows(sessions, first)} == {
        (JobState.CANCELLED, "cancelled by user:admin")
    }


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
