"""The Categories page: every category with its node count, the settings set on it (the rest its nodes
take from the defaults) and whether it has a health policy of its own. What `GET /api/v1/categories`
returns, plus the health policies."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from gpufleet.api.dashboard.pages import View, render
from gpufleet.api.deps import Ctx
from gpufleet.auth.policy import Permission
from gpufleet.inventory import categories
from gpufleet.monitoring import rules
from gpufleet.protocol.settings import SETTINGS

router = APIRouter(include_in_schema=False)


def categories_view(view: View) -> dict[str, Any]:
    counts = categories.node_counts(view.session)
    policies = {row.category for row in rules.list_policies(view.session)}
    rows = [
        {
            "name": row.name,
            "description": row.description,
            "nodes": counts[row.name],
            "settings": dict(row.settings or {}),
            "health_policy": row.name in policies,
        }
        for row in categories.list_categories(view.session)
    ]
    return {
        "categories": rows,
        "defaults": SETTINGS,
        "nodes_total": sum(counts.values()),
        "default_policy": rules.DEFAULT_POLICY in policies,
    }


@router.get("/categories", response_class=HTMLResponse)
def categories_page(request: Request, ctx: Ctx) -> Response:
    return render(request, ctx, "categories", Permission.NODES_READ, categories_view)
