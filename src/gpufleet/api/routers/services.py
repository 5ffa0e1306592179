"""Inference services (jobs.inference): create, list, show, scale, update, delete, logs; and the proxy
that publishes each at `/services/NAME/...` on the head (api.service_proxy).

Reading needs `jobs:read`; creating needs `services:write` and passes every check a job submission
does, for the service's user and project; changing or deleting one is for its user and job admins.
Calling one needs `services:use` and its user's or project's membership (or job admin).
"""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Request, Response
from sqlalchemy.orm import Session

from gpufleet.api.context import HeadContext
from gpufleet.api.deps import Ctx, allow, tx
from gpufleet.api.service_proxy import Route
from gpufleet.auth.policy import Permission, allowed
from gpufleet.auth.schemas import Principal
from gpufleet.core.errors import Forbidden, InvalidInput, Unauthorized
from gpufleet.jobs import inference, output, submission
from gpufleet.jobs.models import FINAL_STATES, InferenceService
from gpufleet.jobs.schemas import OutputPage, ServiceChange, ServiceCreate, ServiceOut, ServiceScale

router = APIRouter(prefix="/services", tags=["services"])
proxy = APIRouter(tags=["services"])
Read = Annotated[Principal, allow(Permission.JOBS_READ)]
Write = Annotated[Principal, allow(Permission.SERVICES_WRITE)]
Use = Annotated[Principal, allow(Permission.SERVICES_USE)]
PROXY_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]


def _admin(who: Principal) -> bool:
    return allowed(who.role, Permission.JOBS_ADMIN, who.scope)


def _out(ctx: HeadContext, db: Session, service: InferenceService) -> ServiceOut:
    found = inference.out(db, service)
    return found.model_copy(update={"stats": ctx.services.stats(service.name)})


@router.get("")
def list_services(_: Read, ctx: Ctx) -> list[ServiceOut]:
    with tx(ctx, readonly=True) as db:
        return [_out(ctx, db, s) for s in inference.listing(db)]


@router.post("", status_code=201)
def create_service(body: ServiceCreate, who: Write, ctx: Ctx, request: Request) -> ServiceOut:
    """Create the service and submit its replicas: refused as a job would be (user, project, quota,
    environment, model access), with nothing created."""
    if ctx.settings.workload_manager != "builtin":
        raise InvalidInput("inference services run on gpufleet's own scheduler, not under Slurm")
    request.state.audit_target = f"service {body.name} ({body.replicas} replicas)"
    limits = submission.Limits(ctx.settings.job_default_time_limit_s, ctx.settings.job_max_time_limit_s)
    submitter = submission.Submitter(actor=who.actor, user=who.user, admin=_admin(who))
    with tx(ctx) as db:
        out = _out(ctx, db, inference.create(db, ctx.clock, submitter, body, limits))
    ctx.jobs.wake()
    return out


@router.get("/{name}")
def show_service(name: str, _: Read, ctx: Ctx) -> ServiceOut:
    with tx(ctx, readonly=True) as db:
        return _out(ctx, db, inference.get(db, name))


@router.post("/{name}/scale")
def scale_service(name: str, body: ServiceScale, who: Write, ctx: Ctx, request: Request) -> ServiceOut:
    """Set the replica count; replicas start or stop at the reconciler's next pass."""
    request.state.audit_target = f"service {name} to {body.replicas} replicas"
    with tx(ctx) as db:
        service = inference.get(db, name)
        inference.check_owner(service, who.user, _admin(who))
        inference.scale(db, service, body.replicas)
        return _out(ctx, db, service)


@router.post("/{name}/update")
def update_service(name: str, body: ServiceChange, who: Write, ctx: Ctx, request: Request) -> ServiceOut:
    """A rolling update to a new revision (a new model version, environment or command)."""
    request.state.audit_target = f"service {name}"
    with tx(ctx) as db:
        service = inference.get(db, name)
        inference.check_owner(service, who.user, _admin(who))
        inference.update(db, service, body)
        return _out(ctx, db, service)


@router.delete("/{name}", status_code=204)
def delete_service(name: str, who: Write, ctx: Ctx, request: Request) -> None:
    """Stop every replica and remove the service; its replicas' jobs stay in the job history."""
    request.state.audit_target = f"service {name}"
    with tx(ctx) as db:
        service = inference.get(db, name)
        inference.check_owner(service, who.user, _admin(who))
        inference.delete(db, ctx.clock, service, who.actor)
    ctx.jobs.wake()


@router.get("/{name}/logs")
def service_logs(name: str, who: Read, ctx: Ctx) -> dict[int, OutputPage]:
    """Each live replica's output (by job id), first page; `gpufleet job output ID` follows one."""
    with tx(ctx, readonly=True) as db:
        service = inference.get(db, name)
        if not (_admin(who) or who.user == service.user):
            raise Forbidden(f"the logs of service {name} are for its user ({service.user}) and job admins")
        pages: dict[int, OutputPage] = {}
        for job in inference.replica_jobs(db, service):
            if job.state not in FINAL_STATES:
                pages[job.id] = output.read(db, job)
        return pages


@proxy.api_route("/services/{name}/{path:path}", methods=PROXY_METHODS, include_in_schema=False)
async def call_service(name: str, path: str, request: Request, who: Use, ctx: Ctx) -> Response:
    """Forward the call to a healthy replica of the service (api.service_proxy). A bearer token only: a
    browser's session cookie would let a page a replica serves act as the logged-in user (it is served
    from the head's own origin), so a call that came with the cookie alone is refused."""
    if request.headers.get("authorization") is None:
        raise Unauthorized("a service takes a gpufleet token (Authorization: Bearer ...), not a browser session")
    return await ctx.services.forward(request, name, path, who.user, _admin(who))


def lookup(ctx: HeadContext, name: str, user: str | None, admin: bool) -> Route:
    """The proxy's database read (on a worker thread): may this caller call it, and where are its replicas."""
    with tx(ctx, readonly=True) as db:
        service, addresses = inference.healthy_addresses(db, name)
        may = inference.may_call(db, service, user, admin)
        return Route(may, tuple(addresses), service.replicas, time.monotonic())
