"""The Models and Datasets pages: every registered version (what `gpufleet model list` and `gpufleet
dataset list` show) with its size, framework and format, licence, source, the project that owns it and
the others that may use it, and the nodes whose cache holds a copy. One template serves both kinds.

The nodes caching each version are read in one query for the whole page (`cached_on`), not one per
row as `jobs.artifacts.out` does for the API."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response
from sqlalchemy import select
from sqlalchemy.orm import Session

from gpufleet.api.dashboard.pages import View, render
from gpufleet.api.deps import Ctx
from gpufleet.auth.policy import Permission
from gpufleet.inventory.models import Node
from gpufleet.jobs import artifacts
from gpufleet.jobs.models import NodeArtifact

router = APIRouter(include_in_schema=False)


def cached_on(session: Session) -> dict[str, list[str]]:
    """The names of the nodes whose cache holds each checksum, in name order."""
    found: dict[str, list[str]] = defaultdict(list)
    rows = session.execute(
        select(NodeArtifact.sha256, Node.name).join(Node, Node.id == NodeArtifact.node_id).order_by(Node.name)
    )
    for sha, name in rows:
        found[sha].append(name)
    return found


def artifacts_view(view: View, kind: str) -> dict[str, Any]:
    nodes = cached_on(view.session)
    rows = [{"artifact": a, "nodes": nodes.get(a.sha256, [])} for a in artifacts.listing(view.session, kind)]
    return {"kind": kind, "artifacts": rows}


@router.get("/models", response_class=HTMLResponse)
def models_page(request: Request, ctx: Ctx) -> Response:
    return render(
        request, ctx, "artifacts", Permission.JOBS_READ, lambda view: artifacts_view(view, "model"), nav="models"
    )


@router.get("/datasets", response_class=HTMLResponse)
def datasets_page(request: Request, ctx: Ctx) -> Response:
    return render(
        request, ctx, "artifacts", Permission.JOBS_READ, lambda view: artifacts_view(view, "dataset"), nav="datasets"
    )
