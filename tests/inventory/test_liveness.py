"""Liveness logic at scale with a fake clock: no sleeping, both databases."""

from sqlalchemy.orm import Session, sessionmaker

from gpufleet.core.clock import FakeClock
from gpufleet.core.db import transaction
from gpufleet.inventory import service as inventory
from gpufleet.inventory.liveness import Deadlines, HeartbeatBook, flush, sweep
from gpufleet.inventory.schemas import NodeSettings
from gpufleet.inventory.states import NodeState

DEADLINE = 2.5


def _setup(sessions: sessionmaker[Session], clock: FakeClock, count: int) -> dict[str, int]:
    with transaction(sessions) as s:
        return {n.name: n.id for n in inventory.add_nodes(s, clock, [f"n[1-{count}]"], NodeSettings())}


def _setup_more(sessions: sessionmaker[Session], clock: FakeClock, names: list[str]) -> dict[str, int]:
    with transaction(sessions) as s:
        return {n.name: n.id for n in inventory.add_nodes(s, clock, names, NodeSettings())}


def _sweep(
    sessions: sessionmaker[Session], clock: FakeClock, book: HeartbeatBook, leader_since: float = 0.0
) -> list[str]:
    with transaction(sessions) as s:
        rules = Deadlines(down_after_intervals=DEADLINE, default_interval_s=1.0, leader_since=leader_since, grace_s=10)
        changes = sweep(s, clock, book, rules)
    return [c.name for c in changes if c.to_state is NodeState.DOWN]


def _flush(sessions: sessionmaker[Session], clock: FakeClock, book: HeartbeatBook) -> list[str]:
    with transaction(sessions) as s:
        return [c.name for c in flush(s, clock, book.take_pending())]


def _states(sessions: sessionmaker[Session]) -> dict[str, NodeState]:
    with transaction(sessions) as s:
        return {n.name: n.state for n in inventory.list_nodes(s)}


def test_silent_nodes_go_down_within_three_intervals_and_come_back(
    sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    ids = _setup(sessions, clock, 300)
    book = HeartbeatBook()
    for node_id in ids.values():
        book.record(node_id, clock.now(), 1.0, 0)
    assert len(_flush(sessions, clock, book)) == 300  # new -> up on the first durable heartbeat
    silent = {"n7", "n100", "n299"}
    went_down_at: dict[str, float] = {}
    for _tick in range(40):  # 4 s of 0.1 s ticks; everyone but `silent` beats each second
        clock.advance(0.1)
        if round(clock.now() * 10) % 10 == 0:
            for name, node_id in ids.items():
                if name not in silent:
                    book.record(node_id, clock.now(), 1.0, 1)
            _flush(sessions, clock, book)
        for name in _sweep(sessions, clock, book):
            went_down_at[name] = clock.now()
    assert set(went_down_at) == silent  # and no false downs among the 297 others
    start = 1_800_000_000.0
    for at in went_down_at.values():
        assert DEADLINE < at - start <= 3.0
    for name in silent:
        book.record(ids[name], clock.now(), 1.0, 2)
    assert sorted(_flush(sessions, clock, book)) == sorted(silent)
    assert set(_states(sessions).values()) == {NodeState.UP}


def test_per_node_interval_sets_the_deadline(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    ids = _setup(sessions, clock, 2)
    book = HeartbeatBook()
    book.record(ids["n1"], clock.now(), 1.0, 0)
    book.record(ids["n2"], clock.now(), 10.0, 0)  # a node configured for slow heartbeats
    _flush(sessions, clock, book)
    clock.advance(3)
    assert _sweep(sessions, clock, book) == ["n1"]
    clock.advance(22.1)
    assert _sweep(sessions, clock, book) == ["n2"]


def test_new_leader_judges_only_after_grace(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    ids = _setup(sessions, clock, 1)
    book = HeartbeatBook()
    book.record(ids["n1"], clock.now(), 1.0, 0)
    _flush(sessions, clock, book)
    clock.advance(60)  # the head was down for a minute
    fresh = HeartbeatBook()  # a restarted head has an empty book
    leader_since = clock.now()
    ids2 = _setup_more(sessions, clock, ["n2"])
    assert _sweep(sessions, clock, fresh, leader_since) == []
    fresh.record(ids2["n2"], clock.now(), 1.0, 0)  # n2 reconnects at once; n1 never does
    _flush(sessions, clock, fresh)
    clock.advance(DEADLINE + 0.1)
    assert _sweep(sessions, clock, fresh, leader_since) == ["n2"]  # heard since: judged normally
    clock.advance(10 - DEADLINE - 0.2)
    assert _sweep(sessions, clock, fresh, leader_since) == []
    clock.advance(DEADLINE + 0.2)
    assert _sweep(sessions, clock, fresh, leader_since) == ["n1"]


def test_flushed_receipts_let_another_replica_judge(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    ids = _setup(sessions, clock, 1)
    receiving, leader = HeartbeatBook(), HeartbeatBook()
    receiving.record(ids["n1"], clock.now(), 1.0, 0)
    _flush(sessions, clock, receiving)
    for _ in range(5):  # the node keeps beating on the other replica
        clock.advance(1)
        receiving.record(ids["n1"], clock.now(), 1.0, 1)
        _flush(sessions, clock, receiving)
        assert _sweep(sessions, clock, leader) == []
    clock.advance(2.6)
    assert _sweep(sessions, clock, leader) == ["n1"]


def test_failed_flush_keeps_receipts(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    book = HeartbeatBook()
    book.record(1, 10.0, 1.0, 1)
    taken = book.take_pending()
    book.record(1, 11.0, 1.0, 2)
    book.restore(taken)  # the older receipt must not overwrite the newer
    assert book.pending[1].seq == 2
    book.forget(1)
    book.restore(taken)
    assert book.pending[1].seq == 1


def test_a_receipt_for_a_removed_node_is_dropped(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    ids = _setup(sessions, clock, 2)
    book = HeartbeatBook()
    book.record(ids["n1"], clock.now(), 1.0, 1)
    book.record(ids["n2"], clock.now(), 1.0, 1)
    with transaction(sessions) as s:
        inventory.remove_nodes(s, ["n1"])
    assert _flush(sessions, clock, book) == ["n2"]  # the batch survives the missing row
