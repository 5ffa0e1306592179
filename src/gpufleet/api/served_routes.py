"""What the head serves: every router under /api/v1 and outside it, the errors every API route may answer,
and the routes built once per process from them (`shared_routes`, which `api.app.create_app` serves)."""

from __future__ import annotations

import functools
from typing import Any

from fastapi import APIRouter, FastAPI
from pydantic import BaseModel
from starlette.routing import BaseRoute

from gpufleet.api import dashboard
from gpufleet.api.routers import (
    agent,
    agent_deploy,
    ansible,
    artifacts,
    audit_log,
    categories,
    environments,
    job_metrics,
    logs,
    nodes,
    projects,
    prometheus_metrics,
    services,
    sharing,
    slurm_accounts,
    sso,
    templates,
    tokens,
    users,
    web_login,
)
from gpufleet.api.routers import (
    assets as assets_routes,
)
from gpufleet.api.routers import (
    burnin as burnin_routes,
)
from gpufleet.api.routers import (
    directory as directory_routes,
)
from gpufleet.api.routers import (
    images as image_routes,
)
from gpufleet.api.routers import (
    jobs as job_routes,
)
from gpufleet.api.routers import (
    maintenance as maintenance_routes,
)
from gpufleet.api.routers import (
    monitoring as monitoring_routes,
)
from gpufleet.api.routers import (
    power as power_routes,
)
from gpufleet.api.routers import (
    provisioning as provisioning_routes,
)
from gpufleet.api.routers import (
    slurm as slurm_routes,
)
from gpufleet.api.routers import (
    storage as storage_routes,
)
from gpufleet.api.routers import (
    switches as switch_routes,
)
from gpufleet.api.routers import (
    tasks as task_routes,
)
from gpufleet.api.routing import IndexedRouter

API_PREFIX = "/api/v1"


class ErrorOut(BaseModel):
    detail: str


# Every API route may answer with gpufleet's own errors; documented so clients (and schemathesis) know.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorOut, "description": text}
    for code, text in {
        400: "invalid input",
        401: "no or bad credential",
        403: "not allowed",
        404: "not found",
        409: "conflict",
        413: "too large",
        429: "too many attempts; wait for Retry-After seconds",
        503: "a dependency is unavailable",
    }.items()
}
# Every router served under /api/v1. The route x role matrix test walks this tuple, so a router
# cannot be served without its routes being checked against the policy table.
API_ROUTERS: tuple[APIRouter, ...] = (
    nodes.router,
    nodes.gpus,
    tokens.router,
    tokens.whoami_router,
    tokens.login_router,
    agent.router,
    job_routes.router,
    job_routes.reports,
    job_metrics.router,
    audit_log.router,
    logs.router,
    assets_routes.router,
    provisioning_routes.router,
    ansible.router,
    agent_deploy.router,
    categories.router,
    users.router,
    projects.router,
    monitoring_routes.router,
    slurm_routes.router,
    slurm_accounts.router,
    task_routes.router,
    environments.router,
    artifacts.models,
    artifacts.datasets,
    services.router,
    templates.router,
    power_routes.router,
    image_routes.router,
    burnin_routes.router,
    maintenance_routes.router,
    directory_routes.router,
    sso.api,
    switch_routes.router,
    storage_routes.router,
    sharing.router,
)
# Routers served outside /api/v1 whose routes name a permission (GET /metrics, where Prometheus
# looks); the route x role matrix test walks these too.
ROOT_ROUTERS: tuple[APIRouter, ...] = (prometheus_metrics.router, services.proxy)


@functools.cache
def shared_routes() -> tuple[tuple[BaseRoute, ...], tuple[BaseRoute, ...]]:
    """The API's, the dashboard's, then the login and root routes, built once per process. Including a
    router makes FastAPI analyse every route's parameters (about 0.4 CPU-seconds for gpufleet's), and the
    result is the same for every app: a route reaches its head through `request.app.state.ctx`, never the
    app it was built with. (Dependency overrides would be the first app's; gpufleet uses none.) The test
    suite builds an app per test, hundreds of times."""
    template = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
    api = IndexedRouter(prefix=API_PREFIX, responses=ERROR_RESPONSES)  # a page's path skips the API
    for router in API_ROUTERS:
        api.include_router(IndexedRouter.over(router))  # a path reaches one router's routes, not all
    template.include_router(api)
    template.include_router(dashboard.router)
    before = tuple(template.router.routes)
    for router in (web_login.router, sso.router, *ROOT_ROUTERS):
        template.include_router(router)
    return before, tuple(template.router.routes[len(before) :])
