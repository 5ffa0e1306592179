"""Against a real Slurm 22.05 (scripts/services/slurm.sh): node states read, gpufleet's drain and resume
seen by sinfo, a drain set by hand in Slurm left alone, and a job given two of the fake GPUs."""

from __future__ import annotations

import re
import time

import pytest
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.core.clock import FakeClock
from gpufleet.core.db import transaction
from gpufleet.inventory import service as inventory
from gpufleet.inventory.schemas import NodeSettings
from gpufleet.jobs.slurm.commands import SlurmCommands
from gpufleet.jobs.slurm.manager import ForeignDrain, SlurmWorkloadManager
from gpufleet.jobs.slurm.nodes import SINFO_TEXT, SlurmNode, parse_sinfo_text
from tests.slurm.conftest import SlurmCluster, sinfo_node, wait_until

pytestmark = pytest.mark.slurm


@pytest.fixture
def commands(slurm_cluster: SlurmCluster) -> SlurmCommands:
    return SlurmCommands(slurm_cluster.conf, timeout_s=30)


@pytest.fixture
def manager(commands: SlurmCommands, clock: FakeClock) -> SlurmWorkloadManager:
    return SlurmWorkloadManager(commands, clock)


def sinfo_state(commands: SlurmCommands, node: str) -> str:
    """sinfo's own long state word for the node: idle, drained, draining, idle*..."""
    return sinfo_node(commands, node)


@pytest.fixture
def free_node(slurm_node: str, sessions: sessionmaker[Session], clock: FakeClock) -> str:
    """The Slurm node, quiet and held by this test alone (`slurm_node`), with a gpufleet node row of the
    same name."""
    with transaction(sessions) as s:
        inventory.add_nodes(s, clock, [slurm_node], NodeSettings())
    return slurm_node


def test_node_states_are_read(slurm_cluster: SlurmCluster, manager: SlurmWorkloadManager, free_node: str) -> None:
    node = manager.node_state(free_node)
    assert manager.json_output is True  # 22.05 has sinfo --json
    assert (node.state, node.flags, node.reason) == ("idle", frozenset(), None)
    assert node.gres == f"gpu:fake:{slurm_cluster.gpus}"
    # The text form, for a Slurm without --json, reads the same node the same way.
    (text,) = [n for n in parse_sinfo_text(manager.commands.run(list(SINFO_TEXT))) if n.name == free_node]
    assert (text.state, text.flags, text.reason, text.gres) == (node.state, node.flags, node.reason, node.gres)


def test_gpufleet_drain_shows_in_sinfo_and_resume_clears_it(
    commands: SlurmCommands, manager: SlurmWorkloadManager, free_node: str, sessions: sessionmaker[Session]
) -> None:
    reason = "gpufleet: xid 79 (fallen off the bus) on GPU 2"
    with transaction(sessions) as s:
        manager.drain(s, inventory.get_node(s, free_node), reason, "gpufleet")
    assert sinfo_state(commands, free_node) == "drained"
    seen: SlurmNode = manager.node_state(free_node)
    assert (seen.flags, seen.reason, seen.own_drain) == (frozenset({"DRAIN"}), reason, True)
    assert sinfo_node(commands, free_node, "%E") == reason
    with transaction(sessions) as s:
        assert inventory.get_node(s, free_node).drain_reason == reason
        manager.resume(s, inventory.get_node(s, free_node), "gpufleet")
    # Right after a resume sinfo may show "idle*" for about a second.
    wait_until("the drain to clear", lambda: sinfo_state(commands, free_node) == "idle", 10)
    assert not manager.node_state(free_node).drain
    with transaction(sessions) as s:
        assert inventory.get_node(s, free_node).drained_at is None


def test_a_drain_made_by_hand_in_slurm_is_not_resumed(
    commands: SlurmCommands, manager: SlurmWorkloadManager, free_node: str, sessions: sessionmaker[Session]
) -> None:
    with transaction(sessions) as s:
        manager.drain(s, inventory.get_node(s, free_node), "gpufleet: ecc", "gpufleet")
    # An admin drains the node again in Slurm itself, with their own reason.
    commands.run(["scontrol", "update", f"nodename={free_node}", "state=drain", "reason=replacing GPU 2, RT#4711"])
    for actor in ("gpufleet", "user:alice"):
        with pytest.raises(ForeignDrain, match=r"RT#4711.*never resumes"), transaction(sessions) as s:
            manager.resume(s, inventory.get_node(s, free_node), actor)
    time.sleep(0.5)
    assert sinfo_state(commands, free_node) == "drained"
    assert manager.node_state(free_node).reason == "replacing GPU 2, RT#4711"


def test_a_job_gets_two_gpus(slurm_cluster: SlurmCluster, commands: SlurmCommands, free_node: str) -> None:
    out = slurm_cluster.jobout / "gpus-%j.out"
    job = commands.run(
        [
            "sbatch",
            "--parsable",
            "--gres=gpu:2",
            "-o",
            str(out),
            "--wrap",
            "echo CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES",
        ]
    ).strip()
    assert re.fullmatch(r"\d+(;\S+)?", job), job
    path = slurm_cluster.jobout / f"gpus-{job.split(';')[0]}.out"
    wait_until("the job's output", lambda: path.exists() and "CUDA_VISIBLE_DEVICES=" in path.read_text())
    visible = re.search(r"CUDA_VISIBLE_DEVICES=(\S*)", path.read_text())
    assert visible is not None
    indexes = visible.group(1).split(",")
    assert len(indexes) == 2
    assert all(i.isdigit() and int(i) < slurm_cluster.gpus for i in indexes)
    assert len(set(indexes)) == 2
