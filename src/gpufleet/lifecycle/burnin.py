"""Burn-in: a node runs a profile's steps as gpufleet jobs and takes work only once it passed them.

A run (`BurnIn`) holds its node out of service: drained through the workload manager (so Slurm
drains it too) with `Node.hold = "burn-in"`, which the health loop never undoes. The leader's pass
(`advance`) moves every run on, one step at a time:

- a step starts when the node is up, has reported its inventory (the GPU model picks the
  thresholds) and runs no job: the step's job is placed straight on the node's GPUs, bypassing the
  scheduler (the node is drained, so the scheduler places nothing there meanwhile);
- when the job ends, the head reads the step's result line from the job's output
  (protocol.burnin) and judges it against the threshold for the node's GPU model; the first
  failing step fails the run, and its reason names the step, the value and the threshold;
- steps over several nodes (all-reduce, network) measure nodes of one batch together (the nodes
  started together; every admission run shares one batch per profile): pairs, or groups of the
  step's `group` for an all-reduce. A pair or group measures its links, not one node, so one that
  falls short says only that one of its nodes is weak: its nodes are measured again, a failed group
  split in halves and a lone node with a partner that passed (lifecycle.grouping), and a node fails
  the step when it fell short with known-good partners only, or with two sets of partners that share
  no node. Runs wait for one another at such a step (all of the batch's started runs reach it before
  it is placed) and leave it together, so a known-good partner is still there to be measured with.

On pass, a run that holds its node releases it and, unless asked not to, resumes it. On failure the
node stays out with `hold = "burn-in-failed"` and the reason as its drain reason. A node a
maintenance campaign holds (`hold = "maintenance"`) is left as the campaign holds it: the campaign
reads the run's state.

Functions take a session and never commit; the caller's transaction is the unit.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpufleet.core.clock import Clock, to_datetime
from gpufleet.core.errors import Conflict, GpufleetError, InvalidInput, NotFound
from gpufleet.inventory.models import Node
from gpufleet.inventory.states import NodeState
from gpufleet.jobs import lifecycle as jobs
from gpufleet.jobs.models import FINAL_STATES, Job, JobState
from gpufleet.jobs.ports import OWN_DRAIN_PREFIX, WorkloadManager
from gpufleet.lifecycle import pairing, placement, verdicts
from gpufleet.lifecycle.models import BURNIN_ACTIVE, BurnIn, BurnInStep
from gpufleet.lifecycle.placement import ACTOR
from gpufleet.lifecycle.profiles import Profile, get_profile
from gpufleet.lifecycle.verdicts import FAILED, PENDING, RUNNING, SKIPPED, STEP_DONE
from gpufleet.protocol.burnin import GPU_KINDS, MULTI_NODE_KINDS, BadResult

log = logging.getLogger(__name__)
HOLD = "burn-in"
HOLD_FAILED = "burn-in-failed"
HOLD_MAINTENANCE = "maintenance"
# A started run whose node has been down this long fails: a reboot comes back well within it, a dead node
# must not hold its batch at a pair step (or a campaign waiting on the run) forever.
DOWN_GRACE_S = 300.0


def admission_batch(profile: str) -> str:
    """Every admission run of a profile shares one batch: nodes that join over minutes still pair."""
    return f"admission:{profile}"


def start(
    session: Session,
    clock: Clock,
    workload: WorkloadManager,
    nodes: Sequence[Node],
    profile: Profile,
    actor: str,
    *,
    resume_on_pass: bool = True,
    campaign_id: int | None = None,
    batch: str | None = None,
) -> list[BurnIn]:
    """Start a run of `profile` on each node, as one batch (pair steps pair within it).

    Raises Conflict, changing nothing, when a node already has a run queued or running.
    """
    if not nodes:
        raise InvalidInput("no nodes to burn in")
    if campaign_id is None:
        held = sorted(n.name for n in nodes if n.hold == HOLD_MAINTENANCE)
        if held:
            raise Conflict(f"{', '.join(held)}: held by a maintenance campaign; its own burn-in action runs there")
    busy = active_runs(session, [n.id for n in nodes])
    if busy:
        names = ", ".join(sorted(r.node for r in busy))
        raise Conflict(f"a burn-in is already queued or running on {names}; cancel it first")
    batch = batch or f"{profile.name}-{uuid.uuid4().hex[:12]}"
    now = to_datetime(clock.now())
    runs = []
    for node in nodes:
        run = BurnIn(
            node_id=node.id,
            node=node.name,
            profile=profile.name,
            batch=batch,
            state="queued",
            resume_on_pass=resume_on_pass,
            campaign_id=campaign_id,
            requested_by=actor,
            created_at=now,
            steps=[
                BurnInStep(
                    position=i,
                    name=step.name,
                    kind=step.kind,
                    argv=step.argv(),
                    time_limit_s=step.time_limit_s,
                    thresholds=dict(step.threshold),
                    better=step.better,
                    group_size=step.group if step.multi_node else 1,
                    state=PENDING,
                    evidence={},
                )
                for i, step in enumerate(profile.steps)
            ],
        )
        session.add(run)
        _hold(session, workload, node, f"{OWN_DRAIN_PREFIX} burn-in: profile {profile.name} not yet passed", actor)
        if node.drained_by != ACTOR:
            run.resume_on_pass = False  # someone else's drain stays theirs: the pass does not lift it
        runs.append(run)
    session.flush()
    return runs


def _hold(session: Session, workload: WorkloadManager, node: Node, reason: str, actor: str) -> None:
    """Take the node out for burn-in, unless a campaign holds it (it stays as the campaign holds it)."""
    if node.hold == HOLD_MAINTENANCE:
        return
    node.hold = HOLD
    foreign = node.drained_at is not None and not (node.drain_reason or "").startswith(OWN_DRAIN_PREFIX)
    if foreign and actor == ACTOR:
        return  # admission finds a person's (or Slurm's) drain: it stays theirs, never lifted by a pass
    # Not drained, drained by a health check, or a person asks for this run: the drain becomes burn-in's
    # (drained by ACTOR), which a pass lifts.
    workload.drain(session, node, reason, ACTOR)


def active_runs(session: Session, node_ids: Iterable[int]) -> list[BurnIn]:
    ids = list(node_ids)
    if not ids:
        return []
    query = select(BurnIn).where(BurnIn.node_id.in_(ids), BurnIn.state.in_(BURNIN_ACTIVE))
    return list(session.scalars(query))


def get_run(session: Session, run_id: int) -> BurnIn:
    run = session.get(BurnIn, run_id)
    if run is None:
        raise NotFound(f"no such burn-in: {run_id}")
    return run


def cancel(session: Session, clock: Clock, workload: WorkloadManager, run_id: int, actor: str) -> BurnIn:
    """Stop a run: its step jobs are cancelled; a node it held stays drained, now as the person's drain
    (nothing puts an untested node in service on its own). Raises NotFound, or Conflict once it ended."""
    run = get_run(session, run_id)
    if run.state not in BURNIN_ACTIVE:
        raise Conflict(f"burn-in {run_id} has already ended ({run.state})")
    _cancel_step_jobs(session, clock, run, actor)
    for step in run.steps:
        if step.state not in STEP_DONE:
            step.state, step.detail = SKIPPED, f"cancelled by {actor}"
    _end(run, "cancelled", f"cancelled by {actor}", clock)
    node = session.get(Node, run.node_id) if run.node_id is not None else None
    if node is not None and node.hold == HOLD:
        node.hold = None
        workload.drain(session, node, f"burn-in cancelled by {actor}; resume the node by hand", actor)
    session.flush()
    return run


def _cancel_step_jobs(session: Session, clock: Clock, run: BurnIn, actor: str) -> None:
    for step in run.steps:
        if step.state == RUNNING and step.job_id is not None:
            with contextlib.suppress(Conflict, NotFound):  # ended meanwhile: nothing left to stop
                jobs.cancel(session, clock, step.job_id, actor, user=None, admin=True)


# --- the leader's pass -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ended:
    """A run that ended in this pass (for the log, the audit trail and alerts)."""

    run_id: int
    node: str
    state: str
    reason: str


def advance(session: Session, clock: Clock, workload: WorkloadManager, user: str) -> list[Ended]:
    """One pass over every queued or running run. `user`: the node user step jobs run as."""
    runs = list(session.scalars(select(BurnIn).where(BurnIn.state.in_(BURNIN_ACTIVE)).order_by(BurnIn.id)))
    if not runs:
        return []
    facts = placement.read_facts(session, [r.node_id for r in runs if r.node_id is not None])
    ended: list[Ended] = []
    for run in runs:
        if run.node_id is None or run.node_id not in facts:
            _finish_run(session, clock, workload, run, "failed", "the node was removed", None)
            ended.append(Ended(run.id, run.node, run.state, run.reason))
        elif _down_too_long(facts[run.node_id].node, clock):
            # A node that dies under burn-in failed it; waiting on would also keep its batch at a pair step.
            _finish_run(
                session, clock, workload, run, "failed", "the node went down during burn-in", facts[run.node_id]
            )
            ended.append(Ended(run.id, run.node, run.state, run.reason))
    batches: dict[str, list[BurnIn]] = defaultdict(list)
    for run in runs:
        if run.state in BURNIN_ACTIVE:
            batches[run.batch].append(run)
    for members in batches.values():
        ended += _advance_batch(session, clock, workload, members, facts, user)
    session.flush()
    return ended


def _down_too_long(node: Node, clock: Clock) -> bool:
    if node.state is not NodeState.DOWN:
        return False
    return (to_datetime(clock.now()) - node.state_since).total_seconds() > DOWN_GRACE_S


def _advance_batch(
    session: Session,
    clock: Clock,
    workload: WorkloadManager,
    members: list[BurnIn],
    facts: dict[int, placement.NodeFacts],
    user: str,
) -> list[Ended]:
    ended: list[Ended] = []
    # First the step jobs that ended: their results decide what comes next.
    for run in members:
        for step in run.steps:
            if step.state == RUNNING and step.job_id is not None:
                try:
                    _collect(session, clock, run, step, members)
                except Exception as exc:  # a result a node wrote must fail its step, never the fleet's pass
                    log.exception("burn-in %d %s: cannot judge the step", run.id, step.name)
                    verdicts.judge_failed(step, f"the step's result cannot be judged: {type(exc).__name__}", clock)
    for run in members:
        if run.state not in BURNIN_ACTIVE:
            continue
        failed = next((s for s in run.steps if s.state == FAILED), None)
        if failed is not None:
            _finish_run(session, clock, workload, run, "failed", verdicts.failure(failed), facts.get(run.node_id or -1))
            ended.append(Ended(run.id, run.node, run.state, run.reason))
        elif placement.current_step(run) is None and not pairing.held_by_pair(run, members, clock):
            _finish_run(session, clock, workload, run, "passed", "", facts.get(run.node_id or -1))
            ended.append(Ended(run.id, run.node, run.state, run.reason))
    live = [r for r in members if r.state in BURNIN_ACTIVE]
    for run in live:
        current = placement.current_step(run)
        if current is None or current.state != PENDING or current.kind in MULTI_NODE_KINDS:
            continue
        if pairing.held_by_pair(run, live, clock):
            continue
        node = facts[run.node_id] if run.node_id is not None else None
        if node is not None and placement.ready(node):
            _start_single(session, clock, run, current, node, user)
    pairing.start_due_pairs(session, clock, live, facts, user)
    return ended


def _start_single(
    session: Session, clock: Clock, run: BurnIn, step: BurnInStep, node: placement.NodeFacts, user: str
) -> None:
    placement.begin(run, node, clock)
    if step.kind in GPU_KINDS and not node.gpus:
        if node.node.expected_gpus:
            step.state = FAILED
            step.detail = f"the node reports no GPU where {node.node.expected_gpus} are expected"
        else:
            step.state, step.detail = SKIPPED, "the node has no GPU"
        step.ended_at = to_datetime(clock.now())
        return
    gpus = sorted(node.gpus) if step.kind in GPU_KINDS else []
    job = placement.place_step_job(session, clock, run, step, [(node, gpus)], user)
    step.job_id, step.state, step.attempts = job.id, RUNNING, step.attempts + 1
    step.started_at = to_datetime(clock.now())
    step.threshold = verdicts.threshold_for(step, run.gpu_model)
    node.busy = True


# --- reading results -----------------------------------------------------------------------------------


def _collect(session: Session, clock: Clock, run: BurnIn, step: BurnInStep, members: list[BurnIn]) -> None:
    """Judge a step whose job ended (a pair step judges both nodes' rows)."""
    job = session.get(Job, step.job_id)
    if job is not None and job.state not in FINAL_STATES:
        return
    if job is None:
        verdicts.judge_failed(step, "the step's job is gone", clock)
        return
    if step.kind in MULTI_NODE_KINDS:
        pairing.collect_pair(session, clock, job, step, members)
        return
    try:
        result = verdicts.rank_result(session, job, 0)
    except BadResult as exc:
        verdicts.judge_failed(
            step, verdicts.job_failure(job) if job.state is not JobState.COMPLETED else str(exc), clock
        )
        return
    gpus = len(next((r.gpu_indexes for r in job.ranks if r.run == job.run), []))
    verdicts.judge(step, result, clock)
    if step.kind in GPU_KINDS and gpus:
        verdicts.judge_gpu_coverage(step, result, gpus)


# --- ending a run --------------------------------------------------------------------------------------


def _end(run: BurnIn, state: str, reason: str, clock: Clock) -> None:
    run.state, run.reason, run.ended_at = state, reason[:1024], to_datetime(clock.now())


def _finish_run(
    session: Session,
    clock: Clock,
    workload: WorkloadManager,
    run: BurnIn,
    state: str,
    reason: str,
    facts: placement.NodeFacts | None,
) -> None:
    _cancel_step_jobs(session, clock, run, ACTOR)
    for step in run.steps:
        if step.state not in STEP_DONE:
            step.state, step.detail = SKIPPED, "not run: an earlier step failed" if state == "failed" else step.detail
    _end(run, state, reason, clock)
    node = facts.node if facts is not None else None
    if node is None or node.hold not in (HOLD, HOLD_FAILED):
        return  # gone, or a campaign holds it and reads the verdict itself
    try:
        if state == "passed":
            node.hold = None
            ours = node.drained_at is not None and node.drained_by == ACTOR
            if run.resume_on_pass and ours:
                workload.resume(session, node, ACTOR)
            elif ours:
                workload.drain(session, node, f"burn-in {run.profile} passed; resume the node by hand", ACTOR)
            # A drain someone made during the run (or before admission) is theirs: left as it is.
        else:
            node.hold = HOLD_FAILED
            workload.drain(session, node, f"{OWN_DRAIN_PREFIX} burn-in failed: {reason}"[:512], ACTOR)
    except GpufleetError as exc:
        # The workload manager refused (Slurm away): the verdict stands and the hold keeps the node out of
        # gpufleet's scheduling; `node resume` or a new run settles the workload manager's side.
        log.warning("%s: burn-in %s: the workload manager refused: %s", node.name, state, exc)


def latest_runs(session: Session, node_ids: Iterable[int]) -> dict[int, BurnIn]:
    """Each node's most recent run."""
    out: dict[int, BurnIn] = {}
    ids = list(node_ids)
    if not ids:
        return out
    for run in session.scalars(select(BurnIn).where(BurnIn.node_id.in_(ids)).order_by(BurnIn.id)):
        if run.node_id is not None:
            out[run.node_id] = run
    return out


def history(session: Session, node: str, limit: int = 20) -> list[BurnIn]:
    query = select(BurnIn).where(BurnIn.node == node).order_by(BurnIn.id.desc()).limit(limit)
    return list(session.scalars(query))


def admit_on_join(
    session: Session,
    clock: Clock,
    workload: WorkloadManager,
    node: Node,
    profile_name: str,
    profile_dirs: Sequence[Path],
) -> BurnIn | None:
    """Admission at a node's first join: a node never heard from and never burned in starts the profile.

    A profile that cannot be loaded holds the node all the same (an untested node never slips into
    service because a file is broken), with the problem as its drain reason."""
    if node.state is not NodeState.NEW or session.scalar(select(BurnIn.id).where(BurnIn.node_id == node.id)):
        return None
    try:
        profile = get_profile(profile_name, profile_dirs)
    except InvalidInput as exc:
        log.error("%s: admission burn-in cannot start: %s", node.name, exc)
        _hold(session, workload, node, f"{OWN_DRAIN_PREFIX} burn-in: admission profile unusable: {exc}"[:512], ACTOR)
        node.hold = HOLD_FAILED  # no run to wait for: `node resume` (or a new run) is the way out
        return None
    try:
        with session.begin_nested():  # a refusal undoes the run and the hold alone, never the join
            (run,) = start(session, clock, workload, [node], profile, ACTOR, batch=admission_batch(profile.name))
    except GpufleetError as exc:
        # The workload manager refused the drain (Slurm away, or it does not know the node yet): the join
        # must go on; the hold keeps gpufleet's scheduler off the node, and a run starts on the next join.
        log.error("%s: admission burn-in cannot start: %s", node.name, exc)
        node.hold = HOLD_FAILED
        return None
    return run


def profile_dirs(data_dir: Path, configured: Path | None) -> list[Path]:
    """Where admins keep their profiles (setting `burnin_profiles_dir`, default data_dir/burnin-profiles)."""
    return [configured or data_dir / "burnin-profiles"]
