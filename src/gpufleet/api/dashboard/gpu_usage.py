"""Every GPU of the fleet in one pass: in use, idle, faulty or unavailable, with its latest values.

The Overview counts these and the GPU map draws one cell per GPU. Both read the nodes (with their
GPUs) and the newest metric sample of each node in two queries, whatever the size of the fleet.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from sqlalchemy.orm import Session

from gpufleet.api.context import HeadContext
from gpufleet.inventory import service as inventory
from gpufleet.inventory.service import NodeSummary
from gpufleet.inventory.states import NodeState
from gpufleet.monitoring import fleet

# A GPU busier than this in its latest sample is in use (NVML's utilization is the share of time a
# kernel ran; an idle GPU reads 0, a job between steps rarely reads under a few percent).
IN_USE_UTIL_PCT = 5.0
# A sample older than this many metric intervals no longer says what the GPU is doing.
FRESH_INTERVALS = 3.0
STATUSES = ("in_use", "idle", "faulty", "unavailable")
_GPU_REASON = re.compile(r"^GPU (\d+)\b")


@dataclass(frozen=True)
class GpuCell:
    node: str
    index: int
    status: str  # one of STATUSES
    model: str | None = None
    util: float | None = None
    temp_c: float | None = None
    power_w: float | None = None
    mem_used_pct: float | None = None
    note: str = ""  # why it is faulty or unavailable


@dataclass
class FleetGpus:
    nodes: list[NodeSummary]
    cells: list[GpuCell] = field(default_factory=list)

    @property
    def counts(self) -> dict[str, int]:
        counted = dict.fromkeys(STATUSES, 0)
        for cell in self.cells:
            counted[cell.status] += 1
        return counted


def gpu_reasons(reasons: Iterable[str] | None) -> dict[int, str]:
    """The first of a node's health reasons that names each GPU ("GPU 3: Xid 79 ..." names GPU 3)."""
    named: dict[int, str] = {}
    for reason in reasons or ():
        found = _GPU_REASON.match(reason)
        if found is not None:
            named.setdefault(int(found.group(1)), reason)
    return named


def _status(
    node: NodeSummary, index: int, inventoried: bool, reason: str | None, values: dict[str, float]
) -> tuple[str, str]:
    """(status, why) of one GPU: the node's state first, then what the inventory and the verdict say,
    then what its latest sample says."""
    if node.state is not NodeState.UP:
        return "unavailable", f"node {node.state.value}"
    if not inventoried:
        return "faulty", "missing from the inventory"
    if reason is not None:
        return "faulty", reason
    if not values:
        return "unavailable", "no recent metrics"
    if (values.get("gpu_util") or 0) >= IN_USE_UTIL_PCT:
        return "in_use", ""
    return "idle", ""


def _statuses(node: NodeSummary, latest: dict[str, dict[str, float]]) -> list[tuple[int, str, str]]:
    """(index, status, why) of each GPU the node has or should have."""
    named = gpu_reasons(node.health_reasons) if node.health in ("failed", "degraded") else {}
    indexes = sorted(set(node.gpu_models) | set(range(node.expected_gpus)))
    return [
        (index, *_status(node, index, index in node.gpu_models, named.get(index), latest.get(f"gpu:{index}", {})))
        for index in indexes
    ]


def _cell(node: NodeSummary, index: int, status: str, note: str, values: dict[str, float]) -> GpuCell:
    used, free = values.get("fb_used_mib"), values.get("fb_free_mib")
    return GpuCell(
        node=node.name,
        index=index,
        status=status,
        note=note,
        model=node.gpu_models.get(index),
        util=values.get("gpu_util"),
        temp_c=values.get("gpu_temp_c"),
        power_w=values.get("power_w"),
        mem_used_pct=100 * used / (used + free) if used is not None and free is not None and used + free > 0 else None,
    )


def _read(session: Session, ctx: HeadContext) -> tuple[list[NodeSummary], dict[int, dict[str, dict[str, float]]]]:
    since = ctx.clock.now() - FRESH_INTERVALS * ctx.settings.metrics_interval_s
    return inventory.node_summaries(session), fleet.latest_gpu_values(session, since)


def snapshot(session: Session, ctx: HeadContext) -> FleetGpus:
    """All nodes and a cell for each of their GPUs, as of their newest metric sample."""
    nodes, latest = _read(session, ctx)
    result = FleetGpus(nodes)
    for node in nodes:
        values = latest.get(node.id, {})
        result.cells.extend(
            _cell(node, index, status, note, values.get(f"gpu:{index}", {}))
            for index, status, note in _statuses(node, values)
        )
    return result


def counts(session: Session, ctx: HeadContext) -> tuple[list[NodeSummary], dict[str, int]]:
    """All nodes, and how many GPUs are in each of STATUSES (the overview, which needs no cells)."""
    nodes, latest = _read(session, ctx)
    counted = dict.fromkeys(STATUSES, 0)
    for node in nodes:
        for _index, status, _note in _statuses(node, latest.get(node.id, {})):
            counted[status] += 1
    return nodes, counted
