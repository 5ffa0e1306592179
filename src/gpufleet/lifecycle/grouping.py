"""Which nodes a multi-node burn-in step measures together in this pass, and the rule that names the weak
node of a group that fell short. Pure: lifecycle.pairing reads the rows, places the jobs and records the
verdicts.

A step's `group` N (profiles.Step.group; 2 by default, pairs) says how many nodes one all-reduce spans.

Placement. The runs of a batch that reached the step and were never measured there go in groups of N, in
batch order. A remainder of two or more is a smaller last group of its own: two nodes are enough to
measure a link, and the nodes wait no longer. A remainder of one joins the last group (N + 1 nodes), so
that it is measured in this round rather than waiting a whole step for a partner; except for pairs
(N = 2), where a step measures exactly two nodes (the network step is point-to-point): the odd node waits,
as it always did, and is paired in the next round with a node that passed. A batch of fewer than N nodes
is one group of all of them (two or more); a lone node is measured with a node that passed (a known-good
partner), and skips the step when nobody else is in its batch at all (pairing).

Naming the weak node. A group that falls short says only that one of its nodes (or its link) is weak: an
all-reduce runs at the pace of its slowest link, every rank sees the same slow ring, and the head judges
the worst rank's value (verdicts.pair_results). So:

1. a group that meets the threshold passes all its nodes;
2. in a group that falls short, every node that had not passed yet becomes a suspect (step state
   "retry"); a node that had passed (a known-good partner) keeps its pass;
3. a suspect fails the step when the others it fell short with had all passed it (the measurement can
   only be its own), when it fell short twice with partners that share no node (the pair rule of old:
   two different partners), or once it has been measured `max_attempts(N)` times;
4. the other suspects of one failed measurement are split in two halves (bisection), measured side by
   side in the next round: a half of two or more nodes on its own, a half of one node with a
   known-good partner, else with another lone suspect it was never measured with. A half that passes
   clears its nodes; one that falls short is split again.

Why bisection: a single weak node (or link) in a group of k is named in ceil(log2 k) rounds after the
first, the healthy nodes of its group passing as soon as their half does; each round measures every
suspect at once, so the rounds, not the jobs, bound the time a batch is held. It needs known-good
partners only for halves of one node, and one per such half: a batch burned in as one group has none at
all until a half passes, and then exactly as many as it needs. Measuring each suspect of a group of k with
its own known-good partner straight away would need k of them free at once, and has none to use in a
batch of one group. The bound on attempts is the first measure, one per halving of the largest group
(N + 1, or N for pairs), and one spare for a lone node that had to rotate partners; for pairs it is
MAX_PAIR_ATTEMPTS, 3, as before. Two weak nodes in one group fall into separate halves, or share one
down to the last split, where each is measured with a known-good partner; with nobody known to be good in
the batch at all, a suspect with no one left to tell the sides apart fails rather than pass untested.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from gpufleet.lifecycle.profiles import PAIR
from gpufleet.lifecycle.verdicts import FAILED, MAX_PAIR_ATTEMPTS, RETRY


def max_attempts(group: int) -> int:
    """How many times a node may be measured at a step of this group size before it fails."""
    largest = group if group == PAIR else group + 1  # a remainder of one joins the last group
    return max(MAX_PAIR_ATTEMPTS, 2 + math.ceil(math.log2(largest)))


def split(names: Sequence[str], group: int) -> list[list[str]]:
    """Never-measured nodes in groups of `group`, the remainder handled as the module says. A lone node
    (or the odd one of pairs) comes back as a group of one: it needs a partner."""
    if len(names) <= group:
        return [list(names)] if names else []
    groups = [list(names[i : i + group]) for i in range(0, len(names), group)]
    if len(groups[-1]) == 1 and group != PAIR:
        last = groups.pop()
        groups[-1] += last
    return groups


@dataclass(frozen=True, slots=True)
class Suspect:
    """A node that fell short and is measured again: the job it fell short in, and every node it was
    measured with at this step."""

    name: str
    job: int | None
    tried: frozenset[str] = frozenset()


@dataclass(slots=True)
class Plan:
    """The measurements to start in this pass (each a list of nodes, rank order: a suspect before its
    known-good partner), and the lone nodes for which no partner was free."""

    groups: list[list[str]] = field(default_factory=list)
    unmatched: list[str] = field(default_factory=list)


def plan(pending: Sequence[str], suspects: Sequence[Suspect], good: Sequence[str], group: int) -> Plan:
    """What to measure now among the free nodes at the step: `pending` never measured there, `suspects`
    that fell short, `good` that passed (known-good partners), each in batch order."""
    out = Plan()
    lone: list[tuple[str, frozenset[str]]] = []
    # Each failed measurement's suspects, split in two halves (bisection).
    by_job: dict[int | None, list[Suspect]] = {}
    for suspect in suspects:
        by_job.setdefault(suspect.job, []).append(suspect)
    for members in by_job.values():
        half = (len(members) + 1) // 2
        for part in (members[:half], members[half:]):
            if len(part) >= 2:
                out.groups.append([s.name for s in part])
            elif part:
                lone.append((part[0].name, part[0].tried))
    for names in split(pending, group):
        if len(names) >= 2:
            out.groups.append(names)
        else:
            lone.append((names[0], frozenset()))
    _partner_lone(lone, list(good), out)
    return out


def _partner_lone(lone: list[tuple[str, frozenset[str]]], good: list[str], out: Plan) -> None:
    """Each lone node with a known-good partner first (it tells a weak node from a weak partner), one it was
    not measured with before if there is one; else with another lone node it was never measured with
    (rotation: measuring two suspects again together tells nothing new)."""
    taken: set[str] = set()
    for name, tried in lone:
        if name in taken:
            continue
        # A node that shared a group that fell short, then passed, is known-good all the same: in a group
        # every suspect was measured with every other node of it.
        partner = next((g for g in good if g not in tried), next(iter(good), None))
        if partner is not None:
            good.remove(partner)
        else:
            partner = next(
                (n for n, theirs in lone if n != name and n not in taken and n not in tried and name not in theirs),
                None,
            )
        if partner is None:
            out.unmatched.append(name)
            continue
        taken |= {name, partner}
        out.groups.append([name, partner])


@dataclass(frozen=True, slots=True)
class Verdict:
    state: str  # FAILED or RETRY
    detail: str


def fell_short(
    figure: str,
    others: Sequence[str],
    known_good: Iterable[str],
    before: Sequence[Sequence[str]],
    attempts: int,
    group: int,
) -> Verdict:
    """A node's verdict when its measurement with `others` fell short (`figure`: the value against the
    threshold, or the problem). `before`: the others of each earlier measurement it fell short in."""
    good = set(known_good)
    with_ = ", ".join(others)
    if others and all(o in good for o in others):
        passed = "a node that passed this step" if len(others) == 1 else "nodes that passed this step"
        return Verdict(FAILED, f"{figure} with {with_}, {passed}"[:1024])
    disjoint = [b for b in before if b and not set(b) & set(others)]
    if others and disjoint:
        earlier = ", ".join(dict.fromkeys(n for b in disjoint for n in b))
        return Verdict(FAILED, f"{figure} with {with_}, and before with {earlier}"[:1024])
    if attempts >= max_attempts(group):
        return Verdict(FAILED, f"{figure} with {with_}, {attempts} times"[:1024])
    suspects = [o for o in others if o not in good]
    again = (
        "measuring again in halves to name the weak node"
        if len(suspects) >= 2
        else "pairing again with another partner"
    )
    return Verdict(RETRY, f"{figure} with {with_}; {again}"[:1024])
