"""Slurm fixtures: a real single-node Slurm (scripts/services/slurm.sh) for the tests marked `slurm`, and a
SQLite database for the unit tests here (no PostgreSQL needed to test parsing and the drain rule).

The real Slurm is started once per test run under a file lock (xdist workers share it) and, like
PostgreSQL, stopped after the run's last test process using it is done (munged, slurmctld, slurmd, and
slurmdbd with MariaDB), unless it was running before the tests started it (tests.services.SharedService).
Where Slurm cannot be installed or started the tests skip with the reason, unless
GPUFLEET_REQUIRE_SERVICES=1 (CI), which makes that a failure.
"""

from __future__ import annotations

import os
import shlex
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from filelock import FileLock

from gpufleet.jobs.slurm.commands import SlurmCommands
from tests.conftest import ROOT, need
from tests.services import SharedService

SLURM_LOCK = Path("/tmp") / "gpufleet-test-slurm.lock"


@dataclass(frozen=True)
class SlurmCluster:
    """The running test Slurm: its environment (SLURM_CONF, SLURM_NODE, SLURM_GPUS, SLURM_JOBOUT, SLURM_JOB_MAP_DIR)."""

    env: dict[str, str]

    @property
    def conf(self) -> str:
        return self.env["SLURM_CONF"]

    @property
    def node(self) -> str:
        return self.env["SLURM_NODE"]

    @property
    def gpus(self) -> int:
        return int(self.env["SLURM_GPUS"])

    @property
    def jobout(self) -> Path:
        return Path(self.env["SLURM_JOBOUT"])

    @property
    def job_map_dir(self) -> Path:
        """Where gpufleet's prolog, run by this Slurm, maps its jobs to GPUs (`slurm_job_map_dir`)."""
        return Path(self.env["SLURM_JOB_MAP_DIR"])


def _read_env(path: Path) -> dict[str, str]:
    env: dict[str, str] = {}
    for line in path.read_text().splitlines():
        words = shlex.split(line)
        if len(words) == 2 and words[0] == "export" and "=" in words[1]:
            key, value = words[1].split("=", 1)
            env[key] = value
    return env


def start_cluster(what: str, lock: Path, env: dict[str, str] | None = None) -> Iterator[SlurmCluster]:
    """For a session fixture (`yield from`): `slurm.sh start` under `lock` (xdist workers share one
    instance), with `env` added (another state directory, ports, GPUFLEET_SLURM_DBD), and `slurm.sh stop`
    after the last test process using it, if a test process started it. Skips the test with the reason
    when Slurm cannot start here."""
    if os.geteuid() != 0:
        need(what, "the test Slurm runs its daemons as root (SlurmUser=root); run the tests as root")
    env = env or {}
    state = Path(env.get("GPUFLEET_SLURM_STATE", "/tmp/gpufleet-test-slurm")).name
    slurm = SharedService(state, ROOT / "scripts" / "services" / "slurm.sh", lock, env)
    result = slurm.start()
    if result.returncode != 0:
        lines = (result.stderr or result.stdout).strip().splitlines()
        need(what, lines[-1] if lines else f"slurm.sh start exited {result.returncode}")
    try:
        yield SlurmCluster(_read_env(Path(result.stdout.strip().splitlines()[-1])))
    finally:
        slurm.release()


def sinfo_node(commands: SlurmCommands, node: str, fields: str = "%T") -> str:
    """sinfo's `fields` for one node ("idle", "drained|gpufleet: ecc"...), read from the whole-cluster answer.

    Never `sinfo -n NODE`: that asks slurmctld for one node (REQUEST_NODE_INFO_SINGLE), which skips
    refreshing each node's allocated CPUs, so after a job ends it can say "mixed" for as long as nobody asks
    for every node. In CI that was minutes, and the tests waiting for "idle" timed out."""
    for line in commands.run(["sinfo", "-h", "-N", "-o", f"%N|{fields}"]).splitlines():
        name, _, rest = line.strip().partition("|")
        if name == node:
            return rest  # one line per partition the node is in; the node is in one here
    return ""


def wait_until(
    what: str, check: Callable[[], bool], timeout_s: float = 30.0, describe: Callable[[], str] | None = None
) -> None:
    """Poll `check` every 0.1 s; fail the test naming `what` (and what `describe` says) after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            detail = f" ({describe()})" if describe is not None else ""
            pytest.fail(f"timed out after {timeout_s:g} s waiting for {what}{detail}")
        time.sleep(0.1)


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """A real slurmctld + slurmd + munge on this machine, with a fake 4-GPU GRES."""
    yield from start_cluster("Slurm", SLURM_LOCK)


def quiet_node(commands: SlurmCommands, node: str) -> None:
    """Leave the test Slurm as every test holding `slurm_node` starts: no job of anybody's in the queue (a
    cancelled job holds the node's CPUs while it completes), the node undrained and idle.

    Every user's jobs: a job another test submitted as root, still completing, left a test's own job pending
    past its wait."""
    queued = commands.run(["squeue", "-h", "-o", "%A"]).split()
    if queued:
        commands.run(["scancel", "--full", *queued])
    wait_until("Slurm to empty its queue", lambda: not _queue(commands), 60, describe=lambda: _queue(commands))
    if sinfo_node(commands, node).rstrip("*").startswith(("drain", "down")):
        commands.run(["scontrol", "update", f"nodename={node}", "state=resume"])
    seen: list[str] = []  # every state it passed through, for the failure message

    def idle() -> bool:
        state = sinfo_node(commands, node)
        if not seen or seen[-1] != state:
            seen.append(state)
        return state == "idle"

    def says() -> str:
        return f"states seen: {' -> '.join(seen)}; {slurm_says(commands, node)}"

    wait_until("the node to be idle", idle, describe=says)


def _queue(commands: SlurmCommands) -> str:
    return commands.run(["squeue", "-h", "-o", "%i %u %T %r"]).strip().replace("\n", " | ")


def slurm_says(commands: SlurmCommands, node: str) -> str:
    """The queue (each job's state and reason) and the node, for a failure message."""
    queue = commands.run(["squeue", "-h", "--states=all", "-o", "%i %u %T %r %N"]).strip().replace("\n", " | ")
    return f"squeue: {queue}; node: {commands.run(['scontrol', '-o', 'show', 'node', node]).strip()}"


@pytest.fixture
def slurm_node(heavy: None, slurm_cluster: SlurmCluster) -> Iterator[str]:
    """The test Slurm's one node, held by this test alone (xdist workers take turns), quiet before and after
    (`quiet_node`). It takes the heavy lock first: a debootstrap or a 200-node join storm beside these tests
    left slurmctld too slow to answer within the commands' 30 s, and the storm's heartbeats starved in turn."""
    commands = SlurmCommands(slurm_cluster.conf, timeout_s=30)
    with FileLock(str(Path("/tmp") / "gpufleet-test-slurm-node.lock")):
        quiet_node(commands, slurm_cluster.node)
        yield slurm_cluster.node
        quiet_node(commands, slurm_cluster.node)


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    """The tests here need a node row, not both databases: SQLite only."""
    return f"sqlite:///{tmp_path / 'gpufleet.db'}"
