"""Multi-node steps (all-reduce, network): a link is measured by two or more nodes of one batch together,
a pair by default or a group of the step's `group` nodes, and a measure that falls short says only that
one of them is weak. lifecycle.grouping says who is measured with whom in each pass, and how a short
measure is judged: the suspects are split and measured again (a lone one with a node that passed the step,
a known-good partner), and a node fails when it fell short with known-good partners only, or with two sets
of partners that share no node. With pairs this is the rule of old: each node of a failed pair is paired
again, first with a known-good partner, never with one it was measured with (rotation).

Runs of a batch wait for one another at a multi-node step, and those that passed stay as known-good
partners, for PAIR_WAIT_S at most.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from gpufleet.core.clock import Clock, to_datetime
from gpufleet.jobs.models import Job
from gpufleet.lifecycle import grouping, placement, verdicts
from gpufleet.lifecycle.models import BURNIN_ACTIVE, BurnIn, BurnInStep
from gpufleet.lifecycle.profiles import PAIR
from gpufleet.lifecycle.verdicts import FAILED, PASSED, PENDING, RETRY, RUNNING, SKIPPED, STEP_DONE
from gpufleet.protocol.burnin import MULTI_NODE_KINDS

# How long nodes at a pair step wait for the runs of their batch still behind, and how long a node that
# passed it stays as a known-good partner for them: admission runs share a batch, and a steady stream of
# joins must not hold the first nodes out of service.
PAIR_WAIT_S = 600.0


def held_by_pair(run: BurnIn, members: list[BurnIn], clock: Clock) -> bool:
    """Whether the run must stay at a pair step it is done with: some started run of its batch has yet to
    decide that step, and may need it as a known-good partner: for PAIR_WAIT_S, or while a weak node is
    being named (a suspect measured again) for as long as grouping.max_attempts rounds of the step take."""
    done_pairs = [s for s in run.steps if s.kind in MULTI_NODE_KINDS and s.state == PASSED]
    if not done_pairs:
        return False
    last = done_pairs[-1]
    waited = 0.0 if last.ended_at is None else placement.since(last.ended_at, clock)
    # Naming a weak node takes at most max_attempts rounds of the step, each within its job's time limit;
    # a suspect whose node never comes back (busy, not reporting) must not hold the others for ever.
    naming_s = PAIR_WAIT_S + grouping.max_attempts(last.group_size) * last.time_limit_s
    for other in members:
        if other is run or other.state not in BURNIN_ACTIVE or other.started_at is None:
            continue
        theirs = next((s for s in other.steps if s.name == last.name), None)
        if theirs is None or theirs.state in STEP_DONE:
            continue
        # Bisecting a group of 64 takes seven rounds of the step: the halves of one node at the end need
        # the nodes that passed at the start, whatever PAIR_WAIT_S says. A first measure of a late joiner
        # does not: a stream of joins must not hold the first nodes for ever.
        if waited <= PAIR_WAIT_S:
            return True
        naming = theirs.state == RETRY or (theirs.state == RUNNING and theirs.attempts > 1)
        if naming and waited <= naming_s:
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
        step = here[0][1]
        if step.state == RETRY:  # it measured short and the partner's run ended
            _no_partner_left(step, clock)
        else:
            step.state, step.detail = SKIPPED, "no partner: burn in two or more nodes together to measure it"
            step.ended_at = to_datetime(clock.now())
        return
    free = {
        r.node: (r, s)
        for r, s in here
        if r.node_id is not None and s.state != RUNNING and placement.ready(facts[r.node_id])
    }
    pending = [r.node for r, s in undecided if s.state == PENDING and r.node in free]
    suspects = [
        grouping.Suspect(r.node, s.job_id, frozenset(s.evidence.get("partners", [])))
        for r, s in undecided
        if s.state == RETRY and r.node in free
    ]
    good = [r.node for r, s in here if s.state == PASSED and r.node in free]
    size = max((s.group_size for _, s in undecided), default=PAIR)
    plan = grouping.plan(pending, suspects, good, size)
    for names in plan.groups:
        _start_group(session, clock, [free[n] for n in names], facts, user)
    if not any(s.state == RUNNING for _, s in here):  # nothing still measuring could free a partner
        for node in plan.unmatched:
            if free[node][1].state == RETRY:
                _no_partner_left(free[node][1], clock)


def _start_group(
    session: Session,
    clock: Clock,
    members: list[tuple[BurnIn, BurnInStep]],
    facts: dict[int, placement.NodeFacts],
    user: str,
) -> None:
    """One job over these nodes (rank order). A member that already passed is a known-good partner: it
    keeps its verdict, and the job is the others'."""
    nodes = [facts[run.node_id or -1] for run, _ in members]
    for (run, _), node in zip(members, nodes, strict=True):
        placement.begin(run, node, clock)
    gpus = members[0][1].kind == "allreduce"  # the network step measures the hosts' links, with no GPU held
    where = [(n, sorted(n.gpus) if gpus else []) for n in nodes]
    job = placement.place_step_job(session, clock, members[0][0], members[0][1], where, user)
    now = to_datetime(clock.now())
    for run, s in members:
        if s.state == PASSED:
            continue
        # The partner shown is the first other node: for a lone node, its known-good partner.
        s.partner = next(r.node for r, _ in members if r is not run)
        s.state, s.job_id = RUNNING, job.id
        s.started_at = s.started_at or now
        s.threshold = verdicts.threshold_for(s, run.gpu_model)
        s.attempts += 1
    for node in nodes:
        node.busy = True


def collect_pair(session: Session, clock: Clock, job: Job, step: BurnInStep, members: list[BurnIn]) -> None:
    """A pair or group job ended: judge the rows it measured (grouping says how a short one is judged)."""
    names = [r.node for r in sorted(job.ranks, key=lambda r: r.rank) if r.run == job.run]
    rows = [(run, s) for run in members for s in run.steps if s.name == step.name and run.node in names]
    known_good = {run.node for run, s in rows if s.state == PASSED}
    value, problem, unit, skipped = verdicts.pair_results(session, job, step.kind, step.better)
    now = to_datetime(clock.now())
    for run, s in rows:
        if s.job_id != job.id or s.state != RUNNING:
            continue
        others = [n for n in names if n != run.node]
        earlier = [a.get("with") or [a.get("partner", "")] for a in s.evidence.get("attempts", [])]
        attempt = {"partner": others[0] if others else "", "with": others, "job": job.id, "value": value}
        keep = grouping.max_attempts(s.group_size)
        partners = sorted({*s.evidence.get("partners", []), *others})
        s.evidence = {"attempts": [*s.evidence.get("attempts", []), attempt][-keep:], "partners": partners}
        s.unit, s.value = unit[:16], value
        if skipped:
            s.state, s.detail, s.ended_at = SKIPPED, problem[:1024], now
        elif value is not None and (s.threshold is None or verdicts.passes(value, s.threshold, s.better)):
            s.state, s.detail, s.ended_at = PASSED, f"with {', '.join(others)}"[:1024], now
        else:
            figure = problem or f"{verdicts.figure(value or 0.0, s)} {verdicts.comparison(s)} threshold {s.threshold:g}"
            verdict = grouping.fell_short(figure, others, known_good, earlier, s.attempts, s.group_size)
            s.state, s.detail = verdict.state, verdict.detail
            if s.state == FAILED:
                s.ended_at = now
