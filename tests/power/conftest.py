"""What the power tests share: fake BMCs, real ones (sushy-emulator, ipmi_sim) started once per
xdist worker on ports of its own, and a head app on SQLite with a real clock (BMCs take real time)."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.api.app import create_app
from gpufleet.auth import service as auth
from gpufleet.core.clock import SystemClock
from gpufleet.core.config import load_settings
from gpufleet.core.db import make_engine, make_session_factory, transaction
from gpufleet.migrations import upgrade
from gpufleet.power.ports import BmcError, BmcTarget, PowerState
from tests.conftest import ROOT, need
from tests.services import install_tools

SERVICES = ROOT / "scripts" / "services"
REDFISH_SYSTEMS = 36  # 1-32: the bulk power-on; 33: the single-system checks; 35-36: a power-off beside the bulk
REDFISH_ON = 2  # the last ones start on: 35 and 36
IPMI_BMCS = 2


def _worker_index(worker_id: str) -> int:
    return int(worker_id[2:]) if worker_id.startswith("gw") else 0


@dataclass
class FakeBmc:
    """A BMC whose power changes `lag` reads after it accepted an action (as real ones lag)."""

    state: PowerState = PowerState.OFF
    lag: int = 2
    fail: str | None = None  # every call raises BmcError with this
    stuck: bool = False  # accepts actions, never changes
    calls: list[tuple[str, float]] = field(default_factory=list)
    _pending: tuple[PowerState, int] | None = None
    fleet: FakeFleet | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _call(self, name: str) -> None:
        with self._lock:
            self.calls.append((name, time.monotonic()))
        if self.fail:
            raise BmcError(self.fail)

    def _will(self, state: PowerState) -> None:
        if not self.stuck:
            self._pending = (state, self.lag)

    def power_state(self) -> PowerState:
        self._call("power_state")
        if self._pending is not None:
            state, left = self._pending
            self._pending = (state, left - 1) if left > 0 else None
            if left <= 0:
                self.state = state
        return self.state

    def power_on(self) -> None:
        self._call("power_on")
        self._will(PowerState.ON)

    def power_off(self) -> None:
        self._call("power_off")
        self._will(PowerState.OFF)

    def power_cycle(self) -> None:
        self._call("power_cycle")
        self.state = PowerState.OFF
        self._will(PowerState.ON)

    def reset(self) -> None:
        self._call("reset")
        self._will(PowerState.ON)

    def close(self) -> None:
        if self.fleet is not None:
            self.fleet.closed()

    def actions(self) -> list[str]:
        return [name for name, _ in self.calls if name != "power_state"]


class FakeFleet:
    """Fake BMCs by address; `connect` is what the power service and the API are given."""

    def __init__(self) -> None:
        self.bmcs: dict[str, FakeBmc] = {}
        self.seen: list[BmcTarget] = []
        self._lock = threading.Lock()
        self._open = 0
        self.most_at_once = 0  # the most clients open at the same time

    def add(self, address: str, **kwargs: object) -> FakeBmc:
        bmc = self.bmcs[address] = FakeBmc(**kwargs)  # type: ignore[arg-type]
        bmc.fleet = self
        return bmc

    def connect(self, target: BmcTarget) -> FakeBmc:
        with self._lock:
            self.seen.append(target)
            self._open += 1
            self.most_at_once = max(self.most_at_once, self._open)
        return self.bmcs[target.address]

    def closed(self) -> None:
        with self._lock:
            self._open -= 1


@pytest.fixture
def fleet() -> FakeFleet:
    return FakeFleet()


def _service(script: str, command: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SERVICES / script), command],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, **env},
    )


@pytest.fixture(scope="session")
def redfish_url(worker_id: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """sushy-emulator's fake driver with REDFISH_SYSTEMS systems, one instance per xdist worker."""
    env = {
        "GPUFLEET_REDFISH_PORT": str(18100 + _worker_index(worker_id)),
        "GPUFLEET_REDFISH_SYSTEMS": str(REDFISH_SYSTEMS),
        "GPUFLEET_REDFISH_ON": str(REDFISH_ON),
        "GPUFLEET_SERVICES_RUN": str(tmp_path_factory.mktemp("redfish")),
    }
    started = _service("redfish.sh", "start", env)
    if started.returncode != 0:
        need("sushy-emulator", (started.stderr.strip() or started.stdout.strip() or "start failed").splitlines()[-1])
    try:
        yield started.stdout.strip().splitlines()[-1]
    finally:
        _service("redfish.sh", "stop", env)


def system_id(n: int) -> str:
    """The id of the emulator's n-th fake system (scripts/services/redfish.sh)."""
    return f"00000000-0000-4000-8000-{n:012d}"


@dataclass(frozen=True)
class IpmiBmcs:
    host: str
    base_port: int
    state_dir: Path

    def power_file(self, n: int) -> Path:
        return self.state_dir / f"ipmi-{self.base_port}" / f"bmc{n}" / "power"


@pytest.fixture(scope="session")
def ipmi_bmcs(worker_id: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[IpmiBmcs]:
    """OpenIPMI's ipmi_sim BMCs (admin / password), one set per xdist worker."""
    run_dir = tmp_path_factory.mktemp("ipmi")
    base = 19700 + 10 * _worker_index(worker_id)
    env = {
        "GPUFLEET_IPMI_BASE_PORT": str(base),
        "GPUFLEET_IPMI_BMCS": str(IPMI_BMCS),
        "GPUFLEET_SERVICES_RUN": str(run_dir),
    }
    install_tools(("ipmi_sim", "ipmitool"), "ipmi.sh")
    started = _service("ipmi.sh", "start", env)
    if started.returncode != 0:
        need("ipmi_sim", (started.stderr.strip() or started.stdout.strip() or "start failed").splitlines()[-1])
    try:
        yield IpmiBmcs("127.0.0.1", base, run_dir)
    finally:
        _service("ipmi.sh", "stop", env)


@pytest.fixture
def sqlite_sessions(tmp_path: Path) -> Iterator[sessionmaker[Session]]:
    """One backend is enough where the BMC, not the database, is under test."""
    engine = make_engine(f"sqlite:///{tmp_path / 'gpufleet.db'}")
    upgrade(engine)
    yield make_session_factory(engine)
    engine.dispose()


def make_head(sessions: sessionmaker[Session], data_dir: Path) -> TestClient:
    """The head's app on `sessions` with the system clock and an admin token; tasks run on real threads."""
    clock = SystemClock()
    with transaction(sessions) as s:
        token = auth.ensure_admin_token(s, clock, None)
    settings = load_settings(
        client_file=data_dir / "none.toml",
        data_dir=data_dir,
        power_stagger_s=0.0,
        power_confirm_timeout_s=30.0,
        bmc_timeout_s=5.0,
    )
    app = create_app(settings, sessions, clock, run_loops=False)
    return TestClient(app, headers={"Authorization": f"Bearer {token}"})


@pytest.fixture
def head(sqlite_sessions: sessionmaker[Session], tmp_path: Path) -> Iterator[TestClient]:
    with make_head(sqlite_sessions, tmp_path) as client:
        yield client
