"""Node lifecycle and inventory. Takes a session and a clock; never commits (the caller's transaction does)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from gpufleet.core import hostlist
from gpufleet.core.clock import Clock, to_datetime
from gpufleet.core.errors import Conflict, InvalidInput, NotFound
from gpufleet.inventory import categories
from gpufleet.inventory.models import Gpu, Node, NodeTransition
from gpufleet.inventory.schemas import NodeDetail, NodeOut, NodeSettings, SettingOut, TransitionOut
from gpufleet.inventory.states import NodeState, allowed
from gpufleet.protocol.inventory import GpuInfo, NodeInventory
from gpufleet.protocol.messages import NODE_NAME_PATTERN

HISTORY_SHOWN = 50


def expand_names(expressions: list[str]) -> list[str]:
    """Hostlist-expand and validate node names. Raises InvalidInput naming the first bad one."""
    names = hostlist.expand(expressions)
    for name in names:
        if not NODE_NAME_PATTERN.fullmatch(name):
            raise InvalidInput(f"invalid node name {name!r}: use letters, digits, '.', '_' and '-' (max 63)")
    return names


def _by_names(session: Session, names: Iterable[str]) -> dict[str, Node]:
    wanted = list(names)
    found: dict[str, Node] = {}
    # Chunks keep the IN list under every backend's parameter limit.
    for start in range(0, len(wanted), 500):
        chunk = wanted[start : start + 500]
        found.update({n.name: n for n in session.scalars(select(Node).where(Node.name.in_(chunk)))})
    return found


def add_nodes(session: Session, clock: Clock, expressions: list[str], settings: NodeSettings) -> list[Node]:
    """Pre-register nodes in state `new`. All or nothing: raises Conflict if any name exists."""
    names = expand_names(expressions)
    existing = _by_names(session, names)
    if existing:
        raise Conflict(f"node already exists: {hostlist.collect(sorted(existing))}")
    categories.ensure(session, clock, settings.category)  # see inventory.categories: made, not refused
    now = to_datetime(clock.now())
    nodes = [
        Node(
            name=name,
            state=NodeState.NEW,
            state_since=now,
            created_at=now,
            category=settings.category,
            labels=dict(settings.labels),
        )
        for name in names
    ]
    session.add_all(nodes)
    session.flush()
    return nodes


def get_node(session: Session, name: str) -> Node:
    node = session.scalar(select(Node).where(Node.name == name))
    if node is None:
        raise NotFound(f"no such node: {name}")
    return node


def list_nodes(session: Session, expressions: list[str] | None = None) -> list[Node]:
    if expressions:
        return sorted(_by_names(session, expand_names(expressions)).values(), key=lambda n: n.name)
    return list(session.scalars(select(Node).order_by(Node.name)))


@dataclass(slots=True)
class NodeSummary:
    """What fleet-wide views show of a node, read as plain rows: the dashboard's overview, node table
    and GPU map list every node every few seconds, and building a thousand `Node` objects with eight
    `Gpu` objects each takes the ORM longer than such a page may take in all."""

    id: int
    name: str
    state: NodeState
    health: str
    health_reasons: list[str]
    category: str | None
    last_seen: datetime | None
    expected_gpus: int
    drained_at: datetime | None
    drain_reason: str | None
    drained_by: str | None
    wlm_state: str | None  # Slurm's word for the node, under workload_manager = "slurm"
    gpu_models: dict[int, str] = field(default_factory=dict)  # by GPU index, as inventoried

    @property
    def current_health(self) -> str:
        """The health verdict while the node is up; "unknown" otherwise, since a down node's last verdict
        says nothing about it now (a crashed node must not be counted, or sorted, as healthy)."""
        return self.health if self.state is NodeState.UP else "unknown"

    @property
    def gpu_count(self) -> int:
        return len(self.gpu_models)

    @property
    def gpu_model(self) -> str | None:
        return self.gpu_models[min(self.gpu_models)] if self.gpu_models else None


def node_summaries(session: Session) -> list[NodeSummary]:
    """Every node, by name, in two queries of plain rows."""
    columns = (
        Node.id,
        Node.name,
        Node.state,
        Node.health,
        Node.health_reasons,
        Node.category,
        Node.last_seen,
        Node.expected_gpus,
        Node.drained_at,
        Node.drain_reason,
        Node.drained_by,
        Node.wlm_state,
    )
    nodes = [NodeSummary(**row._asdict()) for row in session.execute(select(*columns).order_by(Node.name))]
    by_id = {n.id: n for n in nodes}
    for node_id, index, model in session.execute(select(Gpu.node_id, Gpu.index, Gpu.model)):
        node = by_id.get(node_id)
        if node is not None:
            node.gpu_models[index] = model
    return nodes


def remove_nodes(session: Session, expressions: list[str]) -> dict[str, int]:
    """Delete nodes with their GPUs, history and credentials; returns their ids by name, in order.

    All or nothing: raises NotFound if any is unknown."""
    names = expand_names(expressions)
    found = _by_names(session, names)
    missing = [n for n in names if n not in found]
    if missing:
        raise NotFound(f"no such node: {hostlist.collect(missing)}")
    removed = {name: found[name].id for name in names}
    for node in found.values():
        session.delete(node)
    session.flush()
    return removed


def clone_node(session: Session, clock: Clock, source: str, expressions: list[str]) -> list[Node]:
    """New nodes with the source's settings (category, labels, its own setting values); inventory and
    state are their own."""
    src = get_node(session, source)
    settings = NodeSettings(category=src.category, labels=dict(src.labels))
    added = add_nodes(session, clock, expressions, settings)
    for node in added:
        node.settings = dict(src.settings or {})
    session.flush()
    return added


def join(session: Session, clock: Clock, name: str) -> Node:
    """The node an agent joins as: the pre-registered one, or a new one in state `new`.

    Raises Conflict if that node is `up`: a join token must not let anyone take over a live node's
    identity. A reinstalled node re-joins once its old agent is gone (the node is `new` or `down`).
    """
    node = session.scalar(select(Node).where(Node.name == name))
    if node is not None:
        if node.state is NodeState.UP:
            raise Conflict(f"node {name} is up with another agent; stop it or remove the node first")
        return node
    return add_nodes(session, clock, [name], NodeSettings())[0]


def report_inventory(session: Session, clock: Clock, node_id: int, inventory: NodeInventory) -> bool:
    """A node's own report. Raises NotFound if the node was removed meanwhile."""
    node = session.get(Node, node_id)
    if node is None:
        raise NotFound("node no longer exists")
    return apply_inventory(session, clock, node, inventory)


def apply_inventory(session: Session, clock: Clock, node: Node, inventory: NodeInventory) -> bool:
    """Store a reported inventory, replacing the GPU list. Returns False when nothing changed. Raises
    Conflict, storing nothing, when it claims what another live node has (`refuse_claims`)."""
    fingerprint = inventory.fingerprint()
    if node.inventory_fingerprint == fingerprint:
        return False
    refuse_claims(session, node, inventory)
    node.hostname = inventory.hostname
    node.cpus = inventory.cpus
    node.cpu_model = inventory.cpu_model
    node.memory_total_mib = inventory.memory_total_mib
    node.os_name = inventory.os_name
    node.kernel = inventory.kernel
    node.arch = inventory.arch
    node.agent_version = inventory.agent_version
    node.gpu_source = inventory.gpu_source
    node.inventory_fingerprint = fingerprint
    node.inventory_at = to_datetime(clock.now())
    node.expected_gpus = max(node.expected_gpus or 0, len(inventory.gpus))
    node.gpus.clear()
    session.flush()  # delete the old rows before inserting ones with the same (node_id, index)
    node.gpus.extend(Gpu(**gpu.model_dump()) for gpu in inventory.gpus)
    session.flush()
    return True


def refuse_claims(session: Session, node: Node, inventory: NodeInventory) -> None:
    """Raise Conflict if `inventory` claims a GPU or a hostname of another node that is up.

    A GPU UUID is one physical GPU, in one node at a time; a hostname is one machine. A node that is up
    holds its own: an inventory naming one of them is another agent's mistake or a lie, and storing it
    would put one GPU in two nodes' records (its metrics, events and jobs attributed to either). A node
    that is down or new does not hold them: a card moved into another chassis, or a machine reinstalled
    under a new name, is reported by its new node. The hostname is compared case-insensitively with the
    other nodes' hostnames and names, and its first label with their names (`gpu001.cluster` is node
    `gpu001`'s)."""
    others_up = (Node.id != node.id) & (Node.state == NodeState.UP)
    uuids = [gpu.uuid for gpu in inventory.gpus]
    if uuids:
        held = session.execute(
            select(Gpu.uuid, Node.name).join(Node, Node.id == Gpu.node_id).where(others_up, Gpu.uuid.in_(uuids))
        ).first()
        if held is not None:
            raise Conflict(f"inventory refused: GPU {held[0]} is in node {held[1]}, which is up; a GPU is in one node")
    hostname = inventory.hostname.lower()
    short = hostname.split(".", 1)[0]
    clash = session.scalar(
        select(Node.name)
        .where(
            others_up,
            (func.lower(Node.hostname) == hostname) | func.lower(Node.name).in_({hostname, short}),
        )
        .limit(1)
    )
    if clash is not None:
        raise Conflict(f"inventory refused: hostname {inventory.hostname} is node {clash}'s, which is up")


def transition(session: Session, clock: Clock, node_id: int, src: NodeState, dst: NodeState, reason: str) -> bool:
    """Move a node from `src` to `dst` and record why. Returns False if it was no longer in `src`.

    The UPDATE is conditional on the current state, so a replica acting on stale knowledge (the
    leader marking down a node that another replica just saw) changes nothing.
    """
    if not allowed(src, dst):
        raise Conflict(f"a node cannot go from {src} to {dst}")
    at = to_datetime(clock.now())
    result = session.execute(
        update(Node).where(Node.id == node_id, Node.state == src).values(state=dst, state_since=at)
    )
    if result.rowcount != 1:  # type: ignore[attr-defined]
        return False
    session.add(NodeTransition(node_id=node_id, at=at, from_state=src, to_state=dst, reason=reason[:512]))
    return True


def channel_identity(session: Session, node_id: int) -> tuple[str, str | None]:
    """The name and inventory fingerprint of the node opening a channel. Raises NotFound if it is gone."""
    row = session.execute(select(Node.name, Node.inventory_fingerprint).where(Node.id == node_id)).one_or_none()
    if row is None:
        raise NotFound("node no longer exists")
    return row[0], row[1]


def to_out(node: Node) -> NodeOut:
    return NodeOut(
        name=node.name,
        state=node.state,
        state_since=node.state_since,
        gpu_count=len(node.gpus),
        gpu_model=node.gpus[0].model if node.gpus else None,
        hostname=node.hostname,
        category=node.category,
        labels=node.labels,
        last_seen=node.last_seen,
        health=node.health,
        health_reasons=list(node.health_reasons or ()),
        drain_reason=node.drain_reason,
        drained_by=node.drained_by,
        wlm_state=node.wlm_state,
    )


def to_detail(session: Session, node: Node) -> NodeDetail:
    transitions = session.scalars(
        select(NodeTransition)
        .where(NodeTransition.node_id == node.id)
        .order_by(NodeTransition.at.desc(), NodeTransition.id.desc())
        .limit(HISTORY_SHOWN)
    )
    base = to_out(node).model_dump()
    return NodeDetail(
        **base,
        created_at=node.created_at,
        heartbeat_interval_s=node.heartbeat_interval_s,
        cpus=node.cpus,
        cpu_model=node.cpu_model,
        memory_total_mib=node.memory_total_mib,
        os_name=node.os_name,
        kernel=node.kernel,
        arch=node.arch,
        agent_version=node.agent_version,
        gpu_source=node.gpu_source,
        inventory_at=node.inventory_at,
        gpus=[
            GpuInfo.model_validate(
                {f: getattr(g, f) for f in GpuInfo.model_fields},
            )
            for g in node.gpus
        ],
        transitions=[TransitionOut.model_validate(t) for t in transitions],
        settings={k: SettingOut(value=r.value, origin=r.origin) for k, r in categories.resolve(session, node).items()},
    )
