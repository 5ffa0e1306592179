"""`make demo`'s terminal shows the banner and the head's events; the access log (a line per request, and
per agent channel its handshake and "connection open") goes to the data directory, never to the
terminal. `gpufleet server` keeps its access log where `access_log` says."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from gpufleet import demo
from gpufleet.api import server as head_server
from gpufleet.core.config import Settings, load_settings
from gpufleet.core.errors import ConfigError
from tests.e2e.conftest import free_port

ACCESS_LINES = ("WebSocket /api/v1/agent/channel", "connection open", "GET /healthz")


@pytest.fixture
def own_logging() -> Iterator[None]:
    """uvicorn's dictConfig and the demo's quieter loggers change process-wide state: put it back."""
    names = ["uvicorn", "uvicorn.error", "uvicorn.access", *demo._CHATTY]
    saved = {}
    for name in names:
        logger = logging.getLogger(name)
        saved[name] = (logger.level, list(logger.handlers), list(logger.filters), logger.propagate, logger.disabled)
    yield
    for name, (level, handlers, filters, propagate, disabled) in saved.items():
        logger = logging.getLogger(name)
        for handler in logger.handlers:
            if handler not in handlers:
                handler.close()
        logger.setLevel(level)
        logger.handlers[:] = handlers
        logger.filters[:] = filters
        logger.propagate, logger.disabled = propagate, disabled


def settings_for(tmp_path: Path, **options: Any) -> Settings:
    return load_settings(
        client_file=tmp_path / "none.toml", data_dir=tmp_path / "head", listen=f"127.0.0.1:{free_port()}", **options
    )


def visit(server: uvicorn.Server, settings: Settings) -> None:
    """Serve, make one request and open one agent channel (refused: it presents no credential), stop."""
    host, port = settings.listen_host_port()

    async def main() -> None:
        serving = asyncio.create_task(server.serve())
        while not server.started:
            assert not serving.done(), serving.result()
            await asyncio.sleep(0.01)
        async with httpx.AsyncClient() as http:
            (await http.get(f"http://{host}:{port}/healthz")).raise_for_status()
        async with connect(f"ws://{host}:{port}/api/v1/agent/channel") as channel:
            with pytest.raises(ConnectionClosed):
                await channel.recv()
        server.should_exit = True
        await serving

    asyncio.run(main())


@pytest.mark.usefixtures("own_logging")
def test_the_demo_keeps_access_lines_off_the_terminal(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    access = tmp_path / demo.ACCESS_LOG
    settings = settings_for(tmp_path, access_log=str(access))  # as run_demo sets it, at the default level
    assert settings.log_level == "INFO"
    visit(demo.demo_server(settings), settings)
    terminal = capfd.readouterr()
    for line in ACCESS_LINES:
        assert line not in terminal.err + terminal.out
        assert line in access.read_text()


@pytest.mark.usefixtures("own_logging")
def test_the_head_writes_its_access_log_to_stderr_by_default(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    settings = settings_for(tmp_path)
    server, _ = head_server.prepare(settings)
    visit(server, settings)
    terminal = capfd.readouterr().err
    for line in ACCESS_LINES:
        assert line in terminal


@pytest.mark.usefixtures("own_logging")
def test_an_access_log_turned_off_writes_none(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    settings = settings_for(tmp_path, access_log="off")
    server, _ = head_server.prepare(settings)
    visit(server, settings)
    terminal = capfd.readouterr().err
    assert "Uvicorn running" in terminal  # uvicorn's own lines stay
    for line in ACCESS_LINES:
        assert line not in terminal


def test_an_access_log_that_cannot_be_written_is_refused_with_one_line(tmp_path: Path) -> None:
    settings = settings_for(tmp_path, access_log=str(tmp_path / "no-such-dir" / "access.log"))
    with pytest.raises(ConfigError, match=r"cannot write the access log .*no-such-dir/access.log"):
        head_server.prepare(settings)
    assert not (tmp_path / "head").exists()  # refused before the data directory or database was touched
