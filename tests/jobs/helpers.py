"""A small cluster in the database for the job tests: nodes up with GPUs, users, projects."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.auth import projects
from gpufleet.auth.schemas import UserCreate
from gpufleet.auth.users import create_user
from gpufleet.core.clock import FakeClock
from gpufleet.core.db import transaction
from gpufleet.inventory import service as inventory
from gpufleet.inventory.models import Node
from gpufleet.inventory.schemas import NodeSettings
from gpufleet.inventory.states import NodeState
from gpufleet.jobs import lifecycle, submission
from gpufleet.jobs.models import Job, JobRank
from gpufleet.jobs.scheduler import Policy
from gpufleet.jobs.schemas import JobSubmit
from gpufleet.jobs.tick import TickResult, TickSettings, run_tick
from gpufleet.protocol.inventory import GpuInfo, NodeInventory
from gpufleet.protocol.jobs import JobUpdate

LIMITS = submission.Limits(default_time_limit_s=3600, max_time_limit_s=7 * 86400)
ADMIN = submission.Submitter(actor="token:admin", user=None, admin=True)
TICK = TickSettings(policy=Policy(), half_life_s=7 * 86400, max_requeues=2)


def as_user(name: str) -> submission.Submitter:
    return submission.Submitter(actor=f"user:{name}", user=name, admin=False)


def gpu_report(name: str, drivers: Sequence[str | None]) -> NodeInventory:
    """Node `name`'s inventory: 64 CPUs, 512 GiB, one H200 per entry of `drivers` (its NVIDIA driver)."""
    return NodeInventory(
        hostname=f"{name}.cluster",
        cpus=64,
        memory_total_mib=512 * 1024,
        gpu_source="nvml" if drivers else "none",
        gpus=[
            GpuInfo(
                index=i,
                uuid=f"GPU-{name}-{i}",
                model="NVIDIA H200",
                pci_bus_id=f"00000000:{i:02x}:00.0",
                memory_total_mib=143771,
                driver_version=driver,
            )
            for i, driver in enumerate(drivers)
        ],
    )


def cluster(sessions: sessionmaker[Session], clock: FakeClock, nodes: int = 2, gpus: int = 8, **labels: str) -> None:
    with transaction(sessions) as s:
        added = inventory.add_nodes(s, clock, [f"n[1-{nodes}]"], NodeSettings(labels=dict(labels)))
        for node in added:
            inventory.apply_inventory(s, clock, node, gpu_report(node.name, [None] * gpus))
            node.state = NodeState.UP
            node.health = "healthy"


def users(sessions: sessionmaker[Session], clock: FakeClock, *names: str) -> None:
    with transaction(sessions) as s:
        for name in names:
            create_user(s, clock, UserCreate(username=name))


def project(sessions: sessionmaker[Session], clock: FakeClock, name: str, *members: str, **quota: Any) -> None:
    with transaction(sessions) as s:
        projects.create_project(s, clock, name)
        for member in members:
            projects.add_member(s, clock, name, member)
        if quota:
            projects.set_quota(s, name, max_gpus=quota.get("max_gpus"), gpu_hours_budget=quota.get("gpu_hours_budget"))


def submit(sessions: sessionmaker[Session], clock: FakeClock, who: submission.Submitter = ADMIN, **spec: Any) -> int:
    spec.setdefault("argv", ["sleep", "60"])
    if who is ADMIN:
        spec.setdefault("user", "alice")
    with transaction(sessions) as s:
        return submission.submit(s, clock, who, JobSubmit(**spec), LIMITS).id


def tick(sessions: sessionmaker[Session], clock: FakeClock) -> TickResult:
    return run_tick(sessions, clock, TICK)


def job(sessions: sessionmaker[Session], job_id: int) -> Job:
    with transaction(sessions, readonly=True) as s:
        found = lifecycle.get_job(s, job_id)
        s.expunge_all()
        return found


def ranks(sessions: sessionmaker[Session], job_id: int) -> list[JobRank]:
    with transaction(sessions, readonly=True) as s:
        found = list(s.scalars(select(JobRank).where(JobRank.job_id == job_id).order_by(JobRank.run, JobRank.rank)))
        s.expunge_all()
        return found


def node_id(sessions: sessionmaker[Session], name: str) -> int:
    with transaction(sessions, readonly=True) as s:
        found: int = s.scalars(select(Node.id).where(Node.name == name)).one()
        return found


def report(
    sessions: sessionmaker[Session],
    clock: FakeClock,
    job_id: int,
    state: str = "exited",
    outcome: str | None = "completed",
    *,
    run: int = 1,
    rank: int = 0,
    node: str | None = None,
    exit_code: int | None = None,
) -> bool:
    """An agent's report on a rank, from the node that holds it (or `node`)."""
    if node is None:
        node = next(r.node for r in ranks(sessions, job_id) if r.run == run and r.rank == rank)
    update = JobUpdate(
        job_id=job_id,
        run=run,
        rank=rank,
        state=state,
        outcome=outcome if state == "exited" else None,  # type: ignore[arg-type]
        exit_code=exit_code if exit_code is not None else (0 if outcome == "completed" else None),
    )
    with transaction(sessions) as s:
        return lifecycle.rank_update(s, clock, node_id(sessions, node), update, TICK.max_requeues)


def set_node(sessions: sessionmaker[Session], name: str, **values: Any) -> None:
    with transaction(sessions) as s:
        node = s.scalars(select(Node).where(Node.name == name)).one()
        for key, value in values.items():
            setattr(node, key, value)
