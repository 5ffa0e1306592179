"""Pair steps (all-reduce, network): a link is measured by two nodes of one batch, and a pair that falls
short says only that one of the two is weak. Each node of a failed pair is paired again, first with a node
that passed the step (a known-good partner), never with one it was measured with (rotation); a node fails
when it fell short with a partner that passed, or with two different partners.

Runs of a batch wait for one another at a pair step, and those that passed stay as known-good partners,
for PAIR_WAIT_S at most.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from gpufleet.core.clock import Clock, to_datetime
from gpufleet.jobs.models import Job
from gpufleet.lifecycle import placement, verdicts
from gpufleet.lifecycle.models import BURNIN_ACTIVE, BurnIn, BurnInStep
from gpufleet.lifecycle.verdicts import FAILED, MAX_PAIR_ATTEMPTS, PASSED, PENDING, RETRY, RUNNING, SKIPPED, STEP_DONE
from gpufleet.protocol.burnin import MULTI_NODE_KINDS

# How long nodes at a pair step wait for the runs of their batch still behind, and how long a node that
# passed it stays as a known-good partner for them: admission runs share a batch, and a steady stream of
# joins must not hold the first nodes out of service.
PAIR_WAIT_S = 600.0


def held_by_pair(run: BurnIn, members: list[BurnIn], clock: Clock) -> bool:
    """Whether the run must stay at a pair step it is done with: some started run of its batch has yet to
    decide that step, and may need it as a known-good partner (for PAIR_WAIT_S at most)."""
    done_pairs = [s for s in run.steps if s.kind in MULTI_NODE_KINDS and s.state == PASSED]
    if not done_pairs:
        return False
    last = done_pairs[-1]
    if last.ended_at is not None and placement.since(last.ended_at, clock) > PAIR_WAIT_S:
        return False
    for other in members:
        if other is run or other.state not in BURNIN_ACTIVE:
            continue
        theirs = next((s for s in other.steps if s.name == last.name), None)
        if theirs is not None and theirs.state not in STEP_DONE and other.started_at is not None:
            return True
    # Leaving the pair step: the next step must not start while a partner is still being measured.
    return False


def start_due_pairs(
    session: Session, clock: Clock, live: list[BurnIn], facts: dict[int, placement.NodeFacts], user: str
) -> None:
    """Start the pair jobs due: per pair step, once every started run of the batch has reached it."""
    started = [r for r in live if r.started_at is not None or r.state == "running"]
    queued_ready = [
        r for r in live if r.state == "queued" and r.node_id is not None and placement.ready(facts[r.node_id])
    ]
    for run in queued_ready:  # a run whose first step is a pair step starts here
        first = placement.current_step(run)
        if first is not None and first.kind in MULTI_NODE_KINDS:
            placement.begin(run, facts[run.node_id or -1], clock)
            started.append(run)
    names = {s.name for r in started for s in r.steps if s.kind in MULTI_NODE_KINDS}
    for name in sorted(names):
        _pair_step(session, clock, name, started, facts, user)


def _at(run: BurnIn, name: str) -> BurnInStep | None:
    return next((s for s in run.steps if s.name == name), None)


def _gathered(name: str, started: list[BurnIn]) -> tuple[list[tuple[BurnIn, BurnInStep]], bool]:
    """The runs at (or past) this pair step with their rows, and whether any run of the batch is behind."""
    here = []
    behind = False
    for run in started:
        step = _at(run, name)
        current = placement.current_step(run)
        if step is None:
            continue
        if current is not None and current.position < step.position:
            behind = True
            continue
        here.append((run, step))
    return here, behind


def _no_partner_left(step: BurnInStep, clock: Clock) -> None:
    """A node that measured short and has nobody left to be measured with fails: never passes untested."""
    step.state = FAILED
    step.detail = step.detail.split(";")[0] + "; no other partner to tell which side is weak"
    step.ended_at = to_datetime(clock.now())


def _pair_step(
    session: Session, clock: Clock, name: str, started: list[BurnIn], facts: dict[int, placement.NodeFacts], user: str
) -> None:
    here, behind = _gathered(name, started)
    undecided = [(r, s) for r, s in here if s.state in (PENDING, RETRY)]
    if not undecided:
        return
    # Wait for the runs behind, so every node has partners to tell it from; but not for ever: nodes joining
    # one after another (admission) would keep the first ones waiting. Those behind pair among themselves.
    if behind and min(placement.since(placement.arrived(r, s), clock) for r, s in here) <= PAIR_WAIT_S:
        return
    if len(here) == 1:
        run, step = here[0]
        if step.state == RETRY:  # it measured short and the partner's run ended
            _no_partner_left(step, clock)
        else:
            step.state, step.detail = SKIPPED, "no partner: burn in two or more nodes together to measure it"
            step.ended_at = to_datetime(clock.now())
        return
    free = {
        r.node_id: (r, s)
        for r, s in here
        if r.node_id is not None and s.state != RUNNING and placement.ready(facts[r.node_id])
    }
    good = [(r, s) for r, s in here if s.state == PASSED]
    waiting = [(r, s) for r, s in undecided if r.node_id in free]
    for run, step in waiting:
        if run.node_id not in free:
            continue  # paired already in this pass
        partner = _partner(run, step, good, waiting, free)
        if partner is None:
            if step.state == RETRY and not any(s.state == RUNNING for _, s in here):
                _no_partner_left(step, clock)  # and nothing still measuring that could free one
            continue
        _start_pair(session, clock, (run, step), partner, facts, user)
        for paired in (run, partner[0]):
            free.pop(paired.node_id or -1, None)


def _partner(
    run: BurnIn,
    step: BurnInStep,
    good: list[tuple[BurnIn, BurnInStep]],
    waiting: list[tuple[BurnIn, BurnInStep]],
    free: dict[int, tuple[BurnIn, BurnInStep]],
) -> tuple[BurnIn, BurnInStep] | None:
    """A node that passed this step first (it tells a weak node from a weak partner), else another node
    waiting at it; never one this node was already measured with."""
    tried = set(step.evidence.get("partners", []))
    for pool in (good, waiting):
        for other in pool:
            if other[0] is not run and other[0].node_id in free and other[0].node not in tried:
                return other
    return None


def _start_pair(
    session: Session,
    clock: Clock,
    first: tuple[BurnIn, BurnInStep],
    second: tuple[BurnIn, BurnInStep],
    facts: dict[int, placement.NodeFacts],
    user: str,
) -> None:
    (run, step), (other_run, other_step) = first, second
    a, b = facts[run.node_id or -1], facts[other_run.node_id or -1]
    placement.begin(run, a, clock)
    placement.begin(other_run, b, clock)
    gpus = step.kind == "allreduce"  # the network step measures the hosts' links, with no GPU held
    where = [(a, sorted(a.gpus) if gpus else []), (b, sorted(b.gpus) if gpus else [])]
    job = placement.place_step_job(session, clock, run, step, where, user)
    now = to_datetime(clock.now())
    for r, s, partner in ((run, step, other_run.node), (other_run, other_step, run.node)):
        if s.state == PASSED:
            continue  # a known-good partner keeps its verdict and its own partner; the job is the other's
        s.partner, s.state, s.job_id = partner, RUNNING, job.id
        s.started_at = s.started_at or now
        s.threshold = verdicts.threshold_for(s, r.gpu_model)
        s.attempts += 1
    for node in (a, b):
        node.busy = True


def collect_pair(session: Session, clock: Clock, job: Job, step: BurnInStep, members: list[BurnIn]) -> None:
    """A pair job ended: judge the rows it measured. A row fails when it fell short with a partner that
    passed, or with two different partners; otherwise it pairs again (state retry)."""
    names = [r.node for r in job.ranks if r.run == job.run]
    rows = [(run, s) for run in members for s in run.steps if s.name == step.name and run.node in names]
    known_good = {run.node for run, s in rows if s.state == PASSED}
    value, problem, unit, skipped = verdicts.pair_results(session, job, step.kind, step.better)
    now = to_datetime(clock.now())
    for run, s in rows:
        if s.job_id != job.id or s.state != RUNNING:
            continue
        partner = next((n for n in names if n != run.node), "")
        before = [p for p in s.evidence.get("partners", []) if p != partner]
        attempts = [*s.evidence.get("attempts", []), {"partner": partner, "job": job.id, "value": value}]
        s.evidence = {"attempts": attempts[-MAX_PAIR_ATTEMPTS:], "partners": sorted({*before, partner})}
        s.unit, s.value = unit[:16], value
        if skipped:
            s.state, s.detail, s.ended_at = SKIPPED, problem[:1024], now
        elif value is not None and (s.threshold is None or verdicts.passes(value, s.threshold, s.better)):
            s.state, s.detail, s.ended_at = PASSED, f"with {partner}", now
        else:
            verdicts.pair_fell_short(
                s,
                problem or f"{verdicts.figure(value or 0.0, s)} {verdicts.comparison(s)} threshold {s.threshold:g}",
                partner,
                before,
                partner in known_good,
            )
            if s.state == FAILED:
                s.ended_at = now
