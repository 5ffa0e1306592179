"""The model and dataset registries (jobs.artifacts): the same routes under /models and /datasets.

Reading needs `jobs:read`; registering and removing need `artifacts:write`. Which jobs may *use* one is
decided at submission (its project), not here; a reader whose projects may not use one sees it without
its location. Changes are audited with the artifact as target.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Request
from sqlalchemy.orm import Session

from gpufleet.api.deps import Ctx, allow, tx
from gpufleet.auth.policy import Permission, allowed
from gpufleet.auth.projects import projects_of
from gpufleet.auth.schemas import Principal
from gpufleet.core.errors import InvalidInput
from gpufleet.jobs import artifacts
from gpufleet.jobs.schemas import ArtifactIn, ArtifactOut

Read = Annotated[Principal, allow(Permission.JOBS_READ)]
Write = Annotated[Principal, allow(Permission.ARTIFACTS_WRITE)]


def _projects(db: Session, who: Principal) -> set[str] | None:
    """The reader's projects, or None for one who sees every location (registry and job admins)."""
    if allowed(who.role, Permission.ARTIFACTS_WRITE, who.scope) or allowed(who.role, Permission.JOBS_ADMIN, who.scope):
        return None
    return projects_of(db, who.user) if who.user is not None else set()


def registry(kind: str) -> APIRouter:
    """The routes of one registry, `kind` being "model" or "dataset"."""
    router = APIRouter(prefix=f"/{kind}s", tags=["models and datasets"])

    @router.get("", name=f"list_{kind}s")
    def list_all(who: Read, ctx: Ctx) -> list[ArtifactOut]:
        """Every version, with the nodes whose cache holds it."""
        with tx(ctx, readonly=True) as db:
            projects = _projects(db, who)
            return [artifacts.out(db, row, projects) for row in artifacts.listing(db, kind)]

    @router.post("", status_code=201, name=f"register_{kind}")
    def register(body: ArtifactIn, who: Write, ctx: Ctx, request: Request) -> ArtifactOut:
        if body.kind != kind:
            raise InvalidInput(f"this is the {kind} registry; the body says {body.kind}")
        request.state.audit_target = f"{kind} {body.name}:{body.version}"
        with tx(ctx) as db:
            row = artifacts.register(db, ctx.clock, who.actor, body, ctx.settings.artifact_dirs)
            return artifacts.out(db, row)

    @router.get("/{ref}", name=f"show_{kind}")
    def show(ref: str, who: Read, ctx: Ctx) -> ArtifactOut:
        """`name:version`, or `name` for the version registered last."""
        with tx(ctx, readonly=True) as db:
            return artifacts.out(db, artifacts.get(db, kind, ref), _projects(db, who))

    @router.delete("/{ref}", status_code=204, name=f"remove_{kind}")
    def remove(ref: str, _: Write, ctx: Ctx, request: Request) -> None:
        """One version (`name:version`). Queued jobs keep what they were given; node caches keep their
        copies until evicted."""
        request.state.audit_target = f"{kind} {ref}"
        with tx(ctx) as db:
            artifacts.remove(db, kind, ref)

    return router


models = registry("model")
datasets = registry("dataset")
