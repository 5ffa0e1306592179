"""`gpufleet server`: migrate the database, make sure an admin can log in, serve until stopped."""

from __future__ import annotations

import asyncio
import logging
import ssl

import uvicorn
from sqlalchemy.exc import OperationalError

from gpufleet.api.app import create_app
from gpufleet.auth import service as auth
from gpufleet.core import gc_tuning, tls
from gpufleet.core.clock import SystemClock
from gpufleet.core.config import Settings
from gpufleet.core.db import make_engine, make_session_factory, transaction
from gpufleet.core.errors import ConfigError, Unavailable
from gpufleet.migrations import upgrade
from gpufleet.protocol.messages import MAX_CHANNEL_MESSAGE_BYTES

log = logging.getLogger(__name__)


def prepare(settings: Settings) -> tuple[uvicorn.Server, str | None]:
    """Everything before serving. Returns the server and, on first start, the admin token to print once."""
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
    clock = SystemClock()
    bootstrap = settings.bootstrap_token.get_secret_value() if settings.bootstrap_token else None
    with transaction(sessions) as session:
        new_token = auth.ensure_admin_token(session, clock, bootstrap)
    app = create_app(settings, sessions, clock)
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
        ssl_certfile=certfile,
        ssl_keyfile=keyfile,
    )
    return uvicorn.Server(config), new_token


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def run(settings: Settings, announce: bool = True) -> None:
    server, token = prepare(settings)
    if token is not None and announce:
        print(f"Admin token (shown once, store it now): {token}", flush=True)
    gc_tuning.tune_for_long_running()
    asyncio.run(server.serve())
