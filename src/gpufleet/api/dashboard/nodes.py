"""The Nodes page: every node in a table, filtered (hostlist, state, health, category, GPU model)
and sorted on the server, so the browser holds only the rows it shows."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from gpufleet.api.dashboard.pages import View, render
from gpufleet.api.deps import Ctx
from gpufleet.auth.policy import Permission
from gpufleet.core import hostlist
from gpufleet.core.errors import InvalidInput
from gpufleet.inventory import service as inventory
from gpufleet.inventory.service import NodeSummary

router = APIRouter(include_in_schema=False)
# Rows per page: a thousand rows re-sent every 5 s cost the browser more than a hostlist search does
# the user; the page says how many matched and links to the rest.
PAGE_SIZE = 200
HEALTH_ORDER = {"failed": 0, "degraded": 1, "unknown": 2, "healthy": 3}
STATE_ORDER = {"down": 0, "new": 1, "up": 2}
SORT_KEYS: dict[str, Callable[[NodeSummary], Any]] = {
    "name": lambda n: n.name,
    "state": lambda n: (STATE_ORDER.get(n.state.value, 9), n.name),
    "health": lambda n: (HEALTH_ORDER.get(n.current_health, 9), n.name),
    "gpus": lambda n: (n.gpu_count, n.name),
    "model": lambda n: (n.gpu_model or "", n.name),
    "category": lambda n: (n.category or "", n.name),
    "last_seen": lambda n: (n.last_seen.timestamp() if n.last_seen else 0.0, n.name),
}
COLUMNS = (
    ("name", "Node"),
    ("state", "State"),
    ("health", "Health"),
    ("gpus", "GPUs"),
    ("model", "GPU model"),
    ("category", "Category"),
    ("last_seen", "Last heartbeat (UTC)"),
)


def _matcher(search: str) -> Callable[[str], bool]:
    """A hostlist expression (`gpu[001-032]`, `a,b`) matches those names; plain text, any name containing it."""
    if any(c in search for c in "[],"):
        return set(hostlist.expand(search)).__contains__
    return lambda name: search in name


def filter_nodes(nodes: list[NodeSummary], query: dict[str, str]) -> list[NodeSummary]:
    """The nodes that match every filter in `query`, sorted by `sort` (and `dir`). Raises InvalidInput."""
    sort = query.get("sort", "name")
    if sort not in SORT_KEYS:
        raise InvalidInput(f"cannot sort by {sort!r}: one of {', '.join(SORT_KEYS)}")
    if "q" in query:
        matches = _matcher(query["q"].strip())
        nodes = [n for n in nodes if matches(n.name)]
    if "state" in query:
        nodes = [n for n in nodes if n.state.value == query["state"]]
    if "health" in query:
        nodes = [n for n in nodes if n.current_health == query["health"]]
    if query.get("drained") == "yes":
        nodes = [n for n in nodes if n.drained_at is not None]
    if "category" in query:
        nodes = [n for n in nodes if (n.category or "") == query["category"]]
    if "model" in query:
        nodes = [n for n in nodes if n.gpu_model == query["model"]]
    return sorted(nodes, key=SORT_KEYS[sort], reverse=query.get("dir") == "desc")


def _page(query: dict[str, str], matched: int) -> int:
    text = query.get("page", "1")
    last = max(1, -(-matched // PAGE_SIZE))
    if not text.isdigit() or not 1 <= int(text) <= last:
        raise InvalidInput(f"page is a number from 1 to {last}")
    return int(text)


def nodes_view(view: View) -> dict[str, Any]:
    every = inventory.node_summaries(view.session)
    matched = filter_nodes(every, view.query)
    page = _page(view.query, len(matched))
    first = (page - 1) * PAGE_SIZE
    return {
        "nodes": matched[first : first + PAGE_SIZE],
        "matched": len(matched),
        "first": first + 1,
        "page_no": page,  # not "page": that names the page in the navigation
        "last_page": max(1, -(-len(matched) // PAGE_SIZE)),
        "total": len(every),
        "query": view.query,
        "columns": COLUMNS,
        "sort": view.query.get("sort", "name"),
        "dir": view.query.get("dir", "asc"),
        "categories": sorted({n.category for n in every if n.category}),
        "models": sorted({n.gpu_model for n in every if n.gpu_model}),
    }


@router.get("/nodes", response_class=HTMLResponse)
def nodes_page(request: Request, ctx: Ctx) -> Response:
    return render(request, ctx, "nodes", Permission.NODES_READ, nodes_view)
