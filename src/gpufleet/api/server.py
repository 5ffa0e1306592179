"""`gpufleet server`: migrate the database, make sure an admin can log in, serve until stopped.

With `workers` > 1 (PostgreSQL only), that many head processes serve the one listening socket: the
parent migrates, installs the admin token and binds the socket, then uvicorn's supervisor starts the
processes and starts a new one when one dies. Each is a full head replica: the kernel spreads the agents'
channels and the API's connections over them, each flushes its own nodes' heartbeats, and the
leadership lease lets exactly one run the singleton loops (the sweep, the scheduler, the roll-ups).

The access log (a line per HTTP request and per WebSocket opened or closed: every agent's channel) goes
to stderr, to a file, or nowhere (the `access_log` setting); uvicorn's other records go to stderr in
gpufleet's format (`log_config`).

With `agent_listen` the time-critical path gets a process of its own: one channel process serves the
agents on that address (their channels, heartbeat flush, the sweep, health verdicts) and `workers` API
processes serve `listen`, all on the one database (SQLite too, with one API process), so API load
never delays a heartbeat (head_loops.Role).
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import ssl
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker
from uvicorn.config import STARTUP_FAILURE
from uvicorn.supervisors import Multiprocess
from uvicorn.supervisors.multiprocess import Process

from gpufleet.api.app import create_app
from gpufleet.auth import service as auth
from gpufleet.core import gc_tuning, logs, orphans, tls
from gpufleet.core.clock import SystemClock
from gpufleet.core.config import Settings
from gpufleet.core.db import make_engine, make_session_factory, transaction
from gpufleet.core.errors import ConfigError, Unavailable
from gpufleet.migrations import upgrade
from gpufleet.protocol.messages import MAX_CHANNEL_MESSAGE_BYTES
from gpufleet.workers.head_loops import Role

log = logging.getLogger(__name__)
API_NICENESS = 10  # added to the API processes' nice value where a channel process serves the agents
ACCESS_TO_STDERR = "-"
ACCESS_OFF = "off"
ACCESS_FORMAT = "%(asctime)s %(message)s"
_WEBSOCKET_CODE = f"{os.sep}websockets{os.sep}"  # uvicorn.protocols.websockets and the websockets package


class ConnectionLines(logging.Filter):
    """uvicorn's error logger carries, at INFO, a WebSocket's handshake ("WebSocket /api/v1/agent/channel"
    [accepted]) and the websockets package's "connection open" and "connection closed": access records,
    two or three for every agent that connects. They go to the access log, with the HTTP requests."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.INFO and _WEBSOCKET_CODE in record.pathname:
            logging.getLogger("uvicorn.access").handle(record)
            return False
        return True


def check_access_log(destination: str) -> str:
    """`-` (stderr), `off`, or a file the access log is appended to, made absolute (the head's
    processes write it too). Raises ConfigError when the file cannot be written."""
    if destination in (ACCESS_TO_STDERR, ACCESS_OFF):
        return destination
    path = Path(destination).expanduser().absolute()
    try:
        path.open("a").close()
    except OSError as exc:
        raise ConfigError(f"cannot write the access log {path}: {exc.strerror}") from None
    return str(path)


def log_config(level: str, access_log: str = ACCESS_TO_STDERR, uvicorn_level: str | None = None) -> dict[str, Any]:
    """uvicorn's logging (logging.config.dictConfig): its records to stderr in gpufleet's format at
    `uvicorn_level` (default `level`), the access log to `access_log` (see `check_access_log`). On stderr
    the access log follows `level`, as the rest of the terminal does; a file gets every line."""
    terminal = {"class": "logging.StreamHandler", "formatter": "gpufleet", "stream": "ext://sys.stderr"}
    handlers: dict[str, dict[str, Any]] = {"terminal": {**terminal, "level": uvicorn_level or level}}
    if access_log == ACCESS_TO_STDERR:
        handlers["access"] = {**terminal, "formatter": "access", "level": level}
    elif access_log != ACCESS_OFF:
        handlers["access"] = {"class": "logging.handlers.WatchedFileHandler", "formatter": "access"}
        handlers["access"]["filename"] = access_log  # WatchedFileHandler: logrotate may move it
    access = "access" in handlers
    floor = logging.getLevelNamesMapping()[level.upper()]
    if access and access_log != ACCESS_TO_STDERR:  # a file takes them at any level: INFO records must be made
        floor = min(floor, logging.INFO)
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"gpufleet": {"format": logs.FORMAT}, "access": {"format": ACCESS_FORMAT}},
        "filters": {"connections": {"()": ConnectionLines}},
        "handlers": handlers,
        "loggers": {
            "uvicorn": {"handlers": ["terminal"], "level": level, "propagate": False},
            "uvicorn.error": {"level": floor, "filters": ["connections"]},
            "uvicorn.access": {"handlers": ["access"] if access else [], "level": floor, "propagate": False},
        },
    }


def prepare(settings: Settings, uvicorn_level: str | None = None) -> tuple[uvicorn.Server, str | None]:
    """Everything before serving; uvicorn's own records at `uvicorn_level` (default: `log_level`).
    Returns the server and, on first start, the admin token to print once. Raises ConfigError for an
    access log that cannot be written (see `check_access_log`)."""
    sessions, new_token = _set_up(settings)
    app = create_app(settings, sessions, SystemClock())
    return uvicorn.Server(_config(settings, app, uvicorn_level=uvicorn_level)), new_token


def _set_up(settings: Settings) -> tuple[sessionmaker[Session], str | None]:
    """Check the addresses and the access log, migrate the database, install the admin token. Returns
    the sessions and, on first start, the token."""
    check_access_log(settings.access_log)
    served_tls = settings.effective_tls()
    scheme = "https" if served_tls else "http"
    for address in (settings.listen, settings.agent_listen):
        if address is not None:
            host, port = settings.listen_host_port(address)
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


def _config(
    settings: Settings,
    app: Any,
    workers: int = 1,
    address: str | None = None,
    uvicorn_level: str | None = None,
) -> uvicorn.Config:
    """uvicorn's configuration for serving `app` on `address` (default `listen`): an app, or where
    several processes serve (`workers` > 1 or a split head) a picklable factory of one. Raises
    ConfigError for TLS files or an access log the head cannot use."""
    access_log = check_access_log(settings.access_log)
    host, port = settings.listen_host_port(address)
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
        log_config=log_config(settings.log_level, access_log, uvicorn_level),
        log_level=None,  # the levels are log_config's
        access_log=access_log != ACCESS_OFF,
        timeout_graceful_shutdown=5,
        ssl_certfile=certfile,
        ssl_keyfile=keyfile,
        workers=workers,
        factory=not isinstance(app, FastAPI),
    )


def worker_app(settings: Settings, role: Role = Role.ALL) -> FastAPI:
    """One of several head processes (called in the process, by uvicorn): the app over the database
    the parent migrated. A spawned process starts with no logging set up: it gets the parent's. It ends
    with its supervisor, even one killed with SIGKILL (`core.orphans`)."""
    logs.configure(settings.log_level)
    orphans.end_with_parent()
    if role is Role.API:
        # The kernel, not the API's load, decides how much CPU the channel process gets: with the API's
        # processes niced, a heartbeat never waits behind a page or a list (measured: docs/benchmarks.md).
        os.nice(API_NICENESS)
    sessions = make_session_factory(make_engine(settings.effective_database_url))
    app = create_app(settings, sessions, SystemClock(), role=role)
    gc_tuning.tune_for_long_running()
    return app


class _Supervisor(Multiprocess):
    """uvicorn's supervisor over processes of different kinds: each slot is a configuration and its
    sockets, and a process that dies is replaced by a new one of its slot."""

    def __init__(self, slots: list[tuple[uvicorn.Config, list[socket.socket]]]) -> None:
        super().__init__(slots[0][0], [s for _, sockets in slots for s in sockets])
        self.slots = slots
        self.processes_num = len(slots)

    def init_processes(self) -> None:
        for config, sockets in self.slots:
            process = Process(config, sockets)
            process.start()
            self.processes.append(process)

    def keep_subprocess_alive(self) -> None:
        for index, process in enumerate(self.processes):
            if self.should_exit.is_set():
                return
            config, sockets = self.slots[index]
            if process.is_alive(timeout=config.timeout_worker_healthcheck):
                continue
            process.kill()  # hung, or already gone
            process.join()
            if process.exitcode == STARTUP_FAILURE:  # it would fail the same way again
                log.error("head process %s failed to start; stopping", process.pid)
                self.should_exit.set()
                return
            log.warning("head process %s died; starting another", process.pid)
            self.processes[index] = Process(config, sockets)
            self.processes[index].start()

    def restart_all(self) -> None:
        """SIGHUP: replace every process with a new one of its slot, one after the other."""
        for index, old in enumerate(self.processes):
            if self.should_exit.is_set():
                return
            config, sockets = self.slots[index]
            new = Process(config, sockets)
            new.start()
            if not new.wait_until_ready(config.timeout_worker_healthcheck, self.should_exit):
                new.kill()
                new.join()
                return
            old.terminate()
            old.join()
            self.processes[index] = new


def _run_processes(settings: Settings, announce: bool) -> None:
    """Several head processes, each restarted when it dies: `workers` replicas behind `listen`, or with
    `agent_listen` one channel process there and `workers` API processes behind `listen`. Raises
    ConfigError where SQLite would have several writers' worth of processes."""
    split = settings.agent_listen is not None
    if settings.workers > 1 and make_url(settings.effective_database_url).get_backend_name() != "postgresql":
        raise ConfigError(
            f"workers = {settings.workers} needs PostgreSQL (database_url): SQLite serves one head process"
            + (" (and, with agent_listen, its channel process)" if split else "")
        )
    if split and settings.agent_listen == settings.listen:
        raise ConfigError("agent_listen must be another address than listen")
    sessions, token = _set_up(settings)
    sessions.kw["bind"].dispose()  # the processes open their own connections
    if token is not None and announce:
        print(f"Admin token (shown once, store it now): {token}", flush=True)
    # The settings travel to each process pickled, as the plain `Settings` (load_settings' is a local class).
    plain = Settings.model_construct(_fields_set=settings.model_fields_set, **dict(settings))
    if not split:
        config = _config(settings, functools.partial(worker_app, plain), settings.workers)
        Multiprocess(config, sockets=[config.bind_socket()]).run()
        return
    channels = _config(settings, functools.partial(worker_app, plain, Role.CHANNELS), address=settings.agent_listen)
    api = _config(settings, functools.partial(worker_app, plain, Role.API))
    api_socket = api.bind_socket()
    slots = [(channels, [channels.bind_socket()])] + [(api, [api_socket])] * settings.workers
    _Supervisor(slots).run()


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def run(settings: Settings, announce: bool = True) -> None:
    """Serve until stopped. Raises ConfigError for settings the head cannot serve with."""
    if settings.workers > 1 or settings.agent_listen is not None:
        _run_processes(settings, announce)
        return
    server, token = prepare(settings)
    if token is not None and announce:
        print(f"Admin token (shown once, store it now): {token}", flush=True)
    gc_tuning.tune_for_long_running()
    server.run()  # on uvloop where installed, like the processes of `--workers N`
