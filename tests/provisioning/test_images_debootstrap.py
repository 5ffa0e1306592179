"""A real image: debootstrap --variant=minbase of Debian bookworm from deb.debian.org, then one small
package installed into it with chroot + apt, both as tasks through the API (about two minutes: the
one slow test of images; SQLite only, the database is not what it tests)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.api.app import create_app
from gpufleet.auth import service as auth
from gpufleet.core.clock import FakeClock
from gpufleet.core.config import load_settings
from gpufleet.core.db import transaction
from tests.conftest import need
from tests.provisioning.images_helpers import sqlite_sessions
from tests.services import install_tools

__all__ = ["sqlite_sessions"]
pytestmark = pytest.mark.debootstrap
MIRROR = os.environ.get("GPUFLEET_IMAGE_MIRROR", "http://deb.debian.org/debian")


def _ready() -> None:
    """debootstrap installed (scripts/services/images.sh), root for chroot, and the mirror answering."""
    if os.geteuid() != 0:
        need("debootstrap", "debootstrap and chroot need root")
    install_tools(("debootstrap",), "images.sh")
    try:
        httpx.head(f"{MIRROR}/dists/bookworm/Release", timeout=10, follow_redirects=True).raise_for_status()
    except httpx.HTTPError as exc:
        need("debootstrap", f"the mirror {MIRROR} does not answer: {exc}")


@pytest.fixture
def head(sqlite_sessions: sessionmaker[Session], tmp_path: Path) -> Iterator[TestClient]:
    _ready()
    clock = FakeClock()
    with transaction(sqlite_sessions) as s:
        token = auth.ensure_admin_token(s, clock, None)
    settings = load_settings(client_file=tmp_path / "none.toml", data_dir=tmp_path, image_mirror=MIRROR)
    app = create_app(settings, sqlite_sessions, clock, run_loops=False)
    with TestClient(app, headers={"Authorization": f"Bearer {token}"}) as client:
        yield client


def _finished(client: TestClient, answer: Any, timeout_s: float) -> dict[str, Any]:
    assert answer.status_code == 202, answer.text
    client.app.state.ctx.tasks.wait(answer.json()["id"], timeout_s)  # type: ignore[attr-defined]
    task: dict[str, Any] = client.get(f"/api/v1/tasks/{answer.json()['id']}").json()
    assert task["state"] == "succeeded", task
    return task


def test_debootstrap_an_image_and_install_a_package_into_it(heavy: None, head: TestClient, tmp_path: Path) -> None:
    _finished(head, head.post("/api/v1/images", json={"name": "bookworm", "debootstrap": "bookworm"}), 600)
    root = tmp_path / "images" / "bookworm"
    assert "bookworm" in (root / "etc" / "os-release").read_text()
    assert (root / "usr" / "bin" / "apt-get").exists()
    task = _finished(head, head.post("/api/v1/images/bookworm/install", json={"packages": ["hello"]}), 300)
    hello = subprocess.run(["chroot", str(root), "hello"], capture_output=True, text=True, timeout=30, check=True)
    assert hello.stdout == "Hello, world!\n"
    assert not (root / "usr" / "sbin" / "policy-rc.d").exists()
    assert not list((root / "var" / "cache" / "apt" / "archives").glob("*.deb"))  # apt-get clean
    shown = head.get("/api/v1/images/bookworm").json()
    assert shown["source"] == f"debootstrap bookworm {MIRROR}"
    assert [(r["number"], r["change"], r["task_id"]) for r in shown["history"]] == [
        (2, "installed hello", task["id"]),
        (1, f"created from debootstrap bookworm {MIRROR}", task["id"] - 1),
    ]
    assert shown["files"] > 5000
