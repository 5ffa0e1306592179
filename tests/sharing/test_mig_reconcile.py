"""Bringing GPUs to their declared MIG layouts against the database: which GPUs drift (`to_change`), the
MigApply sent for the idle ones of nodes that are up (`outgoing`), the retry delay, and the agent's answer
(`record_result`). A layout a GPU model cannot take is shown as a problem, never sent."""

from __future__ import annotations

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.core.clock import FakeClock, to_datetime
from gpufleet.core.db import transaction
from gpufleet.inventory import categories
from gpufleet.inventory.mig_layouts import gpu_layout, layouts, to_change
from gpufleet.inventory.models import Node
from gpufleet.inventory.states import NodeState
from gpufleet.protocol.mig import MigResult
from gpufleet.sharing import reconcile, service
from gpufleet.sharing.reconcile import RETRY_S, SETTLE_S
from tests.jobs.helpers import report, users
from tests.sharing.helpers import (
    ALL_1G,
    H200,
    SEVEN_1G,
    T4,
    add_node,
    answer,
    category,
    hold,
    hold_instance,
    ids,
    mig_instances,
    node_row,
    send,
)


@pytest.fixture
def alice(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    users(sessions, clock, "alice")


# -- which GPUs drift ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "profiles", "declared", "in_sync"),
    [
        ("enabled", SEVEN_1G, ALL_1G, True),
        ("enabled", SEVEN_1G[:6], ALL_1G, False),  # one instance short
        ("enabled", [], ALL_1G, False),  # MIG on, no instances
        ("disabled", [], ALL_1G, False),
        (None, [], ALL_1G, False),  # mode unknown: not MIG on
        ("enabled", ["4g.71gb", "3g.71gb"], "3g.71gb+4g.71gb", True),  # any order
        ("enabled", ["3g.71gb", "3g.71gb"], "3g.71gb+4g.71gb", False),
        ("enabled", ["3g.71gb", "4g.71gb"], ALL_1G, False),
        ("disabled", [], "none", True),
        (None, [], "none", True),
        ("enabled", SEVEN_1G, "none", False),
        ("enabled", SEVEN_1G, None, True),  # unset: left as found
        ("disabled", [], None, True),
    ],
)
def test_gpu_layout_compares_the_instances_with_the_declared_layout(
    mode: str | None, profiles: list[str], declared: str | None, in_sync: bool
) -> None:
    found = gpu_layout(3, *H200, mode, mig_instances("n", 3, profiles), declared)
    assert (found.index, found.declared, found.in_sync, found.problem) == (3, declared, in_sync, None)


def test_gpu_layout_describes_the_gpu_as_it_is() -> None:
    assert gpu_layout(0, *H200, "disabled", [], ALL_1G).actual == "whole"
    assert gpu_layout(0, *H200, "enabled", [], ALL_1G).actual == "MIG on, no instances"
    assert gpu_layout(0, *H200, "enabled", mig_instances("n", 0, SEVEN_1G), None).actual == "7x1g.18gb"
    mixed = mig_instances("n", 0, ["4g.71gb", "1g.18gb", "1g.18gb"])
    assert gpu_layout(0, *H200, "enabled", mixed, None).actual == "2x1g.18gb+4g.71gb"


@pytest.mark.parametrize(
    ("model", "layout", "problem"),
    [(T4, ALL_1G, "no MIG"), (H200, "all-1g.10gb", "no MIG profile 1g.10gb"), (H200, "2x4g.71gb", "compute slices")],
)
def test_a_layout_the_gpu_cannot_take_is_in_sync_with_its_problem(
    model: tuple[str, int], layout: str, problem: str
) -> None:
    found = gpu_layout(0, *model, "disabled", [], layout)
    assert found.in_sync
    assert found.problem is not None
    assert problem in found.problem


def test_to_change_lists_exactly_the_drifting_gpus(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    category(sessions, clock, "slices", ALL_1G)
    reversed_1g = list(reversed(mig_instances("a", 0, SEVEN_1G)))
    add_node(
        sessions,
        clock,
        "a",
        [(H200, SEVEN_1G), (H200, None), (H200, ["3g.71gb", "4g.71gb"]), (H200, SEVEN_1G[:6]), (H200, [])],
        category="slices",
    )
    add_node(sessions, clock, "b", [(H200, SEVEN_1G), (H200, None)], category="slices", layout="none")  # node wins
    add_node(sessions, clock, "c", [(H200, None), (H200, SEVEN_1G)])  # no layout: left as found
    add_node(sessions, clock, "t4", [(T4, None), (T4, None)], category="slices")
    add_node(sessions, clock, "e", [(H200, None)], category="slices", layout="none")  # in sync
    # The order the agent lists the instances in does not matter.
    with transaction(sessions) as s:
        gpu0 = next(g for g in s.scalars(select(Node).where(Node.name == "a")).one().gpus if g.index == 0)
        gpu0.mig = reversed_1g
    by_name = ids(sessions)
    with transaction(sessions, readonly=True) as s:
        assert to_change(s) == {by_name["a"]: {1, 2, 3, 4}, by_name["b"]: {0}}
        assert to_change(s, [by_name["b"], by_name["c"]]) == {by_name["b"]: {0}}
        assert to_change(s, [by_name["c"], by_name["t4"], by_name["e"]]) == {}
        found = layouts(s)
        assert set(found) == set(by_name.values())  # every node when not `declared_only`
        assert [g.declared for g in found[by_name["c"]]] == [None, None]
        assert [g.in_sync for g in found[by_name["t4"]]] == [True, True]
        assert all(g.problem is not None and "no MIG" in g.problem for g in found[by_name["t4"]])
        assert set(layouts(s, declared_only=True)) == {by_name[n] for n in ("a", "b", "t4", "e")}


# -- what is sent -------------------------------------------------------------------------------------


@pytest.mark.usefixtures("alice")
def test_outgoing_sends_only_idle_drifting_gpus_of_nodes_up_and_marks_them(
    sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    category(sessions, clock, "slices", ALL_1G)
    add_node(sessions, clock, "a", [(H200, SEVEN_1G), (H200, None), (H200, None)], category="slices")
    add_node(sessions, clock, "down", [(H200, None)], category="slices", state=NodeState.DOWN)
    add_node(sessions, clock, "new", [(H200, None)], category="slices", state=NodeState.NEW)
    add_node(sessions, clock, "plain", [(H200, None), (H200, SEVEN_1G)])
    add_node(sessions, clock, "t4", [(T4, None)], category="slices")
    busy = hold(sessions, clock, "a", [2])

    assert send(sessions, clock) == {"a": {1: ALL_1G}}  # GPU 0 is in sync, GPU 2 is held
    assert node_row(sessions, "a").mig_sent_at == to_datetime(clock.now())
    for name in ("down", "new", "plain", "t4"):
        assert node_row(sessions, name).mig_sent_at is None

    # A node that comes up is sent its change at once; `a` is not asked again meanwhile.
    clock.advance(5)
    with transaction(sessions) as s:
        s.scalars(select(Node).where(Node.name == "down")).one().state = NodeState.UP
    assert send(sessions, clock) == {"down": {0: ALL_1G}}
    assert node_row(sessions, "down").mig_sent_at == to_datetime(clock.now())

    # A rank running still holds its GPU; once it exits and the agent answered, GPU 2 goes too.
    report(sessions, clock, busy, state="running", outcome=None)
    answer(sessions, clock, "a", {})
    clock.advance(SETTLE_S + 1)
    assert send(sessions, clock) == {"a": {1: ALL_1G}}
    report(sessions, clock, busy)
    answer(sessions, clock, "a", {})
    clock.advance(SETTLE_S + 1)
    assert send(sessions, clock) == {"a": {1: ALL_1G, 2: ALL_1G}}


@pytest.mark.usefixtures("alice")
def test_a_node_with_every_drifting_gpu_held_is_sent_nothing_and_not_marked(
    sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    add_node(sessions, clock, "a", [(H200, SEVEN_1G), (H200, None)], layout="none")
    hold_instance(sessions, clock, "a", "MIG-a-0-3")  # a MIG rank holds its device's GPU
    assert send(sessions, clock) == {}
    assert node_row(sessions, "a").mig_sent_at is None
    with transaction(sessions, readonly=True) as s:
        assert to_change(s) == {ids(sessions)["a"]: {0}}  # still drifting: no new job lands on it


def test_nothing_is_sent_again_within_retry_s(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    add_node(sessions, clock, "a", [(H200, None), (H200, None)], layout=ALL_1G)
    first = clock.now()
    assert send(sessions, clock) == {"a": {0: ALL_1G, 1: ALL_1G}}
    assert send(sessions, clock) == {}
    clock.advance(RETRY_S - 1)
    assert send(sessions, clock) == {}
    assert node_row(sessions, "a").mig_sent_at == to_datetime(first)
    clock.advance(2)
    assert send(sessions, clock) == {"a": {0: ALL_1G, 1: ALL_1G}}
    assert node_row(sessions, "a").mig_sent_at == to_datetime(clock.now())
    assert send(sessions, clock) == {}


def test_each_message_has_its_own_id(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    add_node(sessions, clock, "a", [(H200, None)], layout=ALL_1G)
    add_node(sessions, clock, "b", [(H200, None)], layout=ALL_1G)
    with transaction(sessions) as s:
        first = reconcile.outgoing(s, clock, list(ids(sessions).values()))
    clock.advance(RETRY_S + 1)
    with transaction(sessions) as s:
        again = reconcile.outgoing(s, clock, list(ids(sessions).values()))
    sent = [m.id for _, m in first + again]
    assert len(sent) == 4
    assert len(set(sent)) == 4


def test_outgoing_reads_only_the_nodes_it_is_given(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    add_node(sessions, clock, "a", [(H200, None)], layout=ALL_1G)
    add_node(sessions, clock, "b", [(H200, None)], layout=ALL_1G)
    by_name = ids(sessions)
    with transaction(sessions) as s:
        assert reconcile.outgoing(s, clock, []) == []
        found = reconcile.outgoing(s, clock, [by_name["b"]])
    assert [node_id for node_id, _ in found] == [by_name["b"]]
    assert node_row(sessions, "a").mig_sent_at is None


def test_a_gpu_still_off_its_layout_after_a_done_answer_is_asked_again_after_settle_s(
    sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    add_node(sessions, clock, "a", [(H200, None), (H200, None)], layout=ALL_1G)
    assert send(sessions, clock) == {"a": {0: ALL_1G, 1: ALL_1G}}
    clock.advance(3)
    answer(sessions, clock, "a", {})
    row = node_row(sessions, "a")
    assert (row.mig_sent_at, row.mig_answered, row.mig_errors) == (to_datetime(clock.now()), True, {})
    # The inventory did not change here, so the GPUs still drift: asked again, but not in a tight loop.
    clock.advance(SETTLE_S - 1)
    assert send(sessions, clock) == {}
    clock.advance(2)
    assert send(sessions, clock) == {"a": {0: ALL_1G, 1: ALL_1G}}


def test_an_answer_with_errors_keeps_them_and_waits_retry_s_from_the_answer(
    sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    add_node(sessions, clock, "a", [(H200, None), (H200, None)], layout=ALL_1G)
    assert send(sessions, clock) == {"a": {0: ALL_1G, 1: ALL_1G}}
    clock.advance(30)
    answered = clock.now()
    answer(sessions, clock, "a", {1: "GPU 1 is in use by another process"})
    row = node_row(sessions, "a")
    assert row.mig_errors == {"1": "GPU 1 is in use by another process"}
    assert row.mig_sent_at == to_datetime(answered)
    with transaction(sessions, readonly=True) as s:
        (shown,) = service.status(s, node="a")
    assert shown.asked
    assert shown.errors == {"1": "GPU 1 is in use by another process"}

    clock.advance(RETRY_S - 1)  # RETRY_S after the request, but not after the answer
    assert send(sessions, clock) == {}
    clock.advance(2)
    assert send(sessions, clock) == {"a": {0: ALL_1G, 1: ALL_1G}}
    clock.advance(1)
    answer(sessions, clock, "a", {})
    row = node_row(sessions, "a")
    assert (row.mig_answered, row.mig_errors) == (True, {})


def test_an_answer_for_a_node_that_is_gone_is_ignored(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    with transaction(sessions) as s:
        reconcile.record_result(s, clock, 9999, MigResult(id=1, errors={0: "x"}))


def test_a_layout_the_model_cannot_take_is_never_sent(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    category(sessions, clock, "slices", ALL_1G)
    add_node(sessions, clock, "t4", [(T4, None), (T4, None)], category="slices")
    add_node(sessions, clock, "h", [(H200, None)], layout="all-1g.10gb")  # an A100-80GB/H100 profile
    for _ in range(3):
        assert send(sessions, clock) == {}
        clock.advance(RETRY_S + 1)
    with transaction(sessions, readonly=True) as s:
        shown = {n.node: n for n in service.status(s)}
    assert shown["t4"].in_sync
    assert shown["h"].in_sync
    assert not shown["t4"].asked
    assert not shown["h"].asked
    assert all(g.problem and "no MIG" in g.problem for g in shown["t4"].gpus)
    assert all(g.problem and "1g.10gb" in g.problem for g in shown["h"].gpus)


def test_a_node_without_a_declared_layout_is_never_sent_anything(
    sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    category(sessions, clock, "plain", None)
    add_node(sessions, clock, "a", [(H200, None), (H200, SEVEN_1G), (H200, ["3g.71gb"])], category="plain")
    add_node(sessions, clock, "b", [(H200, SEVEN_1G)])
    for _ in range(3):
        assert send(sessions, clock) == {}
        clock.advance(RETRY_S + 1)
    with transaction(sessions, readonly=True) as s:
        assert to_change(s) == {}
        assert all(g.in_sync and g.declared is None for n in service.status(s) for g in n.gpus)
    assert node_row(sessions, "a").mig_sent_at is None


def test_unsetting_the_layout_stops_what_was_due(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    category(sessions, clock, "slices", ALL_1G)
    add_node(sessions, clock, "a", [(H200, None)], category="slices")
    assert send(sessions, clock) == {"a": {0: ALL_1G}}
    with transaction(sessions) as s:
        categories.update_category(s, clock, "slices", unset=["mig_layout"])
    clock.advance(RETRY_S + 1)
    assert send(sessions, clock) == {}


def test_under_slurm_only_nodes_slurm_has_drained_are_changed(
    sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    add_node(sessions, clock, "a", [(H200, None)], layout=ALL_1G)
    node_id = ids(sessions)["a"]

    def slurm_send() -> dict[int, int]:
        with transaction(sessions) as s:
            return {n: len(m.gpus) for n, m in reconcile.outgoing(s, clock, [node_id], slurm=True)}

    for state in (None, "mixed", "draining", "idle"):
        with transaction(sessions) as s:
            s.get(Node, node_id).wlm_state = state  # type: ignore[union-attr]
        assert slurm_send() == {}, state  # gpufleet cannot see which GPUs Slurm's jobs hold
    with transaction(sessions) as s:
        s.get(Node, node_id).wlm_state = "drained"  # type: ignore[union-attr]
    assert slurm_send() == {node_id: 1}
