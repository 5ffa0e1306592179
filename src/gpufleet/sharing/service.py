"""MIG layouts as an admin sees them: each GPU's declared and actual layout, and declaring a new one.

Declaring (`declare`) checks the layout against every GPU of the nodes it is for (the model must offer its
profiles, and they must fit together) before storing the `mig_layout` setting on the category or node;
a bad layout changes nothing. By default it is applied to each GPU once that GPU is idle (new jobs stay off
it meanwhile: sharing.reconcile). With `now`, a change that would have to wait for a running job is
refused instead, naming the jobs, and nothing is stored: for an admin who wants it done at once or not at all.

Takes a session and a clock; never commits (the caller's transaction does).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpufleet.core.clock import Clock
from gpufleet.core.errors import Conflict, InvalidInput, NotFound
from gpufleet.inventory import categories
from gpufleet.inventory.mig_layouts import GpuLayout, gpu_layout, layouts
from gpufleet.inventory.models import Gpu, Node
from gpufleet.jobs.models import JobRank, RankState
from gpufleet.protocol.mig import LayoutError, plan


@dataclass(frozen=True, slots=True)
class NodeMig:
    """One node's GPUs against its layout, and what its agent could not apply."""

    node: str
    category: str | None
    gpus: list[GpuLayout]
    errors: dict[str, str]  # GPU index -> why the agent could not apply the layout
    asked: bool  # a change was sent and not yet answered, or refused and will be asked again

    @property
    def in_sync(self) -> bool:
        return all(g.in_sync for g in self.gpus)


def status(session: Session, node: str | None = None, category: str | None = None) -> list[NodeMig]:
    """Every node's MIG state (or one node's, or a category's), by name. NotFound for an unknown node."""
    query = select(Node).order_by(Node.name)
    if node is not None:
        query = query.where(Node.name == node)
    if category is not None:
        query = query.where(Node.category == category)
    nodes = list(session.scalars(query))
    if node is not None and not nodes:
        raise NotFound(f"no such node: {node}")
    found = layouts(session, [n.id for n in nodes]) if nodes else {}
    return [
        NodeMig(n.name, n.category, found.get(n.id, []), dict(n.mig_errors or {}), n.mig_sent_at is not None)
        for n in nodes
    ]


def declare(
    session: Session, clock: Clock, layout: str | None, *, node: str | None, category: str | None, now: bool
) -> list[NodeMig]:
    """Declare `layout` (None: unset, leaving the GPUs as they are) for a node or a category; returns the
    nodes' state after. Raises InvalidInput (a layout the GPUs cannot take), NotFound, Conflict (`now`
    while jobs hold GPUs that would change)."""
    if (node is None) == (category is None):
        raise InvalidInput("name a node or a category, not both")
    targets = _targets(session, node, category)
    # A category's layout reaches only the nodes that declare none of their own.
    reached = targets if node is not None else [t for t in targets if "mig_layout" not in (t.settings or {})]
    if layout is not None:
        layout = categories.validate({"mig_layout": layout})["mig_layout"]
        _check_models(session, layout, [t.id for t in reached])
    if now and layout is not None:
        _refuse_busy(session, layout, reached)
    set_ = {"mig_layout": layout} if layout is not None else {}
    unset = [] if layout is not None else ["mig_layout"]
    if node is not None:
        categories.update_node_settings(session, targets[0], set_=set_, unset=unset)
    else:
        categories.update_category(session, clock, str(category), set_=set_, unset=unset)
    for target in reached:  # a new declaration is sent at once, not after the last one's retry delay
        target.mig_sent_at = None
        target.mig_errors = {}
    session.flush()
    return status(session, node=node, category=category)


def _targets(session: Session, node: str | None, category: str | None) -> list[Node]:
    if node is not None:
        row = session.scalar(select(Node).where(Node.name == node))
        if row is None:
            raise NotFound(f"no such node: {node}")
        return [row]
    categories.get_category(session, str(category))  # NotFound for an unknown category
    return list(session.scalars(select(Node).where(Node.category == category).order_by(Node.name)))


def _check_models(session: Session, layout: str, node_ids: list[int]) -> None:
    """Refuse a layout that some GPU of these nodes cannot take (its model, its profiles' placements)."""
    if not node_ids:
        return
    models = session.execute(select(Gpu.model, Gpu.memory_total_mib).where(Gpu.node_id.in_(node_ids)).distinct()).all()
    for model, memory in models:
        try:
            plan(layout, model, memory)
        except LayoutError as exc:
            raise InvalidInput(f"MIG layout {layout!r} cannot apply: {exc}") from None


def _refuse_busy(session: Session, layout: str, targets: list[Node]) -> None:
    """Conflict naming the jobs on GPUs that `layout` would change."""
    busy: dict[tuple[int, int], set[int]] = defaultdict(set)  # (node id, GPU index) -> job ids
    rows = session.execute(
        select(JobRank.node_id, JobRank.gpu_indexes, JobRank.job_id).where(
            JobRank.node_id.in_([t.id for t in targets]), JobRank.state != RankState.EXITED
        )
    )
    for node_id, indexes, job_id in rows:
        if node_id is None:
            continue
        for index in indexes:
            busy[(node_id, index)].add(job_id)
    held: list[str] = []
    jobs: set[int] = set()
    for target in targets:
        for gpu in target.gpus:
            state = gpu_layout(gpu.index, gpu.model, gpu.memory_total_mib, gpu.mig_mode, gpu.mig or [], layout)
            if not state.in_sync and busy.get((target.id, gpu.index)):
                held.append(f"{target.name} GPU {gpu.index}")
                jobs |= busy[(target.id, gpu.index)]
    if held:
        shown = ", ".join(held[:8]) + (f" and {len(held) - 8} more" if len(held) > 8 else "")
        raise Conflict(
            f"MIG layout {layout} not declared: running jobs hold GPUs it would change ({shown}; jobs "
            f"{', '.join(map(str, sorted(jobs)[:20]))}). Declare it without 'now' to apply each GPU once its jobs end "
            "(no new job lands on them meanwhile), or wait for the jobs."
        )
