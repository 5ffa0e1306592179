"""Issue 28, part 4's must-show with real processes: a running HTTPS head with simulated agents, users and
jobs is backed up while it serves, stopped, restored into a new data directory and started there on the
same address; the same agents reconnect with the credentials and CA pin they kept, with no new join
token, and the users and jobs are there."""

from __future__ import annotations

import signal
import stat
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import GPUFLEET, Head, base_env, run_cli, start_sim, stop, wait_for

pytestmark = pytest.mark.e2e
NODES = 3
PASSWORD = "a long password 7"


def _all_up(head: Head) -> bool:
    nodes = head.nodes()
    return len(nodes) == NODES and all(n["state"] == "up" for n in nodes) and head.health()["channels"] == NODES


def _join_uses(head: Head) -> list[int]:
    return [t["uses"] for t in head.api("GET", "/api/v1/tokens") if t["kind"] == "join"]


def _sim_without_join_token(tmp: Path, server: str) -> subprocess.Popen[bytes]:
    """`gpufleet sim` for the same nodes, from their state directory alone: no join token, so no CA pin
    but the one saved at the first join."""
    log = (tmp / "sim-again.log").open("ab")
    argv = [*GPUFLEET, "sim", "--server", server, "--nodes", str(NODES), "--state-dir", str(tmp / "sim")]
    return subprocess.Popen(argv, env=base_env(tmp), stdout=log, stderr=subprocess.STDOUT)


def test_a_running_head_is_restored_onto_a_new_data_directory_and_its_agents_come_back(tmp_path: Path) -> None:
    old = Head(tmp_path, tls=True).start()
    sim = start_sim(tmp_path, old.url, old.join_token(NODES), NODES, "--gpus-per-node", "2")
    new: Head | None = None
    try:
        wait_for(lambda: _all_up(old), 60)
        old.api("POST", "/api/v1/users", json={"username": "alice", "password": PASSWORD})
        old.api("POST", "/api/v1/projects", json={"name": "vision"})
        old.api("POST", "/api/v1/projects/vision/members", json={"user": "alice"})
        job = old.api("POST", "/api/v1/jobs", json={"user": "alice", "project": "vision", "argv": ["sleep", "1"]})
        wait_for(lambda: old.api("GET", f"/api/v1/jobs/{job['id']}")["state"] == "completed", 60, interval=0.25)
        assert _join_uses(old) == [NODES]  # used up: no agent could join again with it
        names = [n["name"] for n in old.nodes()]

        archive = tmp_path / "head-backup.tar.gz"
        made = run_cli(tmp_path, "server", "backup", "--data-dir", str(tmp_path / "head"), "--out", str(archive))
        assert made.returncode == 0, made.stderr
        assert "data/tls/ca.key" in made.stdout
        assert stat.S_IMODE(archive.stat().st_mode) == 0o600
        assert _all_up(old)  # the backup never stopped the head

        old.kill(signal.SIGTERM)  # the old machine goes away; the agents keep trying its address
        restored = tmp_path / "new"
        done = run_cli(tmp_path, "server", "restore", str(archive), "--data-dir", str(restored / "head"), token=None)
        assert done.returncode == 0, done.stderr
        assert "ready: gpufleet server" in done.stdout
        again = run_cli(tmp_path, "server", "restore", str(archive), "--data-dir", str(restored / "head"), token=None)
        assert again.returncode == 4
        assert "is not empty" in again.stderr

        new = Head(restored, port=old.port, tls=True).start()  # same address: the agents' server URL
        assert new.ca_file.read_bytes() == old.ca_file.read_bytes()
        assert httpx.get(new.url + "/ca.pem", verify=new.verify).text == old.ca_file.read_text()
        wait_for(lambda: _all_up(new), 60)  # the running agents reconnected with their credentials
        assert _join_uses(new) == [NODES]

        assert "alice" in [u["username"] for u in new.api("GET", "/api/v1/users")]
        assert new.api("GET", f"/api/v1/jobs/{job['id']}")["state"] == "completed"
        login = httpx.post(
            new.url + "/api/v1/login", json={"username": "alice", "password": PASSWORD}, verify=new.verify, timeout=30
        )
        assert login.status_code == 201, login.text

        # The agents' state on disk is enough: restarted without a join token, they come back.
        stop(sim)
        wait_for(lambda: new.health()["channels"] == 0, 30)
        sim = _sim_without_join_token(tmp_path, new.url)
        wait_for(lambda: _all_up(new), 60)
        assert _join_uses(new) == [NODES]
        assert [n["name"] for n in new.nodes()] == names
        second = new.api("POST", "/api/v1/jobs", json={"user": "alice", "project": "vision", "argv": ["sleep", "1"]})
        wait_for(lambda: new.api("GET", f"/api/v1/jobs/{second['id']}")["state"] == "completed", 60, interval=0.25)
    finally:
        stop(sim)
        old.kill(signal.SIGTERM)
        if new is not None:
            new.kill(signal.SIGTERM)
    assert "Traceback" not in (tmp_path / "sim.log").read_text()
