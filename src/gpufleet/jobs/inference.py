"""Inference services: long-running model servers kept at their replica count, health-checked, rolled
to a new revision one replica at a time, and reached through the head (`/services/NAME/...`).

A replica is an ordinary job of the service's user and project, so it is placed, charged and bounded
by quotas like any other, and its model is staged like any job's. What this module adds is the
*reconciler*, one pass of which (`reconcile`, run by the leader every few seconds after the health
probes) makes the replicas match the service:

- a replica whose job ended (its process died, its node failed) is replaced, and counted in `restarts`;
  replicas that end before they ever pass a health check (a bad command, a model that will not load)
  are a crash loop: the next start waits 2, 4, 8 ... up to `MAX_BACKOFF_S` seconds, as Kubernetes'
  CrashLoopBackOff does, and the service's `message` says why;
- a replica that fails `FAILURES_TO_REPLACE` health checks in a row is stopped and replaced, once it
  has passed one or its `startup_s` is over (loading a model takes a while: that is no failure);
- fewer replicas than wanted: new ones are submitted; more: the newest unhealthy, then newest, go;
- after an update (a new `revision`), one new replica is started at a time, beyond the count, and an
  old one is stopped for each new one that passes its health check, so the service keeps answering.

A replica listens on `replica_port(job_id)` (in $GPUFLEET_SERVICE_PORT): unique per job, in a range
clear of torchrun's rendezvous ports (`dispatch.master_port`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gpufleet.auth.projects import projects_of
from gpufleet.core.clock import Clock, to_datetime
from gpufleet.core.errors import Conflict, Forbidden, GpufleetError, InvalidInput, NotFound, describe
from gpufleet.inventory.models import Node
from gpufleet.jobs import artifacts, environments, lifecycle, submission
from gpufleet.jobs.models import FINAL_STATES, InferenceService, Job, JobState, ServiceReplica
from gpufleet.jobs.schemas import JobSubmit, ReplicaOut, ServiceChange, ServiceCreate, ServiceOut

PORT_BASE = 40_000
PORT_SPAN = 10_000
FAILURES_TO_REPLACE = 3
# A ready replica leaves the proxy's rotation after this many failed checks in a row, not one: a single
# check slower than its timeout on a busy node is no outage (and a replica that is really gone is
# skipped by the proxy meanwhile, as it refuses the connection).
FAILURES_TO_UNREADY = 2
MAX_BACKOFF_S = 300.0
ENDPOINT = "/services/{name}/"


def replica_port(job_id: int) -> int:
    return PORT_BASE + job_id % PORT_SPAN


@dataclass(frozen=True)
class Probe:
    """A replica to health-check: its row id and the URL of its health endpoint."""

    replica_id: int
    url: str


def create(
    session: Session, clock: Clock, who: submission.Submitter, spec: ServiceCreate, limits: submission.Limits
) -> InferenceService:
    """Create the service and submit its first replicas in the caller's transaction, so every refusal a
    job can meet (user, project, quota, environment, a model the project may not use) refuses the
    service itself, and nothing is left half made."""
    replica = spec.replica
    if replica.time_limit_s is None:  # a service runs until stopped: its replicas get the longest limit
        replica = replica.model_copy(update={"time_limit_s": limits.max_time_limit_s})
    run_as = replica.user or who.user
    if run_as is None:
        raise InvalidInput("this token belongs to no user, so a service needs --user")
    service = InferenceService(
        name=spec.name,
        project=replica.project,
        user=run_as,
        created_by=who.actor,
        created_at=to_datetime(clock.now()),
        state="running",
        replicas=spec.replicas,
        spec=replica.model_dump(mode="json") | {"startup_s": spec.startup_s},
        health_path=spec.health_path,
        revision=1,
        restarts=0,
        crashes=0,
        message="",
    )
    try:
        with session.begin_nested():
            session.add(service)
            session.flush()
    except IntegrityError:
        raise Conflict(f"service {spec.name} exists") from None
    first = _submit(session, clock, service, limits, who)  # refuses the service when its job is refused
    service.project = first.project  # the project submission chose (the user's only one, when none named)
    for _ in range(spec.replicas - 1):
        _submit(session, clock, service, limits, who)
    return service


def _submit(
    session: Session,
    clock: Clock,
    service: InferenceService,
    limits: submission.Limits,
    who: submission.Submitter | None = None,
) -> Job:
    """One more replica of the service's current revision."""
    spec = replica_job(service.name, service.spec, service.user, service.project, service.revision)
    # The reconciler submits as the service's user, with no admin right: a user who left the project can
    # no longer have replicas started for it.
    as_who = who or submission.Submitter(actor=f"service:{service.name}", user=service.user, admin=False)
    job = submission.submit(session, clock, as_who, spec, limits)
    port = replica_port(job.id)
    job.env = {**job.env, "GPUFLEET_SERVICE_PORT": str(port)}
    session.add(
        ServiceReplica(
            service_id=service.id,
            job_id=job.id,
            revision=service.revision,
            port=port,
            healthy=False,
            ever_healthy=False,
            failures=0,
            created_at=to_datetime(clock.now()),
        )
    )
    session.flush()
    return job


def replica_job(name: str, spec: dict[str, Any], user: str, project: str | None, revision: int) -> JobSubmit:
    """The job one replica is: the service's spec, its name, user and project, never requeued (the
    service replaces a replica instead). InvalidInput when the spec makes no valid job."""
    body: dict[str, Any] = {k: v for k, v in spec.items() if k != "startup_s"}
    body |= {"name": f"{name}.r{revision}", "user": user, "project": project, "requeue": False}
    body["env"] = {**(body.get("env") or {}), "GPUFLEET_SERVICE_NAME": name}
    try:
        return JobSubmit.model_validate(body)
    except ValidationError as exc:
        raise InvalidInput(f"the replica's job is not valid: {describe(exc)}") from None


def _replicas(session: Session, service: InferenceService) -> list[ServiceReplica]:
    return list(
        session.scalars(
            select(ServiceReplica).where(ServiceReplica.service_id == service.id).order_by(ServiceReplica.id)
        )
    )


def replica_jobs(session: Session, service: InferenceService) -> list[Job]:
    return list(
        session.scalars(
            select(Job)
            .join(ServiceReplica, ServiceReplica.job_id == Job.id)
            .where(ServiceReplica.service_id == service.id)
            .order_by(Job.id)
        )
    )


def get(session: Session, name: str) -> InferenceService:
    found = session.scalars(select(InferenceService).where(InferenceService.name == name)).first()
    if found is None:
        raise NotFound(f"no service {name} (gpufleet service list shows them)")
    return found


def listing(session: Session) -> list[InferenceService]:
    return list(session.scalars(select(InferenceService).order_by(InferenceService.name)))


def check_owner(service: InferenceService, user: str | None, admin: bool) -> None:
    """Only the service's user and job admins change or delete it."""
    if not admin and user != service.user:
        raise Forbidden(f"service {service.name} belongs to {service.user}; only they or a job admin may change it")


def may_call(session: Session, service: InferenceService, user: str | None, admin: bool) -> bool:
    """Who may call a service through the head: job admins, its user, and members of its project."""
    if admin or (user is not None and user == service.user):
        return True
    if user is None or service.project is None:
        return False
    return service.project in projects_of(session, user)


def scale(session: Session, service: InferenceService, replicas: int) -> None:
    service.replicas = replicas  # the reconciler starts or stops replicas at its next pass


def update(session: Session, service: InferenceService, change: ServiceChange) -> None:
    """A new revision; the reconciler rolls the replicas to it. Checked now: its job spec, its environment
    and whether the service's project may use its model (NotFound, Forbidden)."""
    if change.environment is not None:
        environments.get(session, change.environment)
    if change.model is not None:
        artifacts.for_job(session, service.project, change.model, list(service.spec.get("datasets") or []))
    spec = dict(service.spec)
    for key, value in change.model_dump(exclude_none=True).items():
        spec[key] = value
    if change.argv is not None:
        spec["script"] = None
    elif change.script is not None:
        spec["argv"] = []
    replica_job(service.name, spec, service.user, service.project, service.revision + 1)  # InvalidInput
    service.spec = spec
    service.revision += 1
    service.message = ""


def delete(session: Session, clock: Clock, service: InferenceService, actor: str) -> None:
    """Stop every replica and forget the service (its jobs stay in the history)."""
    for row in _replicas(session, service):
        _retire(session, clock, row, f"service {service.name} deleted by {actor}")
    session.delete(service)


def _retire(session: Session, clock: Clock, row: ServiceReplica, why: str) -> None:
    job = lifecycle.lock_job(session, row.job_id)
    if job.state not in FINAL_STATES:
        lifecycle.finish(session, clock, job, JobState.CANCELLED, why)
    session.delete(row)


# -- the reconciler -------------------------------------------------------------------------------------
def probes(session: Session) -> list[Probe]:
    """Every running replica's health endpoint (its address set by `reconcile` once it was placed)."""
    rows = session.execute(
        select(ServiceReplica.id, ServiceReplica.address, InferenceService.health_path)
        .join(InferenceService, InferenceService.id == ServiceReplica.service_id)
        .join(Job, Job.id == ServiceReplica.job_id)
        .where(ServiceReplica.address.is_not(None), Job.state == JobState.RUNNING)
    )
    return [Probe(rid, f"http://{address}{path}") for rid, address, path in rows]


def record_probes(session: Session, clock: Clock, results: dict[int, bool]) -> None:
    now = to_datetime(clock.now())
    for row in session.scalars(select(ServiceReplica).where(ServiceReplica.id.in_(list(results)))):
        ok = results[row.id]
        row.failures = 0 if ok else row.failures + 1
        row.healthy = ok or (row.healthy and row.failures < FAILURES_TO_UNREADY)
        row.ever_healthy = row.ever_healthy or ok
        row.checked_at = now


def reconcile(session: Session, clock: Clock, limits: submission.Limits) -> bool:
    """One pass over every service; True when it submitted or stopped a replica (the scheduler should run)."""
    changed = False
    for service in listing(session):
        changed |= _reconcile_one(session, clock, service, limits)
    return changed


def _reconcile_one(session: Session, clock: Clock, service: InferenceService, limits: submission.Limits) -> bool:
    now = clock.now()
    startup = float(service.spec.get("startup_s", 600.0))
    live: list[ServiceReplica] = []
    changed = False
    for row in _replicas(session, service):
        job = session.get(Job, row.job_id)
        if job is None or job.state in FINAL_STATES:
            session.delete(row)  # died: replaced below
            service.restarts += 1
            _crashed(service, row, job, now)
            changed = True
            continue
        started = _process_started(job)
        # The startup allowance counts from when its processes started, after its model was staged.
        late = started is not None and now - started > startup
        if row.failures >= FAILURES_TO_REPLACE and (row.ever_healthy or late):
            _retire(session, clock, row, f"service {service.name}: failed {row.failures} health checks")
            service.restarts += 1
            _crashed(service, row, job, now)
            changed = True
            continue
        if job.state == JobState.RUNNING and row.address is None:
            row.address = _address(session, job, row.port)
        if row.healthy:
            service.crashes, service.retry_at = 0, None
        live.append(row)
    # Backing off after a crash loop: no new replica yet (stopping replicas, for a scale-down, goes on).
    may_start = service.retry_at is None or now >= service.retry_at.timestamp()
    try:
        changed |= _converge(session, clock, service, live, limits, may_start)
        if service.crashes == 0:
            service.message = ""
    except GpufleetError as exc:  # a replica the cluster now refuses: user left the project, quota cut
        service.message = f"cannot start a replica: {exc}"[:512]
    return changed


def _crashed(service: InferenceService, row: ServiceReplica, job: Job | None, now: float) -> None:
    """Count a replica that ended or was stopped; one that never became healthy extends the back-off."""
    if row.ever_healthy:
        service.crashes, service.retry_at = 0, None
        return
    service.crashes += 1
    wait = min(2.0**service.crashes, MAX_BACKOFF_S)
    service.retry_at = to_datetime(now + wait)
    why = job.reason if job is not None else "its job is gone"
    service.message = (
        f"replica job {row.job_id} ended before it was ever healthy ({why}); {service.crashes} in a row,"
        f" the next starts in {wait:.0f} s"
    )[:512]


def _converge(
    session: Session,
    clock: Clock,
    service: InferenceService,
    live: list[ServiceReplica],
    limits: submission.Limits,
    may_start: bool,
) -> bool:
    """Start or stop replicas towards the wanted count and the current revision; True if it did."""
    current = [r for r in live if r.revision == service.revision]
    old = sorted((r for r in live if r.revision != service.revision), key=lambda r: (r.healthy, r.id))
    want = service.replicas
    if old:
        ready = [r for r in current if r.healthy]
        # One old replica goes per new one ready; the unhealthy ones first, so the healthy keep serving.
        retire = old[: max(0, len(old) + len(ready) - want)]
        for row in retire:
            _retire(session, clock, row, f"service {service.name}: replaced by revision {service.revision}")
        if may_start and len(current) < want and len(ready) == len(current):  # one new at a time
            _submit(session, clock, service, limits)
            return True
        return bool(retire)
    if len(current) < want:
        if not may_start:
            return False
        for _ in range(want - len(current)):
            _submit(session, clock, service, limits)
        return True
    if len(current) > want:
        # The unhealthy first, then the newest: the ones serving longest stay.
        for row in sorted(current, key=lambda r: (r.healthy, -r.id))[: len(current) - want]:
            _retire(session, clock, row, f"service {service.name}: scaled to {want}")
        return True
    return False


def _process_started(job: Job) -> float | None:
    """When the agent said the replica's processes run (its rank's start); None before that."""
    rank = next((r for r in job.ranks if r.run == job.run and r.rank == 0), None)
    return rank.started_at.timestamp() if rank is not None and rank.started_at is not None else None


def _address(session: Session, job: Job, port: int) -> str | None:
    rank = next((r for r in job.ranks if r.run == job.run and r.rank == 0), None)
    if rank is None:
        return None
    host = session.scalar(select(Node.hostname).where(Node.id == rank.node_id)) if rank.node_id else None
    return f"{host or rank.node}:{port}"


def healthy_addresses(session: Session, name: str) -> tuple[InferenceService, list[str]]:
    """The service, and the addresses of its replicas passing their health check (for the proxy)."""
    service = get(session, name)
    rows = session.scalars(
        select(ServiceReplica.address)
        .join(Job, Job.id == ServiceReplica.job_id)
        .where(
            ServiceReplica.service_id == service.id,
            ServiceReplica.healthy.is_(True),
            ServiceReplica.address.is_not(None),
            Job.state == JobState.RUNNING,
        )
        .order_by(ServiceReplica.id)
    )
    return service, [a for a in rows if a]


def out(session: Session, service: InferenceService) -> ServiceOut:
    replicas = []
    for row in _replicas(session, service):
        job = session.get(Job, row.job_id)
        node = next((r.node for r in job.ranks if r.run == job.run), None) if job else None
        replicas.append(
            ReplicaOut(
                job_id=row.job_id,
                revision=row.revision,
                state=job.state.value if job else "gone",
                node=node,
                address=row.address,
                healthy=row.healthy,
                failures=row.failures,
                checked_at=row.checked_at,
            )
        )
    spec = service.spec
    return ServiceOut(
        name=service.name,
        project=service.project,
        user=service.user,
        replicas=service.replicas,
        ready=sum(r.healthy for r in replicas),
        revision=service.revision,
        restarts=service.restarts,
        message=service.message,
        model=spec.get("model"),
        environment=spec.get("environment"),
        gpus_per_replica=int(spec.get("gpus_per_node", 1)),
        health_path=service.health_path,
        endpoint=ENDPOINT.format(name=service.name),
        created_by=service.created_by,
        created_at=service.created_at,
        replica_list=replicas,
    )
