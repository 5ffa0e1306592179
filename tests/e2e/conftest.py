"""Real gpufleet processes over loopback: a head node, a simulator, the CLI."""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text

GPUFLEET = [sys.executable, "-m", "gpufleet.entry"]
ADMIN = "gfa_e2e-admin-token-0123456789"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def base_env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
    env["GPUFLEET_CLIENT_CONFIG"] = str(tmp / "client.toml")  # never read the developer's own login
    env["GPUFLEET_LOG_LEVEL"] = "WARNING"
    return env


@dataclass
class Head:
    """One `gpufleet server` process."""

    tmp: Path
    database_url: str | None = None
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    tls: bool = False  # `gpufleet server init` first, then serve HTTPS
    env: dict[str, str] = field(default_factory=dict)  # extra settings, e.g. GPUFLEET_METRICS_INTERVAL_S
    agent_port: int | None = None  # agents served apart, by a channel process of their own (agent_listen)

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    @property
    def agent_url(self) -> str:
        """Where agents connect: the channel process's address, or the one `url`."""
        return (
            self.url if self.agent_port is None else f"{'https' if self.tls else 'http'}://127.0.0.1:{self.agent_port}"
        )

    @property
    def ca_file(self) -> Path:
        return self.tmp / "head" / "tls" / "ca.pem"

    @property
    def verify(self) -> ssl.SSLContext | bool:
        return ssl.create_default_context(cafile=str(self.ca_file)) if self.tls else True

    def start(self, wait: bool = True) -> Head:
        env = base_env(self.tmp) | {"GPUFLEET_BOOTSTRAP_TOKEN": ADMIN} | self.env
        if self.tls and not self.ca_file.exists():
            subprocess.run(
                [*GPUFLEET, "server", "init", "--data-dir", str(self.tmp / "head")], env=env, check=True, timeout=60
            )
        if self.database_url:
            env["GPUFLEET_DATABASE_URL"] = self.database_url
        log = (self.tmp / f"server-{self.port}.log").open("ab")
        self.proc = subprocess.Popen(
            [
                *GPUFLEET,
                "server",
                "--data-dir",
                str(self.tmp / "head"),
                "--listen",
                f"127.0.0.1:{self.port}",
                *(["--agent-listen", f"127.0.0.1:{self.agent_port}"] if self.agent_port else []),
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        if wait:
            try:
                self.wait_healthy()
            except BaseException:  # a head that never came up is no one's to stop later: stop it here
                self.kill(signal.SIGKILL)
                raise
        return self

    def wait_healthy(self, timeout: float = 30) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited: {self.log()}")
            try:
                response = httpx.get(self.url + "/healthz", timeout=2, verify=self.verify)
                if response.status_code == 200:
                    result: dict[str, Any] = response.json()
                    return result
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"server not healthy in {timeout}s: {self.log()}")

    def health(self) -> dict[str, Any]:
        result: dict[str, Any] = httpx.get(self.url + "/healthz", timeout=5, verify=self.verify).json()
        return result

    def log(self) -> str:
        return (self.tmp / f"server-{self.port}.log").read_text()[-3000:]

    def api(self, method: str, path: str, **kwargs: Any) -> Any:
        response = httpx.request(
            method,
            self.url + path,
            headers={"Authorization": f"Bearer {ADMIN}"},
            timeout=30,
            verify=self.verify,
            **kwargs,
        )
        response.raise_for_status()
        return response.json()

    def nodes(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.api("GET", "/api/v1/nodes")
        return result

    def join_token(self, uses: int) -> str:
        token: str = self.api("POST", "/api/v1/tokens/join", json={"expires_in_s": 600, "uses": uses})["token"]
        return token

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=30)


def lease_holder(db_url: str, lease: str = "head-leader") -> tuple[int, bool] | None:
    """Which head process holds `lease` (holders are host:pid:random): its pid, and whether the lease is
    still valid; None if nobody took it yet. Several head processes share one database (PostgreSQL)."""
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            query = text("SELECT holder, expires_at > now() FROM leases WHERE name = :name")
            row = conn.execute(query, {"name": lease}).first()
    finally:
        engine.dispose()
    return None if row is None else (int(row[0].split(":")[1]), bool(row[1]))


def start_sim(
    tmp: Path, server: str, join_token: str, nodes: int, *extra: str, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    log = (tmp / "sim.log").open("ab")
    return subprocess.Popen(
        [
            *GPUFLEET,
            "sim",
            "--server",
            server,
            "--join-token",
            join_token,
            "--nodes",
            str(nodes),
            "--state-dir",
            str(tmp / "sim"),
            *extra,
        ],
        env=base_env(tmp) | (env or {}),
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout: float = 30) -> None:
    """Ask a process to stop with `sig`; kill it if it has not within `timeout` seconds."""
    proc.send_signal(sig)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def wait_for(predicate: Any, timeout: float, interval: float = 0.1) -> float:
    """Poll until `predicate()` is true; returns the seconds it took. Fails the test on timeout."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if predicate():
            return time.monotonic() - start
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s")


def run_cli(
    tmp: Path,
    *args: str,
    server: str | None = None,
    token: str | None = ADMIN,
    stdin: str | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """`gpufleet ARGS` with the test's own client file; `stdin` is typed in, `env` added to the environment."""
    prefix = [*GPUFLEET]
    if server:
        prefix += ["--server", server]
    if token:
        prefix += ["--token", token]
    return subprocess.run(
        [*prefix, *args],
        input=stdin,
        env=base_env(tmp) | (env or {}),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def cli_json(tmp: Path, server: str, *args: str) -> Any:
    result = run_cli(tmp, *args, "-o", "json", server=server)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture
def head(tmp_path: Path) -> Iterator[Head]:
    h = Head(tmp_path).start()
    yield h
    h.kill(signal.SIGTERM)
