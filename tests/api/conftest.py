from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.api.app import create_app
from gpufleet.auth import service as auth
from gpufleet.core.clock import FakeClock
from gpufleet.core.config import load_settings
from gpufleet.core.db import transaction


@pytest.fixture
def admin_token(sessions: sessionmaker[Session], clock: FakeClock) -> str:
    with transaction(sessions) as s:
        token = auth.ensure_admin_token(s, clock, None)
    assert token is not None
    return token


@pytest.fixture
def client(sessions: sessionmaker[Session], clock: FakeClock, tmp_path: Path, admin_token: str) -> Iterator[TestClient]:
    """The app on a migrated database, loops driven by hand (`client.app.state.ctx.loops`)."""
    settings = load_settings(client_file=tmp_path / "none.toml", data_dir=tmp_path, max_request_bytes=64 * 1024)
    app = create_app(settings, sessions, clock, run_loops=False)
    with TestClient(app, headers={"Authorization": f"Bearer {admin_token}"}) as test_client:
        yield test_client
