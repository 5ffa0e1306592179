"""All-reduce steps over groups of nodes (`group = N`): the profile option, where the runs of a batch go,
and how a weak node in a group that fell short is named (bisection), with the agents played by hand."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.core.clock import FakeClock
from gpufleet.core.db import transaction
from gpufleet.core.errors import InvalidInput
from gpufleet.jobs import output
from gpufleet.jobs.models import Job, JobState
from gpufleet.lifecycle import grouping, pairing
from gpufleet.lifecycle.grouping import Suspect
from gpufleet.lifecycle.profiles import MAX_GROUP, Profile, Step, load_profile
from gpufleet.lifecycle.schemas import ProfileOut
from gpufleet.protocol.burnin import StepResult, format_result
from gpufleet.protocol.jobs import JobOutput
from tests.jobs import helpers
from tests.lifecycle.test_burnin import advance, runs, start

pytestmark = pytest.mark.one_database

THRESHOLD = 35.0  # GB/s, the built-in profiles' all-reduce floor on an H200
HEALTHY, WEAK = 46.0, 13.8  # what a healthy ring measures, and one through a link at 30 %


def grouped(group: int) -> Profile:
    return Profile("g", "test", (Step("allreduce", "allreduce", 10, {}, {"h200": THRESHOLD}, group),))


# -- the profile option ------------------------------------------------------------------------------------


def profile_file(tmp_path: Path, kind: str, group: str) -> Path:
    path = tmp_path / "g.toml"
    path.write_text(f'name = "g"\ndescription = "groups"\n[[steps]]\nkind = "{kind}"\ngroup = {group}\n')
    return path


def test_group_is_read_from_the_profile_and_defaults_to_pairs(tmp_path: Path) -> None:
    assert load_profile(profile_file(tmp_path, "allreduce", "8")).steps[0].group == 8
    assert load_profile(profile_file(tmp_path, "network", "2")).steps[0].group == 2
    (tmp_path / "p.toml").write_text('name = "p"\ndescription = "pairs"\n[[steps]]\nkind = "allreduce"\n')
    assert load_profile(tmp_path / "p.toml").steps[0].group == 2


@pytest.mark.parametrize(
    ("kind", "group", "says"),
    [
        ("allreduce", "1", "group must be a whole number of nodes from 2 to 64 (2: pairs), not 1"),
        ("allreduce", "0", "not 0"),
        ("allreduce", str(MAX_GROUP + 1), "not 65"),
        ("allreduce", "4.0", "not 4.0"),
        ("allreduce", '"4"', "not '4'"),
        ("allreduce", "true", "not True"),
        ("network", "4", "group = 4 does not apply to a network step: it measures point-to-point links"),
        ("gemm", "4", "step gemm: group is for steps over several nodes (allreduce); a gemm step runs on one node"),
        ("disk", "2", "a disk step runs on one node"),
    ],
)
def test_a_bad_group_is_refused_naming_the_file_step_and_problem(
    tmp_path: Path, kind: str, group: str, says: str
) -> None:
    with pytest.raises(InvalidInput, match=r"g\.toml") as refused:
        load_profile(profile_file(tmp_path, kind, group))
    assert says in str(refused.value)


def test_the_profile_listing_says_how_many_nodes_a_step_measures_together() -> None:
    steps = (Step("gemm", "gemm", 10), Step("allreduce", "allreduce", 10, {}, {}, 8), Step("network", "network", 10))
    listed = ProfileOut.of(Profile("g", "test", steps), "/built-in")
    assert [(s.pairs, s.group) for s in listed.steps] == [(False, None), (True, 8), (True, 2)]


# -- placement and the bisection plan, pure ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("nodes", "group", "sizes"),
    [
        (8, 4, [4, 4]),
        (10, 4, [4, 4, 2]),  # a remainder of two or more: a smaller group of its own
        (9, 4, [4, 5]),  # a remainder of one joins the last group
        (3, 4, [3]),  # fewer than the group: one group of all of them
        (5, 2, [2, 2, 1]),  # pairs: the odd node waits for a known-good partner
        (1, 4, [1]),
    ],
)
def test_never_measured_nodes_go_in_groups_of_the_steps_size(nodes: int, group: int, sizes: list[int]) -> None:
    names = [f"n{i}" for i in range(1, nodes + 1)]
    groups = grouping.split(names, group)
    assert [len(g) for g in groups] == sizes
    assert [n for g in groups for n in g] == names  # batch order, every node once


def test_a_failed_group_is_split_in_halves_and_lone_halves_get_known_good_partners() -> None:
    four = [Suspect(n, 7, frozenset({"a", "b", "c", "d"} - {n})) for n in "abcd"]
    two = [Suspect(n, 9, frozenset({"e", "f"} - {n})) for n in "ef"]
    plan = grouping.plan([], [*four, *two], ["g1", "g2"], 4)
    assert plan.groups == [["a", "b"], ["c", "d"], ["e", "g1"], ["f", "g2"]]
    assert plan.unmatched == []
    # No known-good node free: a lone suspect never goes back to one it was measured with.
    assert grouping.plan([], two, [], 4).unmatched == ["e", "f"]


def test_the_attempts_allowed_cover_one_halving_per_level_of_the_largest_group() -> None:
    assert grouping.max_attempts(2) == 3  # pairs, as before
    assert grouping.max_attempts(4) == 5  # 4 + a folded remainder of one: 5 nodes, three halvings
    assert grouping.max_attempts(8) == 6


# -- over the database -------------------------------------------------------------------------------------

Ring = Callable[[list[str]], float]  # the nodes of one job (rank order) -> the bus bandwidth every rank sees


def ring_with_weak(*weak: str) -> Ring:
    """An all-reduce runs at its slowest link's pace: every rank of a ring through a weak node sees it."""
    return lambda nodes: WEAK if set(nodes) & set(weak) else HEALTHY


def answer_rings(sessions: sessionmaker[Session], clock: FakeClock, ring: Ring) -> list[list[str]]:
    """Every running step job ends, each rank printing the ring's value. Returns each job's nodes."""
    with transaction(sessions, readonly=True) as s:
        running = [
            (j.id, [r.node for r in sorted(j.ranks, key=lambda r: r.rank)])
            for j in s.scalars(select(Job).where(Job.state == JobState.RUNNING).order_by(Job.id))
        ]
    for job_id, nodes in running:
        line = format_result(StepResult(kind="allreduce", value=ring(nodes), unit="GB/s"))
        for rank, node in enumerate(nodes):
            chunk = JobOutput(job_id=job_id, run=1, rank=rank, stream="stdout", offset=0, data=line)
            with transaction(sessions) as s:
                output.store(s, clock, [(helpers.node_id(sessions, node), chunk)], 1 << 20)
            helpers.report(sessions, clock, job_id, rank=rank, node=node)
    return [nodes for _, nodes in running]


def burn_in(
    sessions: sessionmaker[Session], clock: FakeClock, nodes: int, group: int, ring: Ring, round_s: float = 0.0
) -> list[list[list[str]]]:
    """Burn `nodes` nodes in over a group step until every run ended, each round lasting `round_s`.
    Returns each round's jobs."""
    helpers.cluster(sessions, clock, nodes=nodes)
    start(sessions, clock, [f"n{i}" for i in range(1, nodes + 1)], grouped(group))
    rounds = []
    for _ in range(12):
        advance(sessions, clock)
        clock.advance(round_s)
        jobs = answer_rings(sessions, clock, ring)
        if jobs:
            rounds.append(jobs)
        elif all(r.state not in ("queued", "running") for r in runs(sessions).values()):
            return rounds
    raise AssertionError("burn-in did not end")


def test_groups_of_four_over_eight_healthy_nodes_all_pass_in_one_round(
    sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    rounds = burn_in(sessions, clock, 8, 4, ring_with_weak())
    assert rounds == [[["n1", "n2", "n3", "n4"], ["n5", "n6", "n7", "n8"]]]
    done = runs(sessions)
    assert {r.state for r in done.values()} == {"passed"}
    step = done["n1"].steps[0]
    assert (step.state, step.value, step.attempts, step.group_size) == ("passed", HEALTHY, 1, 4)
    assert step.detail == "with n2, n3, n4"
    assert step.partner == "n2"
    assert step.evidence["attempts"][0]["with"] == ["n2", "n3", "n4"]


def test_one_weak_node_in_a_group_of_four_is_the_only_one_failed_naming_step_and_value(
    sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    rounds = burn_in(sessions, clock, 8, 4, ring_with_weak("n3"))
    # The group falls short; its halves are measured side by side (the other group passed); n3's half
    # falls short again, and each of its two nodes is measured with a node that passed.
    assert rounds[0] == [["n1", "n2", "n3", "n4"], ["n5", "n6", "n7", "n8"]]
    assert rounds[1] == [["n1", "n2"], ["n3", "n4"]]
    assert [nodes[0] for nodes in rounds[2]] == ["n3", "n4"]
    assert all(nodes[1] in {"n5", "n6", "n7", "n8"} for nodes in rounds[2])
    assert len(rounds) == 3
    done = runs(sessions)
    assert {n for n, r in done.items() if r.state == "failed"} == {"n3"}
    assert {r.state for n, r in done.items() if n != "n3"} == {"passed"}
    weak = done["n3"].steps[0]
    assert weak.attempts == 3
    assert weak.value == WEAK
    partner = rounds[2][0][1]
    assert done["n3"].reason == f"allreduce: 13.8 GB/s under threshold 35 with {partner}, a node that passed this step"
    assert [a["with"] for a in weak.evidence["attempts"]] == [["n1", "n2", "n4"], ["n4"], [partner]]
    assert done["n4"].steps[0].attempts == 3  # cleared only with its known-good partner
    assert done["n1"].steps[0].attempts == 2  # its half passed


def test_a_weak_node_in_one_group_of_eight_is_named_in_log2_rounds_without_any_known_good_node(
    sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    rounds = burn_in(sessions, clock, 8, 8, ring_with_weak("n6"))
    assert [sorted(len(j) for j in r) for r in rounds] == [[8], [4, 4], [2, 2], [2, 2]]
    done = runs(sessions)
    assert {n for n, r in done.items() if r.state == "failed"} == {"n6"}
    assert done["n6"].steps[0].attempts == 4  # 1 + log2(8)
    assert "a node that passed this step" in done["n6"].reason


def test_nodes_that_passed_stay_as_known_good_partners_while_a_weak_node_is_named_past_the_wait(
    sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    # Rounds longer than PAIR_WAIT_S (a long all-reduce, or a big group), and a weak node in each quarter
    # of the second half: the lone halves of the fourth round need the nodes that passed in the second.
    rounds = burn_in(sessions, clock, 8, 8, ring_with_weak("n6", "n8"), round_s=pairing.PAIR_WAIT_S + 1)
    assert len(rounds) == 4
    assert all(nodes[1] in {"n1", "n2", "n3", "n4"} for nodes in rounds[3])
    done = runs(sessions)
    assert {n for n, r in done.items() if r.state == "failed"} == {"n6", "n8"}
    assert all("a node that passed this step" in done[n].reason for n in ("n6", "n8"))


def test_nodes_that_passed_are_let_go_once_naming_a_weak_node_has_taken_all_its_rounds(
    sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    helpers.cluster(sessions, clock, nodes=4)
    start(sessions, clock, ["n1", "n2", "n3", "n4"], grouped(2))
    advance(sessions, clock)
    answer_rings(sessions, clock, ring_with_weak("n1"))  # n1 and n2 fall short; n3 and n4 pass
    for name in ("n1", "n2"):  # Slurm runs work there now: the suspects cannot be measured again
        helpers.set_node(sessions, name, wlm_state="mixed")
    advance(sessions, clock)
    assert {n: r.steps[0].state for n, r in runs(sessions).items()} == {
        "n1": "retry",
        "n2": "retry",
        "n3": "passed",
        "n4": "passed",
    }
    clock.advance(pairing.PAIR_WAIT_S + 1)
    advance(sessions, clock)
    assert runs(sessions)["n3"].state == "running"  # still a known-good partner for the suspects
    step = grouped(2).steps[0]
    clock.advance(grouping.max_attempts(2) * step.time_limit_s)
    advance(sessions, clock)
    assert runs(sessions)["n3"].state == "passed"  # let go: the suspects never came back


def test_two_weak_nodes_in_one_group_are_both_named_and_the_rest_pass(
    sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    burn_in(sessions, clock, 8, 4, ring_with_weak("n1", "n3"))
    done = runs(sessions)
    assert {n for n, r in done.items() if r.state == "failed"} == {"n1", "n3"}
    assert all("a node that passed this step" in done[n].reason for n in ("n1", "n3"))


@pytest.mark.parametrize(("nodes", "sizes"), [(10, [4, 4, 2]), (9, [4, 5]), (3, [3])])
def test_the_remainder_of_a_batch_is_measured_in_the_first_round(
    sessions: sessionmaker[Session], clock: FakeClock, nodes: int, sizes: list[int]
) -> None:
    rounds = burn_in(sessions, clock, nodes, 4, ring_with_weak())
    assert [len(j) for j in rounds[0]] == sizes
    assert len(rounds) == 1
    assert {r.state for r in runs(sessions).values()} == {"passed"}


def test_a_lone_node_skips_a_group_step_as_it_skips_a_pair_step(
    sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    assert burn_in(sessions, clock, 1, 4, ring_with_weak()) == []
    alone = runs(sessions)["n1"]
    assert alone.state == "passed"
    assert alone.steps[0].state == "skipped"
    assert "no partner" in alone.steps[0].detail
