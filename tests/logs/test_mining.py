"""Mining stored log lines on both backends: learning, new-template events, cursors, categories, bursts."""

from __future__ import annotations

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.core.clock import FakeClock
from gpufleet.core.db import transaction
from gpufleet.inventory import service as inventory
from gpufleet.inventory.schemas import NodeSettings
from gpufleet.jobs.builtin import BuiltinWorkloadManager
from gpufleet.logs import mining, store
from gpufleet.logs.mining import MiningSettings, TemplateMining
from gpufleet.logs.models import LogMiner, LogRecord
from gpufleet.monitoring.health import HealthJudge
from gpufleet.monitoring.models import Alert
from gpufleet.monitoring.tracker import HealthTracker
from gpufleet.workers.monitoring_loops import MonitoringLoops

BOOT = [
    "nvidia-nvswitch3: open (major=510)",
    "IPv6: ADDRCONF(NETDEV_CHANGE): eth0: link becomes ready",
    "wireguard: WireGuard 1.0.0 loaded. See www.wireguard.com for information.",
]
NEW = "nvidia-peermem: module verification failed: signature and/or required key missing - tainting kernel"
LEARNING_S = 3600.0


@pytest.fixture
def nodes(sessions: sessionmaker[Session], clock: FakeClock) -> dict[str, int]:
    with transaction(sessions) as s:
        added = inventory.add_nodes(s, clock, ["a1", "a2"], NodeSettings(category="a100"))
        added += inventory.add_nodes(s, clock, ["h1"], NodeSettings(category="h200"))
        return {n.name: n.id for n in added}


def write(sessions: sessionmaker[Session], node_id: int, ts: float, *lines: str, **event: object) -> None:
    rows = [{"node_id": node_id, "ts": ts, "source": "/dev/kmsg", "line": line} | event for line in lines]
    with transaction(sessions) as s:
        store.write_records(s, rows)


def mine(sessions: sessionmaker[Session], miner: TemplateMining, now: float) -> mining.MiningPass:
    with transaction(sessions, readonly=True) as s:
        rows = miner.read(s)
    result = miner.mine(rows, now)
    with transaction(sessions) as s:
        miner.write(s, result)
    return result


def events(sessions: sessionmaker[Session]) -> list[tuple[str, str | None, int | None]]:
    with transaction(sessions, readonly=True) as s:
        return [(f.record.line, f.record.kind, f.record.code) for f in store.search(s, events_only=True)]


def test_learning_then_a_new_template_becomes_an_event_once(
    sessions: sessionmaker[Session], clock: FakeClock, nodes: dict[str, int]
) -> None:
    miner = TemplateMining(MiningSettings(learning_s=LEARNING_S))
    now = clock.now()
    write(sessions, nodes["a1"], now, *BOOT)
    assert mine(sessions, miner, now).new_templates == 0  # learning: recorded, not announced
    assert events(sessions) == []
    later = now + LEARNING_S + 1
    write(sessions, nodes["a2"], later, BOOT[0].replace("3", "5"), NEW, NEW.replace("tainting", "tainted"))
    result = mine(sessions, miner, later)
    assert result.new_templates == 1
    ((line, kind, code),) = events(sessions)
    assert (line, kind) == (NEW, "log_template")
    with transaction(sessions, readonly=True) as s:
        (template,) = mining.templates(s, category="a100", new_only=True)
        assert (template.template_id, template.count, template.first_node_id) == (code, 2, nodes["a2"])
        assert "<NUM>" not in template.template
        assert "nvidia-" in template.template
        assert len(mining.templates(s, category="a100")) == 4
    assert mine(sessions, miner, later + 5).seen == {}  # the cursor moved past every line


def test_a_classified_line_keeps_its_kind(
    sessions: sessionmaker[Session], clock: FakeClock, nodes: dict[str, int]
) -> None:
    miner = TemplateMining(MiningSettings(learning_s=0))
    xid = "NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    write(sessions, nodes["a1"], clock.now(), xid, kind="xid", code=79, severity="critical")
    assert mine(sessions, miner, clock.now()).new_templates == 1
    assert events(sessions) == [(xid, "xid", 79)]


def test_categories_are_mined_apart(sessions: sessionmaker[Session], clock: FakeClock, nodes: dict[str, int]) -> None:
    miner = TemplateMining(MiningSettings(learning_s=0))
    now = clock.now()
    write(sessions, nodes["a1"], now, NEW)
    write(sessions, nodes["h1"], now + 1, NEW)
    assert mine(sessions, miner, now + 2).new_templates == 2  # new to a100, and new to h200
    with transaction(sessions, readonly=True) as s:
        assert {m.category for m in s.scalars(select(LogMiner))} == {"a100", "h200"}


def test_a_new_leader_carries_on_from_the_stored_state(
    sessions: sessionmaker[Session], clock: FakeClock, nodes: dict[str, int]
) -> None:
    settings = MiningSettings(learning_s=LEARNING_S)
    now = clock.now()
    write(sessions, nodes["a1"], now, *BOOT)
    mine(sessions, TemplateMining(settings), now)
    successor = TemplateMining(settings)  # another replica, after a failover
    later = now + LEARNING_S + 1
    write(sessions, nodes["a1"], later, BOOT[1].replace("eth0", "eth3"), NEW)
    result = successor_pass = mine(sessions, successor, later)
    assert sum(s.count for s in successor_pass.seen.values()) == 2  # only the lines past the cursor
    assert result.new_templates == 1  # the boot line is known from the stored state; NEW is not


def test_a_stale_replica_reloads_before_mining(
    sessions: sessionmaker[Session], clock: FakeClock, nodes: dict[str, int]
) -> None:
    settings = MiningSettings(learning_s=0)
    first, second = TemplateMining(settings), TemplateMining(settings)
    now = clock.now()
    write(sessions, nodes["a1"], now, BOOT[0])
    mine(sessions, first, now)
    write(sessions, nodes["a1"], now + 1, NEW)
    assert mine(sessions, second, now + 1).new_templates == 1  # leadership moved to `second`
    write(sessions, nodes["a1"], now + 2, NEW)
    assert mine(sessions, first, now + 2).new_templates == 0  # back on `first`: it reloaded first
    with transaction(sessions, readonly=True) as s:
        assert len(list(s.scalars(select(LogRecord).where(LogRecord.kind == "log_template")))) == 2


def test_a_burst_fires_an_alert_naming_the_node_and_ends(
    sessions: sessionmaker[Session], clock: FakeClock, nodes: dict[str, int]
) -> None:
    judge = HealthJudge(tracker=HealthTracker(), workload=BuiltinWorkloadManager(clock), resume_after_rounds=3)
    fired: list[Alert] = []
    loops = MonitoringLoops(
        sessions=sessions,
        clock=clock,
        judge=judge,
        is_leader=lambda: True,
        on_alerts=fired.extend,
        mining=TemplateMining(MiningSettings(learning_s=0, window_s=60, burst_factor=10, burst_min=50)),
    )
    clock.advance(60 - clock.now() % 60)
    link = "mlx5_core 0000:3b:00.1: mlx5e_tx_timeout: TX timeout on queue: {q}, SQ: 0x{sq:x}"
    for window in range(12):  # ten windows of history: a line or two a minute
        write(sessions, nodes["a1"], clock.now(), link.format(q=window, sq=window))
        loops.mine_templates_once()
        clock.advance(60)
    assert fired == []
    write(sessions, nodes["a2"], clock.now(), *[link.format(q=i, sq=i) for i in range(3)])
    write(sessions, nodes["h1"], clock.now(), *[link.format(q=i, sq=i) for i in range(400)])  # other category
    write(sessions, nodes["a1"], clock.now(), *[link.format(q=i, sq=i) for i in range(300)])
    loops.mine_templates_once()
    clock.advance(60)
    loops.mine_templates_once()
    assert [(a.rule, a.node_name, a.severity, a.status) for a in fired] == [
        ("LogTemplateBurst", "a1", "warning", "firing")
    ]
    assert "303 times in 60 s" in fired[0].summary
    assert "300 of them on a1" in fired[0].summary
    clock.advance(60)
    loops.mine_templates_once()
    assert [(a.id, a.node_name, a.status) for a in fired] == [
        (fired[0].id, "a1", "firing"),
        (fired[0].id, "a1", "resolved"),
    ]
