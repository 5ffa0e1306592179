"""Liveness with real processes: the numbers the issue asks for, end to end."""

import signal
import time
from datetime import datetime
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import Head, start_sim, wait_for

pytestmark = pytest.mark.e2e


def _states(head: Head) -> dict[str, str]:
    return {n["name"]: n["state"] for n in head.nodes()}


@pytest.mark.alone
def test_200_nodes_up_in_30s_and_down_in_5s_after_sigkill(heavy: None, head: Head, tmp_path: Path) -> None:
    sim = start_sim(tmp_path, head.url, head.join_token(200), 200)
    try:
        took = wait_for(lambda: list(_states(head).values()).count("up") == 200, timeout=30, interval=0.5)
        nodes = head.nodes()
        assert all(n["gpu_count"] == 8 and n["gpu_model"] == "NVIDIA H200" for n in nodes)
        print(f"200 nodes up after {took:.1f}s")
    finally:
        sim.send_signal(signal.SIGKILL)
        sim.wait()
    killed_at = time.monotonic()
    took = wait_for(lambda: set(_states(head).values()) == {"down"}, timeout=5, interval=0.1)
    print(f"all 200 down {time.monotonic() - killed_at:.2f}s after SIGKILL ({took:.2f}s polling)")
    # The first node to join (the longest through the storm) was up once and down once.
    history = head.api("GET", "/api/v1/nodes/sim001")["transitions"]
    assert [(t["from_state"], t["to_state"]) for t in history] == [("up", "down"), ("new", "up")]
    # No live node is ever marked down in the storm. Before channels stopped waiting on the database to
    # record a node's job report (sent after every welcome) 18 to 35 of 200 did in CI's full runs: their
    # heartbeats sat unread behind the storm's inventory writes.
    flapped = {}
    for name in _states(head):
        history = [(t["from_state"], t["to_state"]) for t in head.api("GET", f"/api/v1/nodes/{name}")["transitions"]]
        if history != [("up", "down"), ("new", "up")]:
            flapped[name] = history
    print(f"{len(flapped)} node(s) marked down during the storm: {sorted(flapped)}")
    assert not flapped


def test_restarted_head_keeps_nodes_and_the_simulator_reconnects(head: Head, tmp_path: Path) -> None:
    sim = start_sim(tmp_path, head.url, head.join_token(20), 20)
    try:
        wait_for(lambda: list(_states(head).values()).count("up") == 20, timeout=30, interval=0.5)
        before = {n["name"]: n["last_seen"] for n in head.nodes()}
        head.kill(signal.SIGKILL)  # no graceful flush: only acknowledged state may be relied on
        head.start()
        after = {n["name"]: n["last_seen"] for n in head.nodes()}
        # What the head had made durable (and so acknowledged) is all still there: nothing went back.
        assert after.keys() == before.keys()
        assert all(datetime.fromisoformat(after[n]) >= datetime.fromisoformat(before[n]) for n in before)
        time.sleep(14)  # past the new leader's grace: reconnected nodes must not be marked down
        assert set(_states(head).values()) == {"up"}
        for name in ("sim001", "sim020"):
            history = head.api("GET", f"/api/v1/nodes/{name}")["transitions"]
            assert [t["to_state"] for t in history] == ["up"]
    finally:
        sim.send_signal(signal.SIGKILL)
        sim.wait()


def test_join_token_used_up_by_the_simulator_is_reported(head: Head, tmp_path: Path) -> None:
    sim = start_sim(tmp_path, head.url, head.join_token(2), 3)
    try:
        wait_for(lambda: list(_states(head).values()).count("up") == 2, timeout=30, interval=0.5)
        time.sleep(1)
        assert len(head.nodes()) == 2
    finally:
        sim.send_signal(signal.SIGTERM)
        sim.wait(timeout=30)
    assert "join token already used" in (tmp_path / "sim.log").read_text()


@pytest.mark.postgres
def test_two_heads_on_postgres_fail_over_within_10s(postgres_url: str, tmp_path: Path) -> None:
    first = Head(tmp_path, database_url=postgres_url).start()
    second = Head(tmp_path, database_url=postgres_url).start()
    sim = None
    try:
        wait_for(lambda: first.health()["leader"], timeout=10)
        assert not second.health()["leader"]
        sim = start_sim(tmp_path, second.url, second.join_token(10), 10)  # the nodes talk to the standby
        wait_for(lambda: list(_states(second).values()).count("up") == 10, timeout=30, interval=0.5)
        first.kill(signal.SIGKILL)
        killed = time.monotonic()
        took = wait_for(lambda: second.health()["leader"], timeout=10, interval=0.1)
        print(f"standby took over {took:.1f}s after the leader was killed")
        assert time.monotonic() - killed <= 10
        # The new leader judges liveness: the nodes stay up, and die visibly when the simulator does.
        time.sleep(3)
        assert set(_states(second).values()) == {"up"}
        sim.send_signal(signal.SIGKILL)
        sim.wait()
        sim = None
        wait_for(lambda: set(_states(second).values()) == {"down"}, timeout=15, interval=0.2)
    finally:
        if sim is not None:
            sim.send_signal(signal.SIGKILL)
            sim.wait()
        first.kill()
        second.kill(signal.SIGTERM)


def test_healthz_needs_no_token(head: Head) -> None:
    assert httpx.get(head.url + "/healthz").json()["status"] == "ok"
