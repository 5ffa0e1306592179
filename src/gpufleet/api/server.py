"""`gpufleet server`: migrate the database, make sure an admin can log in, serve until stopped."""

from __future__ import annotations

import asyncio
import logging

import uvicorn
from sqlalchemy.exc import OperationalError

from gpufleet.api.app import create_app
from gpufleet.auth import service as auth
from gpufleet.core import gc_tuning
from gpufleet.core.clock import SystemClock
from gpufleet.core.config import Settings
from gpufleet.core.db import make_engine, make_session_factory, transaction
from gpufleet.core.errors import ConfigError, Unavailable
from gpufleet.migrations import upgrade
from gpufleet.protocol.messages import MAX_CHANNEL_MESSAGE_BYTES

log = logging.getLogger(__name__)


def prepare(settings: Settings) -> tuple[uvicorn.Server, str | None]:
    """Everything before serving. Returns the server and, on first start, the admin token to print once."""
    try:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create the data directory {settings.data_dir}: {exc.strerror}") from None
    engine = make_engine(settings.effective_database_url)
    try:
        upgrade(engine)
    except OperationalError as exc:
        raise Unavailable(f"cannot reach the database: {exc.orig}") from None
    sessions = make_session_factory(engine)
    clock = SystemClock()
    bootstrap = settings.bootstrap_token.get_secret_value() if settings.bootstrap_token else None
    with transaction(sessions) as session:
        new_token = auth.ensure_admin_token(session, clock, bootstrap)
    app = create_app(settings, sessions, clock)
    host, port = settings.listen_host_port()
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        ws="websockets-sansio",
        ws_max_size=MAX_CHANNEL_MESSAGE_BYTES,
        ws_per_message_deflate=False,  # heartbeats are tiny; compression only costs CPU
        log_level=settings.log_level.lower(),
        access_log=False,
        timeout_graceful_shutdown=5,
    )
    return uvicorn.Server(config), new_token


def run(settings: Settings, announce: bool = True) -> None:
    server, token = prepare(settings)
    if token is not None and announce:
        print(f"Admin token (shown once, store it now): {token}", flush=True)
    gc_tuning.tune_for_long_running()
    asyncio.run(server.serve())
