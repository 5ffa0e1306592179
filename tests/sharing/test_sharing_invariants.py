"""GPU sharing's invariants over random histories, through the database: the scheduler pass, the MIG
reconciler and an agent that applies layouts (as agent.gpu.mig does: only to GPUs none of its ranks
holds, with new device UUIDs each time), while jobs of every kind come and go and admins change layouts
and sharing modes under them.

After every step: no GPU is held whole by one rank and in any other way by another; no MIG device or
replica is held twice; every MIG device a rank holds exists on its node; a GPU's layout never changed
while a rank held it. The pure scheduler has its own property tests (tests/jobs/test_scheduler_mig.py);
these check what its inputs are made of (jobs.tick) and what happens around it."""

from __future__ import annotations

import itertools
import random
from collections import Counter, defaultdict

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.core.clock import FakeClock
from gpufleet.core.db import transaction
from gpufleet.inventory import categories
from gpufleet.inventory import service as inventory
from gpufleet.inventory.models import Node
from gpufleet.jobs.models import Job, JobRank, JobState, RankState
from gpufleet.protocol.inventory import GpuInfo, NodeInventory
from gpufleet.protocol.mig import MigInstance, MigResult, plan
from gpufleet.protocol.sharing import parse_replica
from gpufleet.sharing import reconcile
from tests.jobs.helpers import report, submit, tick, users
from tests.sharing.helpers import H200, add_node

pytestmark = pytest.mark.one_database  # the subject is above the database; one is enough
NODES = ("p1", "p2")
GPUS = 2
LAYOUTS = (None, "none", "all-1g.18gb", "3g.71gb+4g.71gb")
SHARING = ("exclusive", "time-slicing:2", "mps:3")
PROFILES = (None, "1g.18gb", "3g.71gb", "shared")
STEPS = 120
_created = itertools.count()


def _apply(sessions: sessionmaker[Session], clock: FakeClock, node_id: int, gpus: dict[int, str]) -> MigResult:
    """The agent's side of a MigApply: GPUs a rank of the node holds are refused, the others get the layout
    (new UUIDs each time, as on real GPUs); then its inventory goes to the head, then the answer."""
    with transaction(sessions) as s:
        node = s.get(Node, node_id)
        assert node is not None
        held = _held_indexes(s, node_id)
        errors: dict[int, str] = {}
        reported = []
        for gpu in node.gpus:
            info = GpuInfo(
                index=gpu.index, uuid=gpu.uuid, model=gpu.model, pci_bus_id=gpu.pci_bus_id,
                memory_total_mib=gpu.memory_total_mib, mig_mode=gpu.mig_mode,
                mig=[MigInstance(**m) for m in gpu.mig or []],
            )  # fmt: skip
            if gpu.index in gpus and gpu.index in held:
                errors[gpu.index] = "a job of this node holds the GPU"
            elif gpu.index in gpus:
                placed = plan(gpus[gpu.index], gpu.model, gpu.memory_total_mib)
                info = info.model_copy(
                    update={
                        "mig_mode": "enabled" if placed else "disabled",
                        "mig": [
                            MigInstance(
                                uuid=f"MIG-{node.name}-{gpu.index}-{next(_created)}",
                                profile=p.profile.name,
                                gpu_instance=k + 1,
                                compute_instance=0,
                                start=p.start,
                                slices=p.profile.slices,
                                memory_mib=p.profile.memory_mib,
                            )
                            for k, p in enumerate(placed)
                        ],
                    }
                )
            reported.append(info)
        inventory.apply_inventory(
            s, clock, node, NodeInventory(hostname=node.hostname or node.name, cpus=64, memory_total_mib=1 << 19,
                                          gpu_source="nvml", gpus=reported)
        )  # fmt: skip
    return MigResult(id=1, errors=errors)


def _check(sessions: sessionmaker[Session], changed_under: list[str]) -> None:
    assert not changed_under, changed_under
    with transaction(sessions, readonly=True) as s:
        rows = s.execute(
            select(JobRank.node, JobRank.gpu_indexes, JobRank.gpu_uuids, Job.gpu_profile, Job.id)
            .join(Job, Job.id == JobRank.job_id)
            .where(JobRank.state != RankState.EXITED)
        ).all()
        devices = {(n.name, m["uuid"]) for n in s.scalars(select(Node)) for g in n.gpus for m in g.mig or []}
    holders: dict[tuple[str, int], list[str]] = defaultdict(list)
    held: Counter[tuple[str, str]] = Counter()
    for node, indexes, uuids, profile, job_id in rows:
        for index in indexes:
            holders[(node, index)].append("whole" if profile is None else "part")
        if profile is not None:
            held.update((node, u) for u in uuids)
            for u in uuids:
                if parse_replica(u) is None:
                    assert (node, u) in devices, f"job {job_id} holds MIG device {u}, which {node} no longer has"
    for gpu, kinds in holders.items():
        assert "whole" not in kinds or len(kinds) == 1, f"GPU {gpu} held whole and otherwise: {kinds}"
    assert all(n == 1 for n in held.values()), [k for k, n in held.items() if n > 1]


@pytest.mark.parametrize("seed", range(5))
def test_no_gpu_is_given_two_ways_and_no_layout_changes_under_a_job(
    sessions: sessionmaker[Session], clock: FakeClock, seed: int
) -> None:
    rng = random.Random(seed)
    for name in NODES:
        add_node(sessions, clock, name, [(H200, None)] * GPUS)
    users(sessions, clock, "alice")
    ids = dict(zip(NODES, _node_ids(sessions), strict=True))
    changed_under: list[str] = []
    seen: Counter[str] = Counter()  # what the history exercised: it must not pass by doing nothing
    for _ in range(STEPS):
        action = rng.random()
        name = rng.choice(NODES)
        if action < 0.4:
            profile = rng.choice(PROFILES)
            spec = {"gpu_profile": profile} if profile else {}
            submit(sessions, clock, gpus_per_node=1, argv=["sleep", "60"], **spec)
        elif action < 0.65:
            with transaction(sessions, readonly=True) as s:
                running = [j for (j,) in s.execute(select(Job.id).where(Job.state == JobState.RUNNING))]
            if running:
                report(sessions, clock, rng.choice(running))
        elif action < 0.8:
            _set(sessions, name, "mig_layout", rng.choice(LAYOUTS))
        elif action < 0.9:
            _set(sessions, name, "gpu_sharing", rng.choice(SHARING))
        clock.advance(rng.choice((1, 15, 70)))
        seen["placed"] += len(tick(sessions, clock).placed)
        with transaction(sessions) as s:
            sent = reconcile.outgoing(s, clock, list(ids.values()))
        seen["layouts sent"] += len(sent)
        for node_id, command in sent:
            before = _layouts(sessions, node_id)
            result = _apply(sessions, clock, node_id, dict(command.gpus))
            after = _layouts(sessions, node_id)
            with transaction(sessions, readonly=True) as s:
                busy = _held_indexes(s, node_id)
            changed_under += [f"node {node_id} GPU {i}" for i in busy if before.get(i) != after.get(i)]
            seen["refused"] += len(result.errors)
            with transaction(sessions) as s:
                reconcile.record_result(s, clock, node_id, result)
        _check(sessions, changed_under)
    with transaction(sessions, readonly=True) as s:
        seen.update(f"ran {p}" for (p,) in s.execute(select(Job.gpu_profile).where(Job.started_at.is_not(None))))
    assert seen["placed"], seen
    assert seen["layouts sent"], seen


def _node_ids(sessions: sessionmaker[Session]) -> list[int]:
    with transaction(sessions, readonly=True) as s:
        return [s.scalars(select(Node.id).where(Node.name == name)).one() for name in NODES]


def _set(sessions: sessionmaker[Session], name: str, key: str, value: str | None) -> None:
    with transaction(sessions) as s:
        node = s.scalars(select(Node).where(Node.name == name)).one()
        if value is None:
            categories.update_node_settings(s, node, unset=[key])
        else:
            categories.update_node_settings(s, node, set_={key: value})
        node.mig_sent_at = None  # as a declaration through sharing.service does


def _layouts(sessions: sessionmaker[Session], node_id: int) -> dict[int, tuple[str | None, tuple[str, ...]]]:
    with transaction(sessions, readonly=True) as s:
        node = s.get(Node, node_id)
        assert node is not None
        return {g.index: (g.mig_mode, tuple(m["uuid"] for m in g.mig or [])) for g in node.gpus}


def _held_indexes(s: Session, node_id: int) -> set[int]:
    """The GPUs ranks of the node hold (what the agent's own job supervisor knows)."""
    rows = s.execute(select(JobRank.gpu_indexes).where(JobRank.node_id == node_id, JobRank.state != RankState.EXITED))
    return {i for (indexes,) in rows for i in indexes}
