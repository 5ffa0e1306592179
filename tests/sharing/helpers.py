"""Builders for the MIG tests: nodes with GPUs (whole or with MIG instances) reported through the real
inventory path, category layouts, ranks holding GPUs or MIG devices, and the reconciler's round trip."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.core.clock import FakeClock
from gpufleet.core.db import transaction
from gpufleet.inventory import categories
from gpufleet.inventory import service as inventory
from gpufleet.inventory.models import Node
from gpufleet.inventory.schemas import NodeSettings
from gpufleet.inventory.states import NodeState
from gpufleet.jobs import lifecycle
from gpufleet.protocol.inventory import GpuInfo, NodeInventory
from gpufleet.protocol.mig import MigInstance, MigResult
from gpufleet.sharing import reconcile
from tests.jobs.helpers import submit

H200 = ("NVIDIA H200", 143771)
T4 = ("Tesla T4", 15360)
ALL_1G = "all-1g.18gb"
SEVEN_1G = ["1g.18gb"] * 7
H200_MIB = {"1g.18gb": 16384, "3g.71gb": 65536, "4g.71gb": 65536}

# One GPU: its model and memory, and its MIG instances' profiles (None: MIG disabled, a whole GPU).
GpuSpec = tuple[tuple[str, int], list[str] | None]


def mig_instances(node: str, index: int, profiles: Sequence[str]) -> list[dict[str, Any]]:
    """MIG devices as the agent reports them (protocol.mig.MigInstance as dicts)."""
    return [
        {
            "uuid": f"MIG-{node}-{index}-{k}",
            "profile": profile,
            "gpu_instance": k + 1,
            "compute_instance": 0,
            "start": k,
            "slices": int(profile.split("g", 1)[0]),
            "memory_mib": H200_MIB.get(profile, 16384),
        }
        for k, profile in enumerate(profiles)
    ]


def add_node(
    sessions: sessionmaker[Session],
    clock: FakeClock,
    name: str,
    gpus: Sequence[GpuSpec],
    *,
    category: str | None = None,
    layout: str | None = None,
    state: NodeState = NodeState.UP,
) -> int:
    """Node `name` with these GPUs in its inventory, in `state`; `layout`: its own mig_layout setting."""
    with transaction(sessions) as s:
        node = inventory.add_nodes(s, clock, [name], NodeSettings(category=category))[0]
        report_ = NodeInventory(
            hostname=f"{name}.cluster",
            cpus=64,
            memory_total_mib=512 * 1024,
            gpu_source="nvml",
            gpus=[
                GpuInfo(
                    index=i,
                    uuid=f"GPU-{name}-{i}",
                    model=model,
                    pci_bus_id=f"00000000:{i + 1:02x}:00.0",
                    memory_total_mib=memory,
                    mig_mode="disabled" if profiles is None else "enabled",
                    mig=[MigInstance(**m) for m in mig_instances(name, i, profiles or [])],
                )
                for i, ((model, memory), profiles) in enumerate(gpus)
            ],
        )
        inventory.apply_inventory(s, clock, node, report_)
        node.state = state
        node.health = "healthy"
        if layout is not None:
            categories.update_node_settings(s, node, set_={"mig_layout": layout})
        s.flush()
        return node.id


def category(sessions: sessionmaker[Session], clock: FakeClock, name: str, layout: str | None) -> None:
    with transaction(sessions) as s:
        categories.create_category(s, clock, name, settings={"mig_layout": layout} if layout else {})


def hold(sessions: sessionmaker[Session], clock: FakeClock, node: str, gpus: list[int], **spec: Any) -> int:
    """A job whose one rank holds these whole GPUs of `node` (assigned, not yet exited)."""
    job_id = submit(sessions, clock, gpus_per_node=len(gpus), **spec)
    with transaction(sessions) as s:
        row = s.scalars(select(Node).where(Node.name == node)).one()
        job = lifecycle.lock_job(s, job_id)
        lifecycle.place(
            s, clock, job, {node: gpus}, {node: lifecycle.NodeGpus(row.id, {g.index: g.uuid for g in row.gpus})}
        )
    return job_id


def hold_instance(sessions: sessionmaker[Session], clock: FakeClock, node: str, uuid: str) -> int:
    """A job of one 1g.18gb instance whose rank holds the MIG device `uuid` of `node`."""
    job_id = submit(sessions, clock, gpus_per_node=1, gpu_profile="1g.18gb")
    with transaction(sessions) as s:
        row = s.scalars(select(Node).where(Node.name == node)).one()
        parents = {str(m["uuid"]): g.index for g in row.gpus for m in g.mig}
        job = lifecycle.lock_job(s, job_id)
        nodes = {node: lifecycle.NodeGpus(row.id, {g.index: g.uuid for g in row.gpus}, parents)}
        lifecycle.place(s, clock, job, {node: []}, nodes, {node: [uuid]})
    return job_id


def ids(sessions: sessionmaker[Session]) -> dict[str, int]:
    with transaction(sessions, readonly=True) as s:
        return {name: node_id for node_id, name in s.execute(select(Node.id, Node.name))}


def send(sessions: sessionmaker[Session], clock: FakeClock) -> dict[str, dict[int, str]]:
    """One `outgoing` pass over every node: the layouts sent, by node name."""
    by_id = {v: k for k, v in ids(sessions).items()}
    with transaction(sessions) as s:
        found = reconcile.outgoing(s, clock, list(by_id))
    names = [by_id[node_id] for node_id, _ in found]
    assert len(names) == len(set(names)), f"a node was sent two MigApply in one pass: {names}"
    return {by_id[node_id]: dict(message.gpus) for node_id, message in found}


def node_row(sessions: sessionmaker[Session], name: str) -> Node:
    with transaction(sessions, readonly=True) as s:
        row = s.scalars(select(Node).where(Node.name == name)).one()
        s.expunge(row)
        return row


def answer(sessions: sessionmaker[Session], clock: FakeClock, name: str, errors: dict[int, str]) -> None:
    with transaction(sessions) as s:
        reconcile.record_result(s, clock, ids(sessions)[name], MigResult(id=1, errors=errors))
