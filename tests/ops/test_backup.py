"""Backup and restore in process, on SQLite and PostgreSQL: a head's state with rows, its CA, its secrets
key and admin templates goes into one archive and back into a new data directory and an empty database,
whole or not at all. The real-process path (a running head with agents) is tests/e2e/test_backup_restore.py."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import stat
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from gpufleet.api.app import create_app
from gpufleet.api.pki import init_pki
from gpufleet.core.clock import FakeClock
from gpufleet.core.config import Settings, load_settings
from gpufleet.core.credentials import CredentialBox, head_box
from gpufleet.core.db import make_engine, make_session_factory
from gpufleet.core.errors import Conflict, InvalidInput, NotFound, Unavailable
from gpufleet.migrations.status import SchemaTooNew, newest
from gpufleet.ops import pgtools
from gpufleet.ops.backup import backup
from gpufleet.ops.manifest import MANIFEST
from gpufleet.ops.restore import read_manifest, restore

BUILTIN_TEMPLATE = Path(__file__).resolve().parents[2] / "src/gpufleet/jobs/template_files/accelerate.toml"
SECRET = "bmc-password-Ω"


def _settings(data_dir: Path, database_url: str | None, **extra: Any) -> Settings:
    """A head's settings; database_url None: SQLite under data_dir."""
    return load_settings(
        client_file=data_dir.parent / "none.toml", data_dir=data_dir, database_url=database_url, **extra
    )


@pytest.fixture
def head_state(client: TestClient, tmp_path: Path, db_url: str) -> Settings:
    """A head's data directory (tmp_path, where the `client` app keeps its SQLite database) with rows made
    through the API, a CA, a secrets key with a sealed secret, an admin job template and burn-in profile."""
    client.post("/api/v1/nodes", json={"names": ["gpu[01-03]"]}).raise_for_status()
    client.post("/api/v1/users", json={"username": "alice", "password": "correct horse 9"}).raise_for_status()
    client.post("/api/v1/projects", json={"name": "vision"}).raise_for_status()
    client.post("/api/v1/projects/vision/members", json={"user": "alice"}).raise_for_status()
    job = client.post(
        "/api/v1/jobs", json={"user": "alice", "project": "vision", "gpus_per_node": 0, "argv": ["sleep", "1"]}
    )
    job.raise_for_status()
    init_pki(tmp_path / "tls", ["localhost", "127.0.0.1"])
    settings = _settings(tmp_path, db_url)
    (tmp_path / "sealed.txt").write_text(head_box(settings).seal(SECRET))
    (tmp_path / "job-templates").mkdir()
    template = BUILTIN_TEMPLATE.read_text().replace('name = "accelerate"', 'name = "site-train"')
    (tmp_path / "job-templates" / "site-train.toml").write_text(template)
    (tmp_path / "burnin-profiles").mkdir(mode=0o750)
    (tmp_path / "burnin-profiles" / "README").write_text("site profiles\n")
    (tmp_path / "images").mkdir()  # software images are not backed up: listed as left out
    return settings


def _restore_target(request: pytest.FixtureRequest, db_url: str, tmp_path: Path) -> Settings:
    """Settings for a new head: a data directory of its own and, on PostgreSQL, a new empty database."""
    target = None if db_url.startswith("sqlite") else request.getfixturevalue("postgres_url")
    return _settings(tmp_path / "restored", target)


def _app_on(settings: Settings, token: str) -> Iterator[TestClient]:
    engine = make_engine(settings.effective_database_url)
    from gpufleet.migrations import upgrade

    upgrade(engine)  # as the head does on start
    app = create_app(settings, make_session_factory(engine), FakeClock(), run_loops=False)
    try:
        with TestClient(app, headers={"Authorization": f"Bearer {token}"}) as test_client:
            yield test_client
    finally:
        engine.dispose()


def test_a_backup_restores_into_a_new_head(
    head_state: Settings, admin_token: str, tmp_path: Path, db_url: str, request: pytest.FixtureRequest
) -> None:
    archive = tmp_path.parent / f"{tmp_path.name}-backup.tar.gz"
    result = backup(head_state, archive)
    assert stat.S_IMODE(archive.stat().st_mode) == 0o600
    manifest = result.manifest
    assert manifest.alembic_revision == newest()
    assert manifest.database == ("sqlite" if db_url.startswith("sqlite") else "postgresql")
    members = {e.member for e in manifest.entries}
    assert {
        "data/tls/ca.pem",
        "data/tls/ca.key",
        "data/tls/server.pem",
        "data/tls/server.key",
        "data/bmc.key",
        "data/job-templates/site-train.toml",
        "data/burnin-profiles/README",
        manifest.database_member,
    } <= members
    assert str(tmp_path / "images") in manifest.not_included
    assert read_manifest(archive) == manifest
    with tarfile.open(archive) as tar:
        assert tar.getnames()[0] == MANIFEST
        for entry in manifest.entries:
            if entry.kind == "file":
                data = tar.extractfile(entry.member).read()  # type: ignore[union-attr]
                assert hashlib.sha256(data).hexdigest() == entry.sha256

    target = _restore_target(request, db_url, tmp_path)
    restored = restore(target, archive)
    new = target.data_dir
    assert restored.pending == ()
    for name in ("tls/ca.pem", "tls/ca.key", "tls/server.pem", "tls/server.key", "bmc.key"):
        assert (new / name).read_bytes() == (tmp_path / name).read_bytes(), name
        assert stat.S_IMODE((new / name).stat().st_mode) == 0o600, name
    assert stat.S_IMODE((new / "burnin-profiles").stat().st_mode) == 0o750
    assert not (new / "images").exists()
    # The secrets key came along: what the old head sealed, the new one opens.
    assert CredentialBox.from_key_file(new / "bmc.key").open((tmp_path / "sealed.txt").read_text()) == SECRET

    for api in _app_on(target, admin_token):
        assert [n["name"] for n in api.get("/api/v1/nodes").json()] == ["gpu01", "gpu02", "gpu03"]
        assert "alice" in [u["username"] for u in api.get("/api/v1/users").json()]
        jobs = api.get("/api/v1/jobs").json()
        assert [(j["user"], j["project"]) for j in jobs] == [("alice", "vision")]
        listed = api.get("/api/v1/templates").json()
        assert "site-train" in [t["name"] for t in listed["templates"]], listed["problems"]
        login = api.post("/api/v1/login", json={"username": "alice", "password": "correct horse 9"})
        assert login.status_code == 201, login.text


def test_a_restore_refuses_a_target_that_is_not_empty_and_changes_nothing(
    head_state: Settings, tmp_path: Path, db_url: str, request: pytest.FixtureRequest
) -> None:
    archive = backup(head_state, tmp_path.parent / f"{tmp_path.name}-b.tar.gz").path
    target = _restore_target(request, db_url, tmp_path)
    target.data_dir.mkdir()
    (target.data_dir / "keep.txt").write_text("mine")
    with pytest.raises(Conflict, match="is not empty"):
        restore(target, archive)
    assert sorted(p.name for p in target.data_dir.iterdir()) == ["keep.txt"]
    assert sorted(p.name for p in target.data_dir.parent.iterdir() if ".restore-" in p.name) == []

    if db_url.startswith("sqlite"):
        # A SQLite database already where the target's database_url points
        elsewhere = tmp_path / "other.db"
        elsewhere.write_bytes(b"")
        with pytest.raises(Conflict, match="exists"):
            restore(_settings(tmp_path / "r2", f"sqlite:///{elsewhere}"), archive)
        assert not (tmp_path / "r2").exists()
    else:
        # A PostgreSQL database that holds anything at all
        shutil.rmtree(target.data_dir)
        engine = make_engine(target.effective_database_url)
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE leftover (x int)"))
        engine.dispose()
        with pytest.raises(Conflict, match=r"not empty \(1 tables.*public\.leftover"):
            restore(target, archive)
        assert not target.data_dir.exists()


@pytest.mark.one_database
def test_a_damaged_or_foreign_archive_is_refused(head_state: Settings, tmp_path: Path) -> None:
    archive = backup(head_state, tmp_path.parent / f"{tmp_path.name}-c.tar.gz").path
    target = _settings(tmp_path / "restored", None)

    damaged = _rewritten(
        archive, tmp_path / "damaged.tar.gz", lambda name, data: data[:-1] + b"X" if name == "data/tls/ca.pem" else data
    )
    with pytest.raises(InvalidInput, match=r"data/tls/ca\.pem does not match its checksum"):
        restore(target, damaged)
    assert not target.data_dir.exists()

    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(archive.read_bytes()[: archive.stat().st_size // 2])
    with pytest.raises(InvalidInput):
        restore(target, cut)
    assert not target.data_dir.exists()

    extra = _rewritten(archive, tmp_path / "extra.tar.gz", lambda name, data: data, add=("data/evil", b"x"))
    with pytest.raises(InvalidInput, match="which its manifest does not name"):
        restore(target, extra)

    escape = _rewritten(archive, tmp_path / "escape.tar.gz", lambda name, data: data, manifest_member="data/../../x")
    with pytest.raises(InvalidInput, match="not one a gpufleet backup holds"):
        restore(target, escape)

    plain = tmp_path / "plain.tar.gz"
    with tarfile.open(plain, "w:gz") as tar:
        info = tarfile.TarInfo("etc/passwd")
        tar.addfile(info, io.BytesIO(b""))
    with pytest.raises(InvalidInput, match="not a gpufleet backup"):
        restore(target, plain)
    with pytest.raises(InvalidInput, match="no backup at"):
        restore(target, tmp_path / "missing.tar.gz")
    assert not target.data_dir.exists()


@pytest.mark.one_database
def test_a_backup_from_a_newer_schema_is_refused(head_state: Settings, tmp_path: Path) -> None:
    archive = backup(head_state, tmp_path.parent / f"{tmp_path.name}-d.tar.gz").path

    def future(name: str, data: bytes) -> bytes:
        if name != MANIFEST:
            return data
        raw = json.loads(data)
        raw["alembic_revision"] = "0999"
        raw["gpufleet_version"] = "9.0.0"
        return json.dumps(raw).encode()

    newer = _rewritten(archive, tmp_path / "newer.tar.gz", future)
    target = _settings(tmp_path / "restored", None)
    with pytest.raises(SchemaTooNew, match=r"the backup is at schema revision 0999, newer than .*gpufleet 9\.0\.0"):
        restore(target, newer)
    assert not target.data_dir.exists()


@pytest.mark.one_database
def test_a_dry_run_checks_everything_and_writes_nothing(head_state: Settings, tmp_path: Path) -> None:
    backups = tmp_path.parent / f"{tmp_path.name}-backups"
    backups.mkdir()
    archive = backup(head_state, backups).path  # a directory: a new file named by host and time in it
    assert archive.parent == backups
    assert archive.name.startswith("gpufleet-backup-")
    assert archive.name.endswith("Z.tar.gz")
    target = _settings(tmp_path / "restored", None)
    result = restore(target, archive, dry_run=True)
    assert result.dry_run
    assert ("data/bmc.key", target.data_dir / "bmc.key") in result.files
    assert not target.data_dir.exists()
    assert [p for p in tmp_path.iterdir() if ".restore-" in p.name] == []


@pytest.mark.one_database
def test_files_outside_the_data_directory_go_where_the_new_head_looks(head_state: Settings, tmp_path: Path) -> None:
    """A secrets key kept elsewhere (bmc_key_file) is carried by its setting's name and restored where the
    restoring head's setting points, or at the default place in its data directory."""
    key = tmp_path.parent / f"{tmp_path.name}-etc" / "bmc.key"
    key.parent.mkdir()
    shutil.move(tmp_path / "bmc.key", key)
    settings = _settings(tmp_path, None, bmc_key_file=key)
    manifest = backup(settings, tmp_path.parent / f"{tmp_path.name}-f.tar.gz").manifest
    archive = tmp_path.parent / f"{tmp_path.name}-f.tar.gz"
    assert "settings/bmc_key_file" in {e.member for e in manifest.entries}
    assert "data/bmc.key" not in {e.member for e in manifest.entries}

    default = _settings(tmp_path / "r1", None)
    restore(default, archive)
    assert (default.data_dir / "bmc.key").read_bytes() == key.read_bytes()

    elsewhere = tmp_path / "r2-etc" / "secrets.key"
    moved = _settings(tmp_path / "r2", None, bmc_key_file=elsewhere)
    restore(moved, archive)
    assert elsewhere.read_bytes() == key.read_bytes()
    assert stat.S_IMODE(elsewhere.stat().st_mode) == 0o600
    assert not (moved.data_dir / "bmc.key").exists()
    with pytest.raises(Conflict):  # a restore never replaces a file
        restore(_settings(tmp_path / "r3", None, bmc_key_file=elsewhere), archive)
    assert not (tmp_path / "r3").exists()


def test_nothing_to_back_up_is_said_clearly(tmp_path: Path) -> None:
    with pytest.raises(NotFound, match="no database at"):
        backup(_settings(tmp_path / "nothing", None), tmp_path / "b.tar.gz")
    assert not (tmp_path / "b.tar.gz").exists()


@pytest.mark.postgres
def test_pg_dump_missing_is_said_clearly(postgres_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    with pytest.raises(Unavailable, match="pg_dump is not installed"):
        backup(_settings(tmp_path / "d", postgres_url), tmp_path / "b.tar.gz")
    assert list(tmp_path.iterdir()) == []
    assert pgtools.libpq("postgresql+psycopg://u:s%40cret@h:5/db?sslmode=require") == (
        "postgresql://u@h:5/db?sslmode=require",
        {"PGPASSWORD": "s@cret", "PGCONNECT_TIMEOUT": "15"},
    )


def _rewritten(
    archive: Path,
    out: Path,
    change: Any,
    *,
    add: tuple[str, bytes] | None = None,
    manifest_member: str | None = None,
) -> Path:
    """A copy of `archive` with each member's bytes passed through `change(name, data)`, optionally one
    more member, or the manifest naming one more member."""
    with tarfile.open(archive) as src, tarfile.open(out, "w:gz") as dst:
        for info in src.getmembers():
            data = src.extractfile(info).read() if info.isreg() else b""  # type: ignore[union-attr]
            if info.name == MANIFEST and manifest_member:
                raw = json.loads(data)
                raw["entries"].append({"member": manifest_member, "kind": "dir", "mode": "0700"})
                data = json.dumps(raw).encode()
            data = change(info.name, data) if info.isreg() else data
            info.size = len(data)
            dst.addfile(info, io.BytesIO(data) if info.isreg() else None)
        if add:
            info = tarfile.TarInfo(add[0])
            info.size = len(add[1])
            dst.addfile(info, io.BytesIO(add[1]))
    return out
