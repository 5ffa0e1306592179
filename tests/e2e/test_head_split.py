"""A head split by role (`agent_listen`): a channel process serves the agents and sweeps, API processes
serve everything else, over one database. Jobs submitted on the API's address run on nodes whose
channels another process holds, and the channel process's kill -9 costs no node its `up`."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Head, free_port, start_sim, stop, wait_for

pytestmark = pytest.mark.e2e
NODES = 12


def _health(url: str) -> dict[str, Any] | None:
    try:
        answer: dict[str, Any] = httpx.get(url + "/healthz", timeout=5).json()
    except httpx.HTTPError:
        return None
    return answer


def _downs(head: Head) -> list[tuple[str, str]]:
    return [
        (n["name"], t["reason"])
        for n in head.nodes()
        for t in head.api("GET", f"/api/v1/nodes/{n['name']}")["transitions"]
        if t["to_state"] == "down"
    ]


@pytest.mark.parametrize("engine", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
@pytest.mark.usefixtures("heavy")
def test_a_channel_process_serves_the_agents_apart_from_the_api(
    engine: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    env = {"GPUFLEET_LEADER_GRACE_S": "4"}
    database_url = None
    if engine == "postgresql":  # two API processes beside the channel process
        database_url = request.getfixturevalue("postgres_url")
        env["GPUFLEET_WORKERS"] = "2"
    head = Head(tmp_path, database_url=database_url, env=env, agent_port=free_port()).start()
    sim = start_sim(tmp_path, head.agent_url, head.join_token(NODES), NODES)
    try:
        wait_for(lambda: [n["state"] for n in head.nodes()].count("up") == NODES, timeout=60, interval=0.5)
        channel = _health(head.agent_url)
        assert channel is not None
        assert (channel["role"], channel["channels"], channel["leader"]) == ("channels", NODES, True)
        api = [a for a in (_health(head.url) for _ in range(20)) if a is not None]
        assert {a["role"] for a in api} == {"api"}
        assert {a["channels"] for a in api} == {0}  # no agent reaches the API's processes
        assert len({a["pid"] for a in api if a["leader"]}) == 1  # one of them runs the scheduler
        assert channel["pid"] not in {a["pid"] for a in api}

        # A job submitted on the API's address is placed by its leader and launched by the channel process.
        head.api("POST", "/api/v1/users", json={"username": "alice"})
        job = {"argv": ["sleep", "600"], "gpus_per_node": 1, "user": "alice"}
        submitted = [head.api("POST", "/api/v1/jobs", json=job)["id"] for _ in range(3)]
        wait_for(
            lambda: all(j["state"] == "running" for j in head.api("GET", "/api/v1/jobs")), timeout=30, interval=0.5
        )

        # The channel process dies: the supervisor starts another, the agents reconnect to it, and the new
        # sweeper's grace covers them. No node goes down, no job is requeued.
        os.kill(channel["pid"], signal.SIGKILL)
        killed = time.monotonic()
        wait_for(
            lambda: (
                (h := _health(head.agent_url)) is not None and h["pid"] != channel["pid"] and h["channels"] == NODES
            ),
            timeout=30,
            interval=0.2,
        )
        time.sleep(max(0.0, killed + 10 - time.monotonic()))  # past the new sweeper's grace
        assert _downs(head) == []
        assert all(n["state"] == "up" for n in head.nodes())
        jobs = {j["id"]: j["state"] for j in head.api("GET", "/api/v1/jobs")}
        assert jobs == dict.fromkeys(submitted, "running")

        # A node that really stops is still found dead by the new channel process.
        stop(sim, signal.SIGKILL)
        wait_for(lambda: all(n["state"] == "down" for n in head.nodes()), timeout=20, interval=0.5)
    finally:
        stop(sim)
        head.kill(signal.SIGTERM)
