"""The web dashboard: server-rendered pages (Jinja2 templates in gpufleet/web) kept live by htmx.

`pages` holds what every page shares (the session check, the layout, the live fragment); each
other module is one page and its data. `router` serves them all.
"""

from __future__ import annotations

from fastapi import APIRouter

from gpufleet.api.dashboard import (
    admin,
    alerts,
    artifacts,
    categories,
    environments,
    gpu_map,
    images,
    jobs,
    lifecycle,
    logs,
    network,
    node_detail,
    nodes,
    overview,
    power,
    services,
    software,
    storage,
    tasks,
)
from gpufleet.api.routing import IndexedRouter

router = APIRouter(include_in_schema=False)
for _page in (
    overview,
    nodes,
    node_detail,
    gpu_map,
    categories,
    jobs,
    environments,
    artifacts,
    services,
    alerts,
    logs,
    software,
    images,
    power,
    network,
    storage,
    lifecycle,
    tasks,
    admin,
):
    router.include_router(IndexedRouter.over(_page.router))  # a path reaches one page's routes
