"""Two head replicas on one database, driven tick by tick with a fake clock."""

import asyncio
import threading
import time
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from gpufleet.core.clock import FakeClock
from gpufleet.core.config import load_settings
from gpufleet.core.db import transaction
from gpufleet.inventory import service as inventory
from gpufleet.inventory.liveness import Change
from gpufleet.inventory.schemas import NodeSettings
from gpufleet.workers.head_loops import HeadLoops, Role

TICK = 0.1


def _replicas(sessions: sessionmaker[Session], clock: FakeClock, tmp_path: Path) -> tuple[HeadLoops, HeadLoops]:
    settings = load_settings(client_file=tmp_path / "none.toml", data_dir=tmp_path, leader_grace_s=10)
    return (
        HeadLoops(settings=settings, sessions=sessions, clock=clock, holder="a"),
        HeadLoops(settings=settings, sessions=sessions, clock=clock, holder="b"),
    )


def test_the_leader_judges_nodes_heard_by_the_other_replica(
    sessions: sessionmaker[Session], clock: FakeClock, tmp_path: Path
) -> None:
    a, b = _replicas(sessions, clock, tmp_path)
    with transaction(sessions) as s:
        ids = [n.id for n in inventory.add_nodes(s, clock, ["n[1-50]"], NodeSettings())]
    assert a.lead_once()
    assert not b.lead_once()
    clock.advance(10)  # past the leader's grace
    down: dict[int, float] = {}
    silent_from = 5.0  # node 1 stops at t=5 s (measured from here)
    start = clock.now()
    for tick in range(int(12 / TICK)):
        t = tick * TICK
        if tick % 10 == 0:  # every node heartbeats to replica b once a second
            for node_id in ids:
                if node_id != ids[0] or t < silent_from:
                    b.book.record(node_id, clock.now(), 1.0, tick)
        if tick % 3 == 0:
            b.flush_once()
        if tick % 20 == 0:
            a.lead_once()
            b.lead_once()
        for change in a.sweep_once() + b.sweep_once():
            down[change.node_id] = clock.now() - start
        clock.advance(TICK)
    assert list(down) == [ids[0]]  # no false down among the other 49
    last_beat = 4.0  # the last beat before t=5 s
    assert 2.5 < down[ids[0]] - last_beat <= 2.5 + 0.3 + TICK  # deadline + flush lag + one tick


def test_a_leader_that_cannot_renew_stops_sweeping(
    sessions: sessionmaker[Session], clock: FakeClock, tmp_path: Path
) -> None:
    a, _ = _replicas(sessions, clock, tmp_path)
    with transaction(sessions) as s:
        node = inventory.add_nodes(s, clock, ["n1"], NodeSettings())[0]
    assert a.lead_once()
    a.book.record(node.id, clock.now(), 1.0, 1)
    a.flush_once()
    clock.advance(a.settings.lease_ttl_s + 20)  # no renewal meanwhile: the lease may belong to another
    assert a.sweep_once() == []
    assert a.lead_once()  # renewed (nobody else took it): judging resumes
    assert [c.name for c in a.sweep_once()] == ["n1"]


def test_a_split_head_sweeps_in_its_channel_process_and_leads_in_an_api_process(
    sessions: sessionmaker[Session], clock: FakeClock, tmp_path: Path
) -> None:
    settings = load_settings(client_file=tmp_path / "none.toml", data_dir=tmp_path, leader_grace_s=0)
    channels = HeadLoops(settings=settings, sessions=sessions, clock=clock, holder="c", role=Role.CHANNELS)
    api = HeadLoops(settings=settings, sessions=sessions, clock=clock, holder="a", role=Role.API)
    with transaction(sessions) as s:
        node = inventory.add_nodes(s, clock, ["n1"], NodeSettings())[0]
    # Each holds its own role's lease: neither stands in the other's way.
    assert channels.lead_once()
    assert api.lead_once()
    assert (channels.leads, api.leads) == (False, True)  # only the API process runs the singleton loops
    channels.book.record(node.id, clock.now(), 1.0, 1)
    channels.flush_once()
    clock.advance(10)  # n1 falls silent
    channels.lead_once()
    api.lead_once()
    assert api.sweep_once() == []  # an API process never judges liveness...
    assert [c.name for c in channels.sweep_once()] == ["n1"]  # ...the channel process does
    # A second channel process waits for the first's lease; the API's lease is not its to take.
    other = HeadLoops(settings=settings, sessions=sessions, clock=clock, holder="c2", role=Role.CHANNELS)
    assert not other.lead_once()
    channels.resign()
    assert other.lead_once()
    assert not HeadLoops(settings=settings, sessions=sessions, clock=clock, holder="a2", role=Role.API).lead_once()


def _leads_within(loops: HeadLoops, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while loops.leader_since is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return loops.leader_since is not None


def test_the_lease_is_renewed_while_a_flush_is_stuck(
    sessions: sessionmaker[Session], clock: FakeClock, tmp_path: Path
) -> None:
    """A flush or sweep that takes long (a slow database, a thousand nodes' receipts) must not hold up
    the lease's renewal: a healthy leader would lose it to another process for nothing."""
    a, _ = _replicas(sessions, clock, tmp_path)
    unblock = threading.Event()

    def stuck_flush() -> list[Change]:
        unblock.wait(30)
        return []

    a.flush_once = stuck_flush  # type: ignore[method-assign]

    async def scenario() -> bool:
        stop = asyncio.Event()
        loops = asyncio.create_task(a.run(stop))
        led = await asyncio.to_thread(_leads_within, a, 20.0)
        unblock.set()
        stop.set()
        await loops
        return led

    assert asyncio.run(scenario()), "the lease waited for the stuck flush"
