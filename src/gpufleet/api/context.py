"""What the app's routes share: settings, the session factory, the clock and the live channel hub."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.orm import Session, sessionmaker

from gpufleet.api.hub import ChannelHub
from gpufleet.api.service_proxy import ServiceProxy
from gpufleet.auth.identity import IdentityProvider
from gpufleet.auth.principal_cache import PrincipalCache
from gpufleet.auth.throttle import LoginThrottle
from gpufleet.core.clock import Clock
from gpufleet.core.config import Settings
from gpufleet.directory.oidc import OidcClient
from gpufleet.tasks.runner import TaskRunner
from gpufleet.workers.asset_loops import AssetLoops
from gpufleet.workers.directory_loops import DirectoryLoops
from gpufleet.workers.head_loops import HeadLoops
from gpufleet.workers.job_loops import JobLoops
from gpufleet.workers.monitoring_loops import MonitoringLoops


@dataclass
class HeadContext:
    settings: Settings
    sessions: sessionmaker[Session]
    clock: Clock
    hub: ChannelHub
    loops: HeadLoops
    monitoring: MonitoringLoops
    jobs: JobLoops
    identity: IdentityProvider
    throttle: LoginThrottle
    tasks: TaskRunner  # slow actions (bulk power, image sync, Ansible) run here, recorded as tasks
    services: ServiceProxy  # the /services/NAME/... proxy to inference services
    principals: PrincipalCache  # API tokens resolved a moment ago
    assets: AssetLoops | None = None  # the leader's asset pass (tests drive it by hand)
    ca_pem: str | None = None  # the CA agents pin when the head serves TLS (see core.tls)
    ca_fingerprint: str | None = None
    directory: DirectoryLoops | None = None  # the directory's sync, where identity_provider is ldap
    oidc: OidcClient | None = None  # single sign-on's provider, where oidc_issuer is set
