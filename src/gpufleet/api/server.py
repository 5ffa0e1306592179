"""`gpufleet server`: migrate the database, make sure an admin can log in, serve until stopped.

With `workers` > 1 (PostgreSQL only), that many head processes serve the one listening socket: the
parent migrates, installs the admin token and binds the socket, then uvicorn's supervisor starts the
processes and starts a new one when one dies. Each is a full head replica: the kernel spreads the agents'
channels and the API's connections over them, each flushes its own nodes' heartbeats, and the
leadership lease lets exactly one run the singleton loops (the sweep, the scheduler, the roll-ups).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import ssl
from typing import Any

import uvicorn
from fastapi import FastAPI
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker
from uvicorn.supervisors import Multiprocess

from gpufleet.api.app import create_app
from gpufleet.auth import service as auth
from gpufleet.core import gc_tuning, logs, tls
from gpufleet.core.clock import SystemClock
from gpufleet.core.config import Settings
from gpufleet.core.db import make_engine, make_session_factory, transaction
from gpufleet.core.errors import ConfigError, Unavailable
from gpufleet.migrations import upgrade
from gpufleet.protocol.messages import MAX_CHANNEL_MESSAGE_BYTES

log = logging.getLogger(__name__)


def prepare(settings: Settings) -> tuple[uvicorn.Server, str | None]:
    """Everything before serving. Returns the server and, on first start, the admin token to print once."""
    sessions, new_token = _set_up(settings)
    app = create_app(settings, sessions, SystemClock())
    return uvicorn.Server(_config(settings, app)), new_token


def _set_up(settings: Settings) -> tuple[sessionmaker[Session], str | None]:
    """Check the address, migrate the database, install the admin token. Returns the sessions and, on
    first start, the token."""
    host, port = settings.listen_host_port()
    served_tls = settings.effective_tls()
    scheme = "https" if served_tls else "http"
    tls.check_plain_http(f"{scheme}://{_url_host(host)}:{port}", settings.insecure_http)
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
    bootstrap = settings.bootstrap_token.get_secret_value() if settings.bootstrap_token else None
    with transaction(sessions) as session:
        new_token = auth.ensure_admin_token(session, SystemClock(), bootstrap)
    return sessions, new_token


def _config(settings: Settings, app: Any, workers: int = 1) -> uvicorn.Config:
    """uvicorn's configuration for `app` (an app, or with `workers` a picklable factory of one)."""
    host, port = settings.listen_host_port()
    served_tls = settings.effective_tls()
    certfile: str | None = None
    keyfile: str | None = None
    if served_tls is not None:
        cert, key, _ = served_tls
        for path in (cert, key):
            if not path.is_file():
                raise ConfigError(f"TLS file {path} does not exist; run `gpufleet server init` or fix tls_cert/tls_key")
        try:  # a mismatched or unreadable pair fails here with one line, not in uvicorn's traceback
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(f"cannot use the TLS certificate {cert} with key {key}: {exc}") from None
        certfile, keyfile = str(cert), str(key)
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        ws="websockets-sansio",
        ws_max_size=MAX_CHANNEL_MESSAGE_BYTES,
        ws_per_message_deflate=False,  # heartbeats are tiny; compression only costs CPU
        log_level=settings.log_level.lower(),
        access_log=False,
        timeout_graceful_shutdown=5,
        ssl_certfile=certfile,
        ssl_keyfile=keyfile,
        workers=workers,
        factory=workers > 1,
    )


def worker_app(settings: Settings) -> FastAPI:
    """One of `workers` head processes (called in the process, by uvicorn): the app over the database
    the parent migrated. A spawned process starts with no logging set up: it gets the parent's."""
    logs.configure(settings.log_level)
    app = create_app(settings, make_session_factory(make_engine(settings.effective_database_url)), SystemClock())
    gc_tuning.tune_for_long_running()
    return app


def _run_workers(settings: Settings, announce: bool) -> None:
    """`settings.workers` head processes behind one socket, restarted when one dies. Raises ConfigError on
    SQLite: it takes one writer at a time, and one head process is what the embedded mode is for."""
    if make_url(settings.effective_database_url).get_backend_name() != "postgresql":
        raise ConfigError(
            f"workers = {settings.workers} needs PostgreSQL (database_url): SQLite serves one head process"
        )
    sessions, token = _set_up(settings)
    sessions.kw["bind"].dispose()  # the processes open their own connections
    if token is not None and announce:
        print(f"Admin token (shown once, store it now): {token}", flush=True)
    # The settings travel to each process pickled, as the plain `Settings` (load_settings' is a local class).
    plain = Settings.model_construct(_fields_set=settings.model_fields_set, **dict(settings))
    config = _config(settings, functools.partial(worker_app, plain), settings.workers)
    Multiprocess(config, sockets=[config.bind_socket()]).run()


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def run(settings: Settings, announce: bool = True) -> None:
    if settings.workers > 1:
        _run_workers(settings, announce)
        return
    server, token = prepare(settings)
    if token is not None and announce:
        print(f"Admin token (shown once, store it now): {token}", flush=True)
    gc_tuning.tune_for_long_running()
    asyncio.run(server.serve())
