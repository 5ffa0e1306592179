"""The invariant that matters most, over random histories against the database: no GPU ever runs two
jobs' processes at once, whatever mix of submits, scheduler passes, agents' reports, cancels, node
failures, partitions and agent restarts happens.

The agents are modelled: a node's agent starts a rank when a `job_start` reaches it and holds it (its
processes run) until it reports the rank's end or restarts. The property is about what the agents
hold, not about what the database says, so a bug that frees GPUs in the database while processes
still run on them is caught. (The pure scheduler's own property tests are in test_scheduler.py.)"""

from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import delete, select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.core.clock import FakeClock
from gpufleet.core.db import make_engine, make_session_factory, transaction
from gpufleet.inventory.models import Node
from gpufleet.inventory.states import NodeState
from gpufleet.jobs import dispatch, lifecycle
from gpufleet.jobs.models import Job, JobOutputChunk, JobRank, JobState
from gpufleet.migrations import upgrade
from gpufleet.protocol.jobs import JobStart, JobUpdate
from tests.jobs.helpers import TICK, cluster, submit, tick, users

NODES = 3
GPUS = 4
Key = tuple[int, int, int]

SUBMIT = st.tuples(st.just("submit"), st.integers(1, 2), st.integers(1, GPUS), st.booleans())
TICK_ = st.tuples(st.just("tick"))  # a scheduler pass, then the starts and cancels reach the agents
# Submits, passes and cancels are listed twice: histories where GPUs change hands are the ones that matter.
action = st.one_of(
    SUBMIT,
    SUBMIT,
    TICK_,
    TICK_,
    st.tuples(st.just("cancel"), st.integers(0, 50)),
    st.tuples(st.just("exit"), st.integers(0, 50), st.sampled_from(["completed", "failed", "timeout"])),
    st.tuples(st.just("cancel"), st.integers(0, 50)),
    st.tuples(st.just("down"), st.integers(1, NODES)),  # a partition: the agent and its processes go on
    st.tuples(st.just("up"), st.integers(1, NODES)),
    st.tuples(st.just("restart"), st.integers(1, NODES)),  # the agent restarts: its processes are gone
)


class Agents:
    """What runs on each node: rank key -> its GPU indexes; and ranks told to stop (they end on `exit`)."""

    def __init__(self) -> None:
        self.running: dict[int, dict[Key, list[int]]] = {i: {} for i in range(1, NODES + 1)}

    def doubled(self) -> list[tuple[int, int]]:
        used = Counter((node, gpu) for node, ranks in self.running.items() for gpus in ranks.values() for gpu in gpus)
        return [key for key, count in used.items() if count > 1]


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> sessionmaker[Session]:
    engine = make_engine(f"sqlite:///{Path(tmp_path_factory.mktemp('inv')) / 'gpufleet.db'}")
    upgrade(engine)
    sessions = make_session_factory(engine)
    clock = FakeClock()
    cluster(sessions, clock, nodes=NODES, gpus=GPUS)
    users(sessions, clock, "alice")
    return sessions


def _reset(sessions: sessionmaker[Session]) -> dict[int, int]:
    """Empty the job tables, every node up; returns node number -> node id."""
    with transaction(sessions) as s:
        s.execute(delete(JobOutputChunk))
        s.execute(delete(JobRank))
        s.execute(delete(Job))
        ids = {}
        for node in s.scalars(select(Node)):
            node.state = NodeState.UP
            ids[int(node.name[1:])] = node.id
        return ids


def _report(sessions: sessionmaker[Session], clock: FakeClock, node_id: int, update: JobUpdate) -> None:
    with transaction(sessions) as s:
        lifecycle.rank_update(s, clock, node_id, update, TICK.max_requeues)


def _step(
    sessions: sessionmaker[Session], clock: FakeClock, agents: Agents, ids: dict[int, int], act: tuple[object, ...]
) -> None:
    kind = act[0]
    clock.advance(1)
    number = {node_id: n for n, node_id in ids.items()}
    if kind == "submit":
        submit(sessions, clock, nodes=act[1], gpus_per_node=act[2], requeue=act[3])
    elif kind == "tick":
        tick(sessions, clock)
        with transaction(sessions) as s:
            up = [ids[n] for n in ids if s.get(Node, ids[n]).state is NodeState.UP]  # type: ignore[union-attr]
            sent = dispatch.outgoing(s, clock, up)
        for node_id, message in sent:
            if isinstance(message, JobStart):
                key = (message.job_id, message.run, message.rank)
                agents.running[number[node_id]].setdefault(key, list(message.gpu_indexes))
                running = JobUpdate(job_id=message.job_id, run=message.run, rank=message.rank, state="running")
                _report(sessions, clock, node_id, running)
    elif kind == "exit":
        held = [(n, key) for n, ranks in agents.running.items() for key in ranks]
        if held:
            n, key = held[int(act[1]) % len(held)]  # type: ignore[call-overload]
            del agents.running[n][key]
            update = JobUpdate(job_id=key[0], run=key[1], rank=key[2], state="exited", outcome=act[2])  # type: ignore[arg-type]
            _report(sessions, clock, ids[n], update)
    elif kind == "cancel":
        with transaction(sessions) as s:
            live = list(s.scalars(select(Job.id).where(Job.state.in_([JobState.PENDING, JobState.RUNNING]))))
            if live:
                lifecycle.cancel(s, clock, live[int(act[1]) % len(live)], "test", user=None, admin=True)  # type: ignore[call-overload]
    elif kind in ("down", "up"):
        with transaction(sessions) as s:
            node = s.get(Node, ids[int(act[1])])  # type: ignore[call-overload]
            assert node is not None
            node.state = NodeState.DOWN if kind == "down" else NodeState.UP
    elif kind == "restart":
        n = int(act[1])  # type: ignore[call-overload]
        agents.running[n].clear()
        with transaction(sessions) as s:
            lifecycle.ranks_held(s, clock, ids[n], [], TICK.max_requeues)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(history=st.lists(action, min_size=5, max_size=30))
# Always tried: a cancelled job's GPUs offered again while its processes still run; and a partitioned
# node's job requeued elsewhere, the node back up, and a new job wanting those GPUs.
@example(history=[("submit", 1, 4, False), ("tick",), ("cancel", 0), ("submit", 1, 4, False), ("tick",)])
@example(
    history=[
        ("submit", 1, 4, True),
        ("tick",),
        ("down", 1),
        ("tick",),
        ("up", 1),
        ("submit", 2, 4, False),
        ("submit", 1, 4, False),
        ("tick",),
    ]
)
def test_no_gpu_ever_runs_two_jobs(db: sessionmaker[Session], history: list[tuple[object, ...]]) -> None:
    ids = _reset(db)
    clock = FakeClock()
    agents = Agents()
    for act in history:
        _step(db, clock, agents, ids, act)
        assert agents.doubled() == [], f"after {act}: GPUs running two jobs: {agents.doubled()}"
    with transaction(db, readonly=True) as s:
        for job in s.scalars(select(Job).where(Job.state == JobState.RUNNING)):
            assert len([r for r in job.ranks if r.run == job.run]) == job.nodes  # a gang: all ranks or none
