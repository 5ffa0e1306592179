"""The node and GPU lists as plain rows, a page at a time, for the REST list endpoints.

Scripts and the CLI list a thousand nodes with eight GPUs each every few seconds. Loading them as `Node`
objects with their `Gpu` collections cost the head about half a CPU-second per call; these read tuples
and build the answer's dicts directly (the same fields as `NodeOut` and `GpuOut`), a few milliseconds per
thousand nodes. Pages are keyed by name (nodes) or by (node, index) (GPUs), so a page stays correct while
nodes are added or removed between two calls, unlike an offset.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import pydantic_core
from sqlalchemy import Select, Text, and_, cast, func, select, tuple_
from sqlalchemy.orm import Session, aliased

from gpufleet.inventory.models import Gpu, Node
from gpufleet.inventory.service import expand_names
from gpufleet.inventory.states import NodeState

MAX_PAGE = 10_000
_IN_CHUNK = 500  # names per IN (...): under every backend's bound-parameter limit

_NODE_COLUMNS = (
    Node.id,
    Node.name,
    Node.state,
    Node.state_since,
    Node.hostname,
    Node.category,
    # As their JSON text: most nodes share the same few labels and reasons, each parsed once (`_parsed`).
    cast(Node.labels, Text).label("labels"),
    Node.last_seen,
    Node.health,
    cast(Node.health_reasons, Text).label("health_reasons"),
    Node.drain_reason,
    Node.drained_by,
    Node.wlm_state,
)
_GPU_COLUMNS = (
    Gpu.node_id,
    Gpu.index,
    Gpu.uuid,
    Gpu.model,
    Gpu.serial,
    Gpu.pci_bus_id,
    Gpu.memory_total_mib,
    Gpu.driver_version,
    Gpu.cuda_version,
    Gpu.vbios_version,
    Gpu.mig_mode,
    Gpu.ecc_mode,
    Gpu.compute_capability,
    Gpu.power_limit_w,
)


@dataclass
class Page:
    """One page of a list: its rows (dicts in the API's shape), and the key to ask for the next page
    with (`None` on the last one)."""

    rows: list[dict[str, Any]]
    next_after: str | None


def _node_query() -> Select[*tuple[Any, ...]]:
    """Every node's columns with its GPU count and the model of its lowest-numbered GPU (what `NodeOut`
    calls the node's GPU model), in one query: the GPUs are counted by the database, not in Python."""
    counted = (
        select(Gpu.node_id, func.count().label("gpu_count"), func.min(Gpu.index).label("first"))
        .group_by(Gpu.node_id)
        .subquery()
    )
    first = aliased(Gpu)
    query: Select[*tuple[Any, ...]] = (
        select(*_NODE_COLUMNS, counted.c.gpu_count, first.model.label("gpu_model"))
        .outerjoin(counted, counted.c.node_id == Node.id)
        .outerjoin(first, and_(first.node_id == Node.id, first.index == counted.c.first))
        .order_by(Node.name)
    )
    return query


def node_page(session: Session, expressions: list[str] | None, after: str | None, limit: int) -> Page:
    """Nodes by name after `after`, at most `limit`, optionally only those `expressions` name.

    Each row has `NodeOut`'s fields, plus `id` (dropped by the caller) for joining other domains' columns.
    Raises InvalidInput for a bad hostlist expression.
    """
    names = expand_names(expressions) if expressions else None
    query = _node_query()
    if after is not None and names is None:
        query = query.where(Node.name > after)
    found = _fetch(session, query, names, limit, key=lambda r: r.name, after=after)
    more = len(found) > limit
    parsed: dict[str | None, Any] = {}
    rows = [
        {
            "id": r.id,
            "name": r.name,
            "state": r.state,
            "state_since": r.state_since,
            "gpu_count": r.gpu_count or 0,
            "gpu_model": r.gpu_model,
            "hostname": r.hostname,
            "category": r.category,
            "labels": _parsed(parsed, r.labels, {}),
            "last_seen": r.last_seen,
            "health": r.health,
            "health_reasons": _parsed(parsed, r.health_reasons, []),
            "drain_reason": r.drain_reason,
            "drained_by": r.drained_by,
            "wlm_state": r.wlm_state,
            "power_state": None,
        }
        for r in found[:limit]
    ]
    return Page(rows, rows[-1]["name"] if more and rows else None)


def _fetch(
    session: Session,
    query: Select[*tuple[Any, ...]],
    names: list[str] | None,
    limit: int,
    key: Callable[[Any], Any],
    after: Any = None,
) -> list[Any]:
    """Up to `limit` + 1 rows of `query` (one more tells whether another page follows). For the nodes
    `names` names, in chunks, then sorted and paged here by `key` past `after`: the database's collation
    (PostgreSQL's ignores case and punctuation at first) need not agree with Python's order, and one
    order must both sort a page and key the next.

    Core, not the ORM's execute: the ORM's row processing costs more than the query at a thousand rows."""
    db = session.connection()
    if names is None:
        return list(db.execute(query.limit(limit + 1)))
    rows: list[Any] = []
    for start in range(0, len(names), _IN_CHUNK):
        rows += db.execute(query.where(Node.name.in_(names[start : start + _IN_CHUNK])))
    return [r for r in sorted(rows, key=key) if after is None or key(r) > after][: limit + 1]


def _parsed(seen: dict[str | None, Any], text: str | None, empty: Any) -> Any:
    """A JSON column's value from its text, parsed once per distinct text in a page. The rows share the
    parsed objects, which is safe because they are only serialised, never changed."""
    if text is None:
        return empty
    if text not in seen:
        seen[text] = pydantic_core.from_json(text)
    return seen[text]


def heartbeat_free(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows without what moves while nothing happens: a node that is `up` has a heartbeat time a
    second old, always, so it is left out of what the list's validator is computed over."""
    return [{**r, "last_seen": None} if r["state"] == NodeState.UP else r for r in rows]


def gpu_page(session: Session, expressions: list[str] | None, after: tuple[str, int] | None, limit: int) -> Page:
    """GPUs by (node name, index) after `after`, at most `limit`, optionally only on the nodes
    `expressions` name. Each row: the node's name and state, and the GPU's inventory (`GpuInfo`'s
    fields). Raises InvalidInput for a bad hostlist expression."""
    names = expand_names(expressions) if expressions else None
    query = (
        select(Node.name.label("node"), Node.state.label("node_state"), *_GPU_COLUMNS)
        .join(Node, Node.id == Gpu.node_id)
        .order_by(Node.name, Gpu.index)
    )
    if after is not None and names is None:
        query = query.where(tuple_(Node.name, Gpu.index) > tuple_(*after))
    rows = _fetch(session, query, names, limit, key=lambda r: (r.node, r.index), after=after)
    more = len(rows) > limit
    rows = rows[:limit]
    out = [{k: v for k, v in r._asdict().items() if k != "node_id"} for r in rows]
    return Page(out, f"{out[-1]['node']}:{out[-1]['index']}" if more and out else None)
