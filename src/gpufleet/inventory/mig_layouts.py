"""Declared MIG layouts against what the GPUs report: which GPUs must change, and what they offer.

`gpu_layout` compares one GPU's model, memory, MIG mode and instances as stored with its node's resolved
`mig_layout` setting (inventory.categories); `layouts` and `to_change` do it for the nodes in the
database. Shared by the scheduler pass (a GPU that must change takes no new job: jobs.tick), the
reconciler (it sends the change once the GPU is idle: sharing.reconcile) and the status view.

A GPU is *in sync* when its layout is unset (left as found), when it matches (`none`: MIG off; else MIG
on with exactly the layout's profiles, in any placement), or when the layout cannot apply to it (the model
has no MIG or lacks a profile): such a GPU is left as it is and its problem is shown, since draining it
for a change that can never happen would only idle it.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import String, cast, select
from sqlalchemy.orm import Session

from gpufleet.inventory import categories
from gpufleet.inventory.models import Gpu, Node
from gpufleet.protocol.mig import NO_MIG, LayoutError, layout_profiles, profile_fraction
from gpufleet.protocol.sharing import MAX_REPLICAS, SHARED_PROFILE


@dataclass(frozen=True, slots=True)
class GpuLayout:
    """One GPU: what it is, what it should be, and whether it must change."""

    index: int
    declared: str | None  # the node's mig_layout; None: unset
    actual: str  # "whole", "MIG on, no instances", or the instances as "7x1g.18gb"
    in_sync: bool
    problem: str | None = None  # why the declared layout cannot apply to this GPU


def describe_instances(mig_mode: str | None, instances: Sequence[Mapping[str, Any]]) -> str:
    """What the GPU is now, in the layout's own words where it can be."""
    if mig_mode != "enabled":
        return "whole"
    if not instances:
        return "MIG on, no instances"
    counts = Counter(str(i.get("profile") or "?") for i in instances)
    return "+".join(f"{n}x{p}" if n > 1 else p for p, n in sorted(counts.items()))


def gpu_layout(
    index: int,
    model: str,
    memory_mib: int,
    mig_mode: str | None,
    instances: Sequence[Mapping[str, Any]],
    declared: str | None,
) -> GpuLayout:
    """Compare one GPU with its node's declared layout."""
    actual = describe_instances(mig_mode, instances)
    if declared is None:
        return GpuLayout(index, None, actual, True)
    if declared == NO_MIG:
        return GpuLayout(index, declared, actual, mig_mode != "enabled")
    wanted, problem = _wanted(declared, model, memory_mib)
    if problem is not None:
        return GpuLayout(index, declared, actual, True, problem)
    have = Counter(str(i.get("profile") or "") for i in instances)
    return GpuLayout(index, declared, actual, mig_mode == "enabled" and have == wanted)


@functools.lru_cache(maxsize=256)
def _wanted(layout: str, model: str, memory_mib: int) -> tuple[Counter[str], str | None]:
    """The profiles `layout` makes on this model, or why it cannot: computed once per (layout, model), not
    for each of a thousand nodes' GPUs every pass. Callers only compare the Counter, never change it."""
    try:
        return layout_profiles(layout, model, memory_mib), None
    except LayoutError as exc:
        return Counter(), str(exc)


def instance_fraction(profile: str) -> float:
    """What one instance of `profile` counts as in quotas and fair share before it is placed: a MIG
    instance its compute slices / 7; a shared replica the least it can be, 1/MAX_REPLICAS (once placed, a
    replica counts as 1/N of its GPU: protocol.sharing.share_of)."""
    if profile == SHARED_PROFILE:
        return 1.0 / MAX_REPLICAS
    return profile_fraction("", profile)


def layouts(
    session: Session, node_ids: Collection[int] | None = None, *, declared_only: bool = False
) -> dict[int, list[GpuLayout]]:
    """Each node's GPUs against its declared layout, by node id (all nodes when `node_ids` is None);
    `declared_only`: only the nodes that declare one (the scheduler's every pass reads no GPU otherwise)."""
    by_category = categories.category_settings(session)
    if declared_only and not _any_declared(session, by_category):
        return {}
    query = select(Node.id, Node.name, Node.category, Node.settings)
    if node_ids is not None:
        query = query.where(Node.id.in_(list(node_ids)))
    declared: dict[int, str | None] = {}
    for node_id, _name, category, settings in session.execute(query):
        resolved = categories.resolve_values(by_category.get(category or ""), settings)
        declared[node_id] = resolved["mig_layout"].value
    if declared_only:
        declared = {node_id: layout for node_id, layout in declared.items() if layout is not None}
        if not declared:
            return {}
    gpus = select(Gpu.node_id, Gpu.index, Gpu.model, Gpu.memory_total_mib, Gpu.mig_mode, Gpu.mig).order_by(Gpu.index)
    if node_ids is not None:
        gpus = gpus.where(Gpu.node_id.in_(list(node_ids)))
    out: dict[int, list[GpuLayout]] = {node_id: [] for node_id in declared}
    for node_id, index, model, memory, mode, mig in session.execute(gpus):
        if node_id in declared:
            out[node_id].append(gpu_layout(index, model, memory, mode, mig or [], declared[node_id]))
    return out


def _any_declared(session: Session, by_category: Mapping[str, Mapping[str, Any]]) -> bool:
    """Whether a category or a node declares a MIG layout at all: asked by the database, so the scheduler's
    and the reconciler's every round read no node row on the many clusters that use no MIG."""
    if any(settings.get("mig_layout") is not None for settings in by_category.values()):
        return True
    text = cast(Node.settings, String)
    return session.scalar(select(Node.id).where(text.like('%"mig_layout"%')).limit(1)) is not None


def to_change(session: Session, node_ids: Collection[int] | None = None) -> dict[int, set[int]]:
    """The GPUs that must change, by node id: what the scheduler keeps new jobs off."""
    return {
        node_id: {g.index for g in found if not g.in_sync}
        for node_id, found in layouts(session, node_ids, declared_only=True).items()
        if any(not g.in_sync for g in found)
    }
