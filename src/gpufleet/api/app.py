"""The app factory: wires settings, database, loops and routers into one FastAPI application."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio.to_thread
from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from gpufleet import __version__
from gpufleet.api import errors
from gpufleet.api.audit import AuditMiddleware
from gpufleet.api.context import HeadContext
from gpufleet.api.deps import allow
from gpufleet.api.finite_json import FiniteJsonBodies
from gpufleet.api.hub import ChannelHub
from gpufleet.api.limits import BodySizeLimit
from gpufleet.api.routers import ansible, services
from gpufleet.api.routers import assets as assets_routes
from gpufleet.api.security_headers import SecurityHeaders
from gpufleet.api.served_routes import API_PREFIX, shared_routes
from gpufleet.api.service_proxy import ServiceProxy
from gpufleet.api.templates import STATIC_DIR, StaticFiles
from gpufleet.assets.evaluate import Evaluator
from gpufleet.assets.links import package_links
from gpufleet.auth.identity import IdentityProvider
from gpufleet.auth.policy import Permission
from gpufleet.auth.principal_cache import PrincipalCache
from gpufleet.auth.throttle import LoginThrottle
from gpufleet.core import tls
from gpufleet.core.clock import Clock, SystemClock
from gpufleet.core.config import Settings
from gpufleet.core.credentials import head_box
from gpufleet.core.db import transaction
from gpufleet.core.errors import ConfigError
from gpufleet.directory import settings as directory_settings
from gpufleet.jobs.workload import build as build_workload
from gpufleet.logs.forward import EventForwarder, parse_target
from gpufleet.logs.mining import MiningSettings, TemplateMining
from gpufleet.monitoring.dispatch import Notifications
from gpufleet.monitoring.health import HealthJudge
from gpufleet.monitoring.storage import StorageWatch
from gpufleet.monitoring.store import Retention
from gpufleet.monitoring.tracker import HealthTracker
from gpufleet.network.service import Thresholds
from gpufleet.protocol.software import MAX_SOFTWARE_BYTES
from gpufleet.protocol.topology import MAX_FABRIC_BYTES
from gpufleet.tasks.runner import TaskRunner
from gpufleet.workers.asset_loops import AssetLoops
from gpufleet.workers.burnin_loops import BurnInLoops
from gpufleet.workers.campaign_loops import CampaignLoops
from gpufleet.workers.directory_loops import DirectoryLoops
from gpufleet.workers.head_loops import HeadLoops, Role
from gpufleet.workers.job_loops import JobLoops
from gpufleet.workers.monitoring_loops import MonitoringLoops
from gpufleet.workers.network_loops import NetworkLoops

log = logging.getLogger(__name__)


@contextlib.asynccontextmanager
async def _serving(runner: TaskRunner, request_threads: int, proxy: ServiceProxy) -> AsyncIterator[None]:
    """Tasks a stopped head left unfinished are marked interrupted, now and every little while; ours get
    a moment to end at shutdown. Blocking request handlers get `request_threads` threads. The service
    proxy's connections close at shutdown."""
    # Starlette runs blocking handlers (joins, most API calls) in anyio's pool, 40 threads by default. In a
    # join storm 40 threads busy with Python work left the event loop so little of the GIL that heartbeats
    # sat unread for seconds and live nodes were marked down. The work is Python's, under one lock: a
    # second thread runs while the first waits for the database, and more only hand the lock round (each
    # statement releases it). Measured on PostgreSQL, 2 processes on 2 cores, 6 runs each interleaved: 4
    # threads a process took 257-401 job submissions a second at 3.7-6.1 ms of CPU each, 2 threads 368-459
    # at 3.6-4.5 ms. The agents' uploads and their channels' reports run on the same few threads
    # (api.routers.agent).
    anyio.to_thread.current_default_thread_limiter().total_tokens = request_threads
    runner.watch()
    try:
        yield
    finally:
        await asyncio.to_thread(runner.close)
        await proxy.close()


def _served_ca(settings: Settings) -> str | None:
    """The CA certificate join tokens pin, when the head serves TLS with one. Raises ConfigError if unreadable."""
    served = settings.effective_tls()
    if served is None or served[2] is None:
        return None
    try:
        return served[2].read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read the CA certificate {served[2]}: {exc.strerror}") from None


def _forwarder(settings: Settings) -> EventForwarder | None:
    if settings.log_forward_url is None:
        return None
    try:
        return EventForwarder(parse_target(settings.log_forward_url))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _add_middleware(app: FastAPI, settings: Settings) -> None:
    """The request's outer layers, the last added outermost: security headers, the audit record, the
    body size limit, then JSON bodies' numbers checked (on a body already bounded)."""
    bulk = {
        f"{API_PREFIX}/agent/software": MAX_SOFTWARE_BYTES,
        f"{API_PREFIX}/agent/fabric": MAX_FABRIC_BYTES,
        f"{API_PREFIX}/cve/advisories": assets_routes.MAX_ADVISORY_BATCH_BYTES,
        f"{API_PREFIX}/ansible/runs": ansible.MAX_RUN_BYTES,
        f"{API_PREFIX}/ansible/plans": ansible.MAX_RUN_BYTES,
    }
    app.add_middleware(FiniteJsonBodies)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_request_bytes, larger=bulk)
    app.add_middleware(AuditMiddleware)  # records even what the size limit refuses
    app.add_middleware(SecurityHeaders)  # outermost: every answer has them, the refusals above too


def _evaluator(settings: Settings) -> Evaluator:
    """The CVE evaluator with gpufleet's package links and the admin's. Raises ConfigError for a bad link."""
    try:
        return Evaluator(package_links(settings.package_links))
    except ValueError as exc:
        raise ConfigError(f"package_links: {exc}") from None


def _identity(
    settings: Settings, sessions: sessionmaker[Session], clock: Clock, is_leader: Callable[[], bool]
) -> tuple[IdentityProvider, DirectoryLoops | None]:
    """Who checks passwords, and where that is the LDAP directory, the leader's scheduled sync from it."""
    identity, ldap = directory_settings.identity(settings, sessions, clock)
    if ldap is None:
        return identity, None
    return identity, DirectoryLoops(
        sessions, clock, ldap.directory, ldap.mapping, settings.ldap_sync_interval_s, is_leader
    )


def _switches(
    settings: Settings,
    sessions: sessionmaker[Session],
    clock: Clock,
    is_leader: Callable[[], bool],
    notifications: Notifications,
) -> NetworkLoops:
    """The leader's SNMP polling of the registered switches."""
    return NetworkLoops(
        sessions=sessions,
        clock=clock,
        box=lambda: head_box(settings),
        interval_s=settings.switch_poll_interval_s,
        is_leader=is_leader,
        timeout_s=settings.snmp_timeout_s,
        retries=settings.snmp_retries,
        concurrency=settings.switch_poll_concurrency,
        thresholds=Thresholds(error_quiet_s=settings.switch_error_quiet_s),
        on_alerts=notifications.submit,
    )


def create_app(
    settings: Settings,
    sessions: sessionmaker[Session],
    clock: Clock | None = None,
    *,
    run_loops: bool = True,
    role: Role = Role.ALL,
) -> FastAPI:
    """Build the head node's app. With `run_loops`, the lifespan runs the background loops; `role` says
    which of them this process runs (head_loops.Role)."""
    clock = clock or SystemClock()
    hub = ChannelHub()
    workload, slurm = build_workload(settings, sessions, clock)
    notifications = Notifications(sessions, settings.external_url)
    forwarder = _forwarder(settings)
    monitoring = MonitoringLoops(
        sessions=sessions,
        clock=clock,
        judge=HealthJudge(
            tracker=HealthTracker(),
            workload=workload,
            metrics_interval_s=settings.metrics_interval_s,
            resume_after_rounds=settings.resume_after_healthy_samples,
            storage=StorageWatch(settings.storage_fill_alert_pct, settings.storage_latency_factor),
        ),
        is_leader=lambda: loops.leads,
        on_alerts=notifications.submit,
        retention=Retention(
            settings.metrics_raw_retention_s, settings.metrics_rollup_retention_s, settings.log_retention_s
        ),
        mining=TemplateMining(
            MiningSettings(
                settings.log_template_learning_s,
                settings.log_template_window_s,
                settings.log_template_burst_factor,
                settings.log_template_burst_min,
            )
        ),
        template_pass_s=settings.log_template_pass_s,
        forward=forwarder.submit if forwarder else None,
    )
    loops = HeadLoops(
        settings=settings,
        sessions=sessions,
        clock=clock,
        on_durable=hub.acknowledge,
        on_changes=monitoring.liveness_changed,
        role=role,
    )
    jobs = JobLoops(
        settings=settings,
        sessions=sessions,
        clock=clock,
        # Only inside the lease's validity, as the sweep: a stalled old leader must not schedule
        # alongside a new one.
        is_leader=lambda: loops.leads and clock.now() < loops.lease_valid_until,
        nodes_here=hub.node_ids,
        send=hub.send_threadsafe,
        slurm=slurm,
        on_alerts=notifications.submit,
    )
    assets = AssetLoops(
        sessions=sessions,
        clock=clock,
        is_leader=lambda: loops.leads,
        on_alerts=notifications.submit,
        interval_s=settings.cve_evaluate_interval_s,
        evaluator=_evaluator(settings),
    )
    burnins = BurnInLoops(
        sessions=sessions,
        clock=clock,
        workload=workload,
        is_leader=lambda: loops.leads and clock.now() < loops.lease_valid_until,
        user=settings.burnin_user,
        on_alerts=notifications.submit,
    )
    ca_pem = _served_ca(settings)
    identity, directory = _identity(settings, sessions, clock, lambda: loops.leads)
    principals = PrincipalCache(settings.auth_cache_s)
    principals.watch(sessions)
    ctx = HeadContext(
        ca_pem=ca_pem,
        ca_fingerprint=tls.fingerprint(ca_pem) if ca_pem else None,
        settings=settings,
        sessions=sessions,
        clock=clock,
        hub=hub,
        loops=loops,
        monitoring=monitoring,
        jobs=jobs,
        identity=identity,
        directory=directory,
        oidc=directory_settings.oidc_client(settings),
        throttle=LoginThrottle(clock),
        tasks=TaskRunner(sessions, clock),
        assets=assets,
        principals=principals,
        # The lookup reads `ctx` when called, once the context exists.
        services=ServiceProxy(
            lambda name, user, admin: services.lookup(ctx, name, user, admin), settings.service_proxy_timeout_s
        ),
    )
    # Maintenance campaigns' actions run as tasks on this head's runner, like the API's.
    campaigns = CampaignLoops(
        settings=settings,
        sessions=sessions,
        clock=clock,
        workload=workload,
        tasks=ctx.tasks,
        is_leader=lambda: loops.leads and clock.now() < loops.lease_valid_until,
    )

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        hub.bind(asyncio.get_running_loop())
        senders: list[Notifications | EventForwarder] = [notifications, *([forwarder] if forwarder else [])]
        for sender in senders:
            sender.bind(asyncio.get_running_loop())
        stop = asyncio.Event()
        runs = (
            (
                loops.run(stop),
                monitoring.run(stop),
                jobs.run(stop),
                assets.run(stop),
                burnins.run(stop),
                campaigns.run(stop),
                _switches(settings, sessions, clock, campaigns.is_leader, notifications).run(stop),
                *([directory.run(stop)] if directory is not None else []),
            )
            if run_loops
            else ()
        )
        tasks = [asyncio.create_task(run) for run in runs]
        try:
            async with _serving(ctx.tasks, settings.request_threads, ctx.services):
                yield
        finally:
            stop.set()
            for task in tasks:
                await task
            for sender in senders:
                await sender.close()

    app = FastAPI(
        title="gpufleet",
        version=__version__,
        lifespan=lifespan,
        openapi_url=None,  # served below, behind authentication like every API route
        docs_url=None,
        redoc_url=None,
    )
    app.state.ctx = ctx
    errors.install(app)

    before_static, after_static = shared_routes()
    app.router.routes.extend(before_static)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    app.router.routes.extend(after_static)

    @app.get("/api/openapi.json", include_in_schema=False, dependencies=[allow(Permission.API_SCHEMA)])
    def openapi() -> dict[str, Any]:
        return get_openapi(title=app.title, version=app.version, routes=app.routes)

    @app.get("/ca.pem", include_in_schema=False)
    def ca_certificate() -> Response:
        """The cluster CA, public by nature: agents check it against their join token's pin."""
        if ctx.ca_pem is None:
            return JSONResponse({"detail": "this head does not serve TLS with its own CA"}, status_code=404)
        return Response(ctx.ca_pem, media_type="application/x-pem-file")

    @app.get("/healthz", include_in_schema=False)
    def healthz(request: Request) -> JSONResponse:
        try:
            with transaction(sessions, readonly=True) as session:
                session.execute(text("SELECT 1"))
        except Exception:
            log.exception("health check: the database does not answer")
            return JSONResponse({"status": "error", "database": "unreachable"}, status_code=503)
        # This process's view: with several head processes (`workers`), the one that answered.
        return JSONResponse(
            {
                "status": "ok",
                "version": __version__,
                "role": str(role),
                "leader": loops.is_leader,
                "channels": len(hub),
                "pid": os.getpid(),
            }
        )

    _add_middleware(app, settings)
    return app
