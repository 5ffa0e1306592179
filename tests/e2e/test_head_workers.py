"""Several head processes on PostgreSQL (`gpufleet server --workers 2`): the fleet's channels spread over
them, one leader, and the leader's kill -9 costs no node its `up`, no job its run, no acknowledged write."""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import alive
from tests.e2e.conftest import Head, lease_holder, start_sim, stop, wait_for

pytestmark = pytest.mark.e2e
NODES = 20


def _health(head: Head) -> dict[str, object] | None:
    try:
        answer: dict[str, object] = httpx.get(head.url + "/healthz", timeout=5).json()
    except httpx.HTTPError:
        return None
    return answer


@pytest.mark.postgres
@pytest.mark.usefixtures("heavy")
def test_two_head_processes_survive_the_leaders_kill(postgres_url: str, tmp_path: Path) -> None:
    head = Head(tmp_path, database_url=postgres_url, env={"GPUFLEET_WORKERS": "2"}).start()
    sim = start_sim(tmp_path, head.url, head.join_token(NODES), NODES)
    try:
        wait_for(lambda: [n["state"] for n in head.nodes()].count("up") == NODES, timeout=60, interval=0.5)
        answers = [a for a in (_health(head) for _ in range(30)) if a is not None]
        channels = {a["pid"]: a["channels"] for a in answers}
        assert len(channels) == 2, channels  # two processes answer on the one address...
        assert sum(channels.values()) == NODES  # ...and hold every node's channel between them
        assert len({a["pid"] for a in answers if a["leader"]}) == 1  # exactly one leads

        # Acknowledged writes: a user, and jobs the simulated nodes run.
        head.api("POST", "/api/v1/users", json={"username": "alice"})
        job = {"argv": ["sleep", "600"], "gpus_per_node": 1, "user": "alice"}
        submitted = [head.api("POST", "/api/v1/jobs", json=job)["id"] for _ in range(10)]
        wait_for(
            lambda: all(j["state"] == "running" for j in head.api("GET", "/api/v1/jobs")),
            timeout=30,
            interval=0.5,
        )
        held = lease_holder(postgres_url)
        assert held is not None
        leader = held[0]
        assert leader in channels

        os.kill(leader, signal.SIGKILL)
        killed = time.monotonic()
        took = wait_for(
            lambda: (h := lease_holder(postgres_url)) is not None and h[0] != leader and h[1],
            timeout=10,
            interval=0.2,
        )
        print(f"a new leader {took:.1f}s after the kill -9")
        # The surviving process answers meanwhile, and the supervisor starts a process in the dead one's place.
        wait_for(lambda: len({a["pid"] for a in (_health(head) for _ in range(20)) if a}) == 2, timeout=30)
        time.sleep(max(0.0, killed + 15 - time.monotonic()))  # past the new leader's grace for the moved nodes

        downs = [
            (n["name"], t["reason"])
            for n in head.nodes()
            for t in head.api("GET", f"/api/v1/nodes/{n['name']}")["transitions"]
            if t["to_state"] == "down"
        ]
        assert downs == []  # the dead process's agents reconnected to the other before their deadline
        assert all(n["state"] == "up" for n in head.nodes())
        jobs = {j["id"]: j for j in head.api("GET", "/api/v1/jobs")}
        assert sorted(jobs) == sorted(submitted)  # every acknowledged submission is there
        assert all(j["state"] == "running" for j in jobs.values())  # and none was requeued or lost its run

        # The supervisor killed in turn: its processes end with it, and free the address.
        processes = {int(str(a["pid"])) for a in (_health(head) for _ in range(20)) if a}
        assert head.proc is not None
        head.proc.kill()
        head.proc.wait(10)
        wait_for(lambda: not any(alive(pid) for pid in processes), timeout=20, interval=0.2)
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", head.port))  # a restarted head could listen again
    finally:
        stop(sim)
        head.kill(signal.SIGTERM)


def test_several_head_processes_need_postgresql(tmp_path: Path) -> None:
    head = Head(tmp_path, env={"GPUFLEET_WORKERS": "2"}).start(wait=False)
    assert head.proc is not None
    assert head.proc.wait(timeout=30) != 0
    assert "needs PostgreSQL" in head.log()
