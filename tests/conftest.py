"""Shared fixtures: a migrated database on SQLite and on PostgreSQL, a fake clock, service gating.

PostgreSQL is started once per test run (scripts/services/postgres.sh, under a file lock so that
xdist workers share it) and stopped after it, unless it was running before; each worker gets its own
database. Where PostgreSQL is not installed the tests skip with the reason, unless
GPUFLEET_REQUIRE_SERVICES=1 (CI), which turns that skip into a failure.

Outside programs the same way (tests/services.py): a test that runs one, itself or through gpufleet's
code, is marked `@pytest.mark.requires_tool("rsync")` or calls `require_tool("rsync")`, and skips
naming the program and how to install it where it is not on PATH.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from fastapi.testclient import TestClient
from filelock import FileLock
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.api.app import create_app
from gpufleet.auth import service as auth
from gpufleet.core.clock import FakeClock
from gpufleet.core.config import load_settings
from gpufleet.core.db import make_engine, make_session_factory, transaction
from gpufleet.migrations import upgrade
from tests.services import SharedService, check_required_tools, need, register_marker

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def pytest_configure(config: pytest.Config) -> None:
    register_marker(config)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before any fixture runs: a test marked `requires_tool` skips when a program it names is missing."""
    check_required_tools(item)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """The DSN of a PostgreSQL server: $GPUFLEET_TEST_PG_DSN (left alone), or a throwaway one, stopped
    after the last test process using it is done if a test process started it (SharedService)."""
    explicit = os.environ.get("GPUFLEET_TEST_PG_DSN")
    if explicit:
        yield explicit
        return
    state = Path(os.environ.get("GPUFLEET_PG_STATE", "/tmp/gpufleet-test-postgres")).name  # postgres.sh's
    script = ROOT / "scripts" / "services" / "postgres.sh"
    server = SharedService(state, script, Path("/tmp") / "gpufleet-test-postgres.lock")
    result = server.start()
    if result.returncode != 0:
        need(
            "PostgreSQL", (result.stderr or result.stdout).strip().splitlines()[-1] if result.stderr else "start failed"
        )
    try:
        yield result.stdout.strip().splitlines()[-1]
    finally:
        server.release()


@pytest.fixture(scope="session")
def postgres_admin(postgres_server: str) -> Iterator[Engine]:
    engine = create_engine(postgres_server, isolation_level="AUTOCOMMIT")
    yield engine
    engine.dispose()


@pytest.fixture
def postgres_url(postgres_server: str, postgres_admin: Engine) -> Iterator[str]:
    """A fresh, empty database on the test server, dropped afterwards."""
    yield from _postgres_database(postgres_server, postgres_admin, template=None)


def _postgres_database(server: str, admin: Engine, template: str | None) -> Iterator[str]:
    """A new database on the test server (a copy of `template`, else empty) for one test, dropped after."""
    name = f"gf_{uuid.uuid4().hex[:12]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else "")))
    yield f"{server.rsplit('/', 1)[0]}/{name}"
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A database test runs on SQLite and on PostgreSQL, unless it is marked `one_database` (its module
    usually is): a test whose subject sits above the database (HTTP translation, views, pure logic over
    rows) runs on SQLite alone, as long as the service tests beneath it run both. Each PostgreSQL run
    costs half a second more for its own database, and the suite must stay inside 20 minutes."""
    if "db_url" in metafunc.fixturenames:
        one = metafunc.definition.get_closest_marker("one_database") is not None
        metafunc.parametrize("db_url", BACKENDS[:1] if one else BACKENDS, indirect=True)


@pytest.fixture
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The test's database URL, SQLite or PostgreSQL (`pytest_generate_tests`). A PostgreSQL database a
    test reaches through `engine` is made as a copy of the migrated template at once: one CREATE, not an
    empty database dropped and made again (each costs the suite a fraction of a second, 300 times)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'gpufleet.db'}"
        return
    server: str = request.getfixturevalue("postgres_server")
    admin: Engine = request.getfixturevalue("postgres_admin")
    template = request.getfixturevalue("postgres_template") if "engine" in request.fixturenames else None
    yield from _postgres_database(server, admin, template)


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite database the migrations built once per worker. Each test's `engine` starts from a copy:
    running Alembic's 22 migrations costs about half a CPU-second a database, a copy a millisecond, and
    over a thousand tests that was minutes of the suite."""
    path = tmp_path_factory.mktemp("template") / "gpufleet.db"
    engine = make_engine(f"sqlite:///{path}")
    try:
        upgrade(engine)
    finally:
        engine.dispose()  # the last connection's close checkpoints the WAL into the main file...
    wal = path.with_name(path.name + "-wal")
    assert not wal.exists() or wal.stat().st_size == 0, "the template's WAL was not checkpointed"
    return path  # ...so copying the main file alone is enough


@pytest.fixture(scope="session")
def postgres_template(postgres_server: str, postgres_admin: Engine) -> Iterator[str]:
    """A PostgreSQL database the migrations built once per worker, for `CREATE DATABASE ... TEMPLATE`."""
    name = f"gf_template_{uuid.uuid4().hex[:12]}"
    with postgres_admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    engine = make_engine(f"{postgres_server.rsplit('/', 1)[0]}/{name}")
    try:
        upgrade(engine)
    finally:
        engine.dispose()  # a template must have no connections when it is copied
    yield name
    with postgres_admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture
def engine(db_url: str, request: pytest.FixtureRequest) -> Iterator[Engine]:
    """The test's database, migrated: a copy of the worker's template (see `sqlite_template`)."""
    copied = True
    if db_url.startswith("sqlite:///"):
        target = Path(db_url.removeprefix("sqlite:///"))
        copied = not target.exists()  # a test that wrote the file first gets it migrated in place
        if copied:
            shutil.copyfile(request.getfixturevalue("sqlite_template"), target)
    # A PostgreSQL `db_url` is already a copy of the migrated template when the test uses this fixture.
    engine = make_engine(db_url)
    if not copied:
        upgrade(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def sessions(engine: Engine) -> sessionmaker[Session]:
    return make_session_factory(engine)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def admin_token(sessions: sessionmaker[Session], clock: FakeClock) -> str:
    with transaction(sessions) as s:
        token = auth.ensure_admin_token(s, clock, None)
    assert token is not None
    return token


@pytest.fixture
def client(sessions: sessionmaker[Session], clock: FakeClock, tmp_path: Path, admin_token: str) -> Iterator[TestClient]:
    """The app on a migrated database, loops driven by hand (`client.app.state.ctx.loops`)."""
    settings = load_settings(
        client_file=tmp_path / "none.toml",
        data_dir=tmp_path,
        max_request_bytes=64 * 1024,
        image_import_dirs=[tmp_path],  # tests import image tarballs they write under tmp_path
    )
    app = create_app(settings, sessions, clock, run_loops=False)
    with TestClient(app, headers={"Authorization": f"Bearer {admin_token}"}) as test_client:
        yield test_client


MACHINE_LOCK = Path("/tmp") / "gpufleet-test-machine.lock"
TURNSTILE = Path("/tmp") / "gpufleet-test-machine.turnstile"


@pytest.fixture(autouse=True)
def _machine(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every test shares the machine; a test marked `alone` has it to itself across xdist workers.

    The 200-node join storm times liveness in seconds on two cores: with a Chromium test beside it (the
    heavy lock does not cover those) dozens of live nodes were marked down in CI, which measured the
    machine, not gpufleet. A shared lock per test and an exclusive one for `alone` tests; the turnstile
    keeps an `alone` test from waiting forever behind one test after another taking the shared lock.
    """
    alone = request.node.get_closest_marker("alone") is not None
    with TURNSTILE.open("a") as turnstile, MACHINE_LOCK.open("a") as machine:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(machine, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            if not alone:
                fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(machine, fcntl.LOCK_UN)
            if alone:
                fcntl.flock(turnstile, fcntl.LOCK_UN)


@pytest.fixture
def heavy() -> Iterator[None]:
    """One CPU-heavy test at a time across xdist workers (a 200-node join storm, a simulated job with a
    straggler, a head driven by many CLI processes, a debootstrap, a real Ansible run, 32 BMCs powered
    at once): on two cores, two of them together starve each other's heartbeats into false `down`
    transitions that measure the machine, not gpufleet."""
    with FileLock(str(Path("/tmp") / "gpufleet-test-heavy-e2e.lock")):
        yield


def cli_through(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """Point the CLI at the test app: its real HeadClient, each request answered by `client`."""
    import httpx

    from gpufleet.cli.state import CliState
    from gpufleet.client import HeadClient

    def forward(request: httpx.Request) -> httpx.Response:
        answer = client.request(
            request.method,
            request.url.path,
            params=request.url.params,
            content=request.content,
            headers={"content-type": request.headers.get("content-type", "application/json")},
        )
        return httpx.Response(answer.status_code, content=answer.content, headers=answer.headers)

    head = HeadClient("http://head", "t", transport=httpx.MockTransport(forward))
    monkeypatch.setattr(CliState, "client", lambda _self, *_a, **_k: head)


def alive(pid: int) -> bool:
    """Whether process `pid` still runs: a zombie (ended, not yet reaped by its parent) does not."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
