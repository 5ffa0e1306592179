"""Where and when a burn-in step's job goes: what the head knows of each node under test (its GPUs, its
model, whether anything runs there), and the step job placed straight on the node's GPUs, bypassing the
scheduler (the node is drained: the scheduler places nothing there meanwhile)."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpufleet.core.clock import Clock, to_datetime
from gpufleet.inventory.models import Gpu, Node
from gpufleet.inventory.states import NodeState
from gpufleet.jobs import lifecycle as jobs
from gpufleet.jobs.models import Job, JobState
from gpufleet.lifecycle.models import BurnIn, BurnInStep
from gpufleet.lifecycle.occupancy import busy_jobs, slurm_busy
from gpufleet.lifecycle.verdicts import STEP_DONE

ACTOR = "gpufleet:burn-in"  # who submits step jobs, drains and resumes for burn-in


@dataclass(slots=True)
class NodeFacts:
    node: Node
    gpus: dict[int, str]  # index -> UUID
    model: str | None
    busy: bool  # runs a job rank (of any job): a step waits for it to end


def since(when: datetime, clock: Clock) -> float:
    return (to_datetime(clock.now()) - when).total_seconds()


def arrived(run: BurnIn, step: BurnInStep) -> datetime:
    """When the run reached this step: the end of the step before it, else the run's start."""
    before = [s.ended_at for s in run.steps if s.position < step.position and s.ended_at is not None]
    return max(before, default=run.started_at or run.created_at)


def read_facts(session: Session, node_ids: list[int]) -> dict[int, NodeFacts]:
    nodes = {n.id: n for n in session.scalars(select(Node).where(Node.id.in_(node_ids)))}
    gpus: dict[int, dict[int, str]] = defaultdict(dict)
    models: dict[int, Counter[str]] = defaultdict(Counter)
    for node_id, index, uid, model in session.execute(
        select(Gpu.node_id, Gpu.index, Gpu.uuid, Gpu.model).where(Gpu.node_id.in_(node_ids))
    ):
        gpus[node_id][index] = uid
        models[node_id][model] += 1
    busy = set(busy_jobs(session, list(nodes.values()))) | {n.id for n in nodes.values() if slurm_busy(n)}
    return {
        nid: NodeFacts(
            node=node,
            gpus=dict(sorted(gpus[nid].items())),
            model=models[nid].most_common(1)[0][0] if models[nid] else None,
            busy=nid in busy,
        )
        for nid, node in nodes.items()
    }


def current_step(run: BurnIn) -> BurnInStep | None:
    """The first step not done; None once all are."""
    return next((s for s in run.steps if s.state not in STEP_DONE), None)


def ready(node: NodeFacts) -> bool:
    return node.node.state is NodeState.UP and node.node.inventory_at is not None and not node.busy


def begin(run: BurnIn, node: NodeFacts, clock: Clock) -> None:
    if run.state == "queued":
        run.state = "running"
        run.started_at = to_datetime(clock.now())
        run.gpu_model = node.model


def place_step_job(
    session: Session,
    clock: Clock,
    run: BurnIn,
    step: BurnInStep,
    placement: list[tuple[NodeFacts, list[int]]],
    user: str,
) -> Job:
    """A step's job, placed at once on these nodes and GPUs (rank order)."""
    names = "+".join(n.node.name for n, _ in placement)
    job = Job(
        name=f"burn-in {step.name} {names}"[:128],
        user=user,
        project=None,
        submitted_by=ACTOR,
        state=JobState.PENDING,
        nodes=len(placement),
        gpus_per_node=max(len(g) for _, g in placement),
        time_limit_s=step.time_limit_s,
        argv=list(step.argv),
        env={"GPUFLEET_BURNIN_RUN": str(run.id), "GPUFLEET_BURNIN_STEP": step.name},
        requeue=False,
        submitted_at=to_datetime(clock.now()),
    )
    session.add(job)
    session.flush()
    allocation = {n.node.name: gpus for n, gpus in placement}
    where = {n.node.name: jobs.NodeGpus(n.node.id, n.gpus) for n, _ in placement}
    jobs.place(session, clock, job, allocation, where)
    return job
