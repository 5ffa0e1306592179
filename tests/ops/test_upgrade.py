"""Upgrades (issue 28, part 5): a database made by an old gpufleet, with real rows as that schema held
them, upgrades to this gpufleet's schema with every row intact and is served by the API; `gpufleet server
--check-upgrade` says what will run and changes nothing; a database newer than this gpufleet is refused.

The old schema is migration 0010's (the release that brought Slurm, commit 6536516), built two ways:
by this tree's migrations stopped at 0010 (`upgrade(engine, "0010")`, on both databases), and, where the
repository's history is at hand, by the migration files of that commit themselves (SQLite).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.config import Config
from fastapi.testclient import TestClient
from sqlalchemy import Engine, MetaData, text
from typer.testing import CliRunner

from gpufleet.api.app import create_app
from gpufleet.auth import service as auth
from gpufleet.auth.passwords import hash_password
from gpufleet.core.clock import FakeClock
from gpufleet.core.config import load_settings
from gpufleet.core.db import make_engine, make_session_factory, transaction
from gpufleet.core.secrets import hash_token
from gpufleet.migrations import upgrade
from gpufleet.migrations.status import SchemaTooNew, migrations, newest, schema_status
from gpufleet.ops.upgrade import check

ROOT = Path(__file__).resolve().parents[2]
OLD = "0010"
OLD_COMMIT = "6536516"  # "Slurm as the workload manager", which added migration 0010
T0 = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)
ADMIN = "gfa_old-admin-token-0123456789abcdefghijklmnop"
ALICE_TOKEN = "gfa_old-alice-token-0123456789abcdefghijklmnop"
NODE_CREDENTIAL = "gfn_old-node-credential-0123456789abcdefghijkl"
PASSWORD = "an old password 42"


def _old_rows() -> dict[str, list[dict[str, Any]]]:
    """Rows as gpufleet at migration 0010 wrote them: two nodes (one drained) with GPUs and history, a
    user with a password and an SSH key, a project, tokens (admin, a user's, a node credential), a
    finished job with its ranks and output, a pending job, audit records."""
    h = timedelta(hours=1)
    node = {
        "state_since": T0,
        "created_at": T0 - 48 * h,
        "labels": {"rack": "r1"},
        "last_seen": T0,
        "heartbeat_interval_s": 1.0,
        "cpus": 96,
        "cpu_model": "AMD EPYC 9454",
        "memory_total_mib": 1_031_000,
        "os_name": "Ubuntu 22.04.4 LTS",
        "kernel": "5.15.0-101-generic",
        "arch": "x86_64",
        "agent_version": "0.0.9",
        "gpu_source": "nvml",
        "inventory_fingerprint": "ab" * 32,
        "inventory_at": T0 - h,
        "expected_gpus": 2,
        "health": "healthy",
        "health_reasons": [],
        "health_since": T0 - h,
    }
    gpu = {
        "model": "NVIDIA H100 80GB HBM3",
        "memory_total_mib": 81559,
        "driver_version": "550.54.15",
        "cuda_version": "12.4",
        "vbios_version": "96.00.89.00.01",
        "mig_mode": "disabled",
        "ecc_mode": "enabled",
        "compute_capability": "9.0",
        "power_limit_w": 700.0,
    }
    token = {"created_at": T0 - 24 * h, "uses": 0, "scope": "write"}
    job = {
        "submitted_by": "token:alice#2",
        "nodes": 1,
        "cpus_per_node": 0,
        "mem_per_node_mib": 0,
        "time_limit_s": 3600.0,
        "priority": 0,
        "env": {"EPOCHS": "3"},
        "requeue": False,
        "gpu_seconds": 0.0,
        "sampled_gpu_seconds": 0.0,
        "busy_gpu_seconds": 0.0,
        "output_chars": 0,
        "backend": "builtin",
    }
    return {
        "nodes": [
            {**node, "id": 1, "name": "old01", "state": "up", "category": "train", "hostname": "old01.lab"},
            {
                **node,
                "id": 2,
                "name": "old02",
                "state": "down",
                "category": "train",
                "hostname": "old02.lab",
                "health": "faulty",
                "health_reasons": ["gpu 1: Xid 79"],
                "drained_at": T0 - h,
                "drain_reason": "gpu 1: Xid 79",
                "drained_by": "gpufleet",
            },
        ],
        "gpus": [
            {**gpu, "node_id": n, "index": i, "uuid": f"GPU-{n}{i}000000-0000-0000-0000-000000000000"}
            | {"serial": f"165{n}{i}", "pci_bus_id": f"00000000:{0x18 + i:02X}:00.0"}
            for n in (1, 2)
            for i in (0, 1)
        ],
        "node_transitions": [
            {"node_id": 1, "at": T0 - 47 * h, "from_state": "new", "to_state": "up", "reason": "joined"},
            {"node_id": 2, "at": T0 - 2 * h, "from_state": "up", "to_state": "down", "reason": "no heartbeat"},
        ],
        "users": [
            {
                "id": 1,
                "username": "alice",
                "full_name": "Alice Liddell",
                "role": "member",
                "password_hash": hash_password(PASSWORD),
                "enabled": True,
                "uid": 2001,
                "gid": 2001,
                "shell": "/bin/bash",
                "ssh_keys": ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOld alice@laptop"],
                "created_at": T0 - 24 * h,
                "updated_at": T0 - 24 * h,
            }
        ],
        "projects": [
            {
                "id": 1,
                "name": "vision",
                "description": "image models",
                "max_gpus": 8,
                "gpu_hours_budget": 1000.0,
                "budget_period": "month",
                "created_at": T0 - 24 * h,
            }
        ],
        "project_members": [{"project_id": 1, "user_id": 1, "added_at": T0 - 24 * h}],
        "api_tokens": [
            {**token, "id": 1, "kind": "admin", "name": "bootstrap", "role": "admin", "token_hash": hash_token(ADMIN)},
            {
                **token,
                "id": 2,
                "kind": "admin",
                "name": "alice",
                "role": "member",
                "user_id": 1,
                "token_hash": hash_token(ALICE_TOKEN),
                "expires_at": T0 + 10_000 * h,
            },
            {
                **token,
                "id": 3,
                "kind": "node",
                "name": "old01",
                "role": "node",
                "node_id": 1,
                "token_hash": hash_token(NODE_CREDENTIAL),
            },
        ],
        "jobs": [
            {
                **job,
                "id": 1,
                "name": "train-resnet",
                "user": "alice",
                "project": "vision",
                "state": "completed",
                "reason": "",
                "gpus_per_node": 2,
                "argv": ["python", "train.py"],
                "run": 1,
                "allocation": {"old01": [0, 1]},
                "submitted_at": T0 - 3 * h,
                "started_at": T0 - 3 * h,
                "ended_at": T0 - 2 * h,
                "exit_code": 0,
                "gpu_seconds": 7200.0,
                "output_chars": 12,
            },
            {
                **job,
                "id": 2,
                "name": "eval",
                "user": "alice",
                "project": "vision",
                "state": "pending",
                "reason": "resources",
                "gpus_per_node": 8,
                "argv": ["python", "eval.py"],
                "run": 0,
                "submitted_at": T0 - h,
            },
        ],
        "job_ranks": [
            {
                "job_id": 1,
                "run": 1,
                "rank": 0,
                "node_id": 1,
                "node": "old01",
                "gpu_indexes": [0, 1],
                "gpu_uuids": ["GPU-10000000-0000-0000-0000-000000000000", "GPU-11000000-0000-0000-0000-000000000000"],
                "state": "exited",
                "outcome": "completed",
                "exit_code": 0,
                "message": "",
                "assigned_at": T0 - 3 * h,
                "started_at": T0 - 3 * h,
                "ended_at": T0 - 2 * h,
                "sent_at": T0 - 3 * h,
            }
        ],
        "job_output": [
            {
                "job_id": 1,
                "run": 1,
                "rank": 0,
                "stream": "stdout",
                "offset": 0,
                "data": "epoch 1 ok\n\n",
                "at": T0 - 2 * h,
            }
        ],
        "audit_records": [
            {
                "at": T0 - 3 * h,
                "actor": "token:alice#2",
                "action": "jobs.submit",
                "target": "job 1",
                "source": "10.0.0.5",
                "result": 201,
            }
        ],
    }


def _insert_old_rows(engine: Engine) -> None:
    """The rows, into the tables as the database holds them (reflected: a column 0010 lacked fails)."""
    rows = _old_rows()
    with engine.begin() as conn:
        tables = MetaData()
        tables.reflect(conn, only=list(rows))
        for name, values in rows.items():  # in dependency order
            for row in values:  # one at a time: the rows name different columns
                conn.execute(tables.tables[name].insert(), row)
        if conn.dialect.name == "postgresql":  # explicit ids: move the sequences past them, as inserts would
            for name in ("nodes", "users", "projects", "api_tokens", "jobs"):
                conn.execute(
                    text(f"SELECT setval(pg_get_serial_sequence('{name}', 'id'), (SELECT max(id) FROM {name}))")  # noqa: S608
                )


def _old_by_this_tree(engine: Engine, _tmp: Path) -> None:
    upgrade(engine, OLD)


def _old_by_the_old_commit(engine: Engine, tmp: Path) -> None:
    """The old release's own migration files (env.py and versions/ at OLD_COMMIT), run by Alembic."""
    if (
        shutil.which("git") is None
        or subprocess.run(
            ["git", "-C", str(ROOT), "cat-file", "-e", f"{OLD_COMMIT}^{{commit}}"], capture_output=True, check=False
        ).returncode
    ):
        pytest.skip(f"commit {OLD_COMMIT} is not in this checkout's history (a shallow clone?)")
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-tree", "-r", "--name-only", OLD_COMMIT, "src/gpufleet/migrations/"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    scripts = tmp / "old-migrations"
    for path in listed:
        if path.endswith((".py", ".mako")) and not path.endswith("migrations/__init__.py"):
            target = scripts / Path(path).relative_to("src/gpufleet/migrations")
            target.parent.mkdir(parents=True, exist_ok=True)
            shown = subprocess.run(
                ["git", "-C", str(ROOT), "show", f"{OLD_COMMIT}:{path}"], capture_output=True, check=True
            )
            target.write_bytes(shown.stdout)
    assert sorted(p.name for p in (scripts / "versions").glob("*.py"))[-1].startswith(OLD)
    config = Config()
    config.set_main_option("script_location", str(scripts))
    config.attributes["engine"] = engine
    command.upgrade(config, "head")


@pytest.fixture
def old_engine(db_url: str) -> Iterator[Engine]:
    """An empty database of the test's backend (the `engine` fixture's would be migrated already)."""
    engine = make_engine(db_url)
    yield engine
    engine.dispose()


def _serve(engine: Engine, tmp_path: Path) -> Iterator[TestClient]:
    settings = load_settings(client_file=tmp_path / "none.toml", data_dir=tmp_path / "head")
    app = create_app(settings, make_session_factory(engine), FakeClock(T0.timestamp() + 60), run_loops=False)
    with TestClient(app, headers={"Authorization": f"Bearer {ADMIN}"}) as client:
        yield client


def _upgrade_and_check(engine: Engine, tmp_path: Path) -> None:
    with engine.connect() as conn:
        before = schema_status(conn)
    assert before.current == OLD
    assert [m.revision for m in before.pending] == [m.revision for m in migrations()[10:]]
    assert before.pending[0].title.startswith("log records")

    upgrade(engine)  # what the head runs on start

    with engine.connect() as conn:
        after = schema_status(conn)
        counts = {t: conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one() for t in _old_rows()}  # noqa: S608
    assert after.current == newest()
    assert not after.upgrade_pending
    assert counts == {t: len(rows) for t, rows in _old_rows().items()}, "rows were lost by the upgrade"

    for api in _serve(engine, tmp_path):
        nodes = {n["name"]: n for n in api.get("/api/v1/nodes").json()}
        assert sorted(nodes) == ["old01", "old02"]
        assert nodes["old02"]["drain_reason"] == "gpu 1: Xid 79"
        old01 = api.get("/api/v1/nodes/old01").json()
        assert [(g["index"], g["model"], g["memory_total_mib"]) for g in old01["gpus"]] == [
            (0, "NVIDIA H100 80GB HBM3", 81559),
            (1, "NVIDIA H100 80GB HBM3", 81559),
        ]
        assert old01["category"] == "train"
        assert old01["labels"] == {"rack": "r1"}
        assert [t["reason"] for t in old01["transitions"]] == ["joined"]
        gpus = api.get("/api/v1/gpus").json()
        assert len(gpus) == 4
        # Migration 0016 made a category of every name nodes already used.
        assert [c["name"] for c in api.get("/api/v1/categories").json()] == ["train"]

        users = {u["username"]: u for u in api.get("/api/v1/users").json()}
        assert users["alice"]["uid"] == 2001
        assert users["alice"]["ssh_keys"] == ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOld alice@laptop"]
        login = api.post("/api/v1/login", json={"username": "alice", "password": PASSWORD})
        assert login.status_code == 201, login.text  # the old argon2 hash still verifies
        assert api.get("/api/v1/projects/vision").json()["members"] == ["alice"]

        mine = api.get("/api/v1/whoami", headers={"Authorization": f"Bearer {ALICE_TOKEN}"}).json()
        assert mine["user"] == "alice"
        assert mine["role"] == "member"
        jobs = {j["id"]: j for j in api.get("/api/v1/jobs", params={"state": ["completed", "pending"]}).json()}
        assert jobs[1]["state"] == "completed"
        assert jobs[2]["state"] == "pending"
        done = api.get("/api/v1/jobs/1").json()
        assert done["allocation"] == {"old01": [0, 1]}
        assert done["exit_code"] == 0
        assert [(r["node"], r["gpu_indexes"], r["outcome"]) for r in done["ranks"]] == [("old01", [0, 1], "completed")]
        assert [c["data"] for c in api.get("/api/v1/jobs/1/output").json()["chunks"]] == ["epoch 1 ok\n\n"]
        assert [r["action"] for r in api.get("/api/v1/audit").json()][-1:] == ["jobs.submit"]

    # The node's old credential still identifies it (its agent reconnects after the upgrade).
    with transaction(make_session_factory(engine)) as session:
        principal = auth.authenticate(session, FakeClock(T0.timestamp()), NODE_CREDENTIAL)
    assert principal.node_id == 1


def test_an_old_schema_with_rows_upgrades_and_serves(old_engine: Engine, tmp_path: Path) -> None:
    _old_by_this_tree(old_engine, tmp_path)
    _insert_old_rows(old_engine)
    _upgrade_and_check(old_engine, tmp_path)


@pytest.mark.one_database
def test_the_old_release_s_own_migrations_upgrade_too(old_engine: Engine, tmp_path: Path) -> None:
    _old_by_the_old_commit(old_engine, tmp_path)
    _insert_old_rows(old_engine)
    _upgrade_and_check(old_engine, tmp_path)


def _cli(*args: str) -> Any:
    import gpufleet.entry  # noqa: F401  (adds `server` and its commands to the CLI's app)
    from gpufleet.cli.app import app
    from gpufleet.cli.state import CliState

    return CliRunner().invoke(app, list(args), obj=CliState())


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_check_upgrade_says_what_will_run_and_changes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFLEET_CLIENT_CONFIG", str(tmp_path / "none.toml"))
    data_dir = tmp_path / "head"
    fresh = _cli("server", "--check-upgrade", "--data-dir", str(data_dir))
    assert fresh.exit_code == 1, fresh.output
    assert "no database yet" in fresh.output
    assert f"{len(migrations())} migration(s) will run" in fresh.output
    assert not data_dir.exists()  # not even the directory was made

    data_dir.mkdir()
    engine = make_engine(f"sqlite:///{data_dir / 'gpufleet.db'}")
    upgrade(engine, OLD)
    _insert_old_rows(engine)
    engine.dispose()
    database = data_dir / "gpufleet.db"
    before = _digest(database)
    pending = _cli("server", "--check-upgrade", "--data-dir", str(data_dir))
    assert pending.exit_code == 1, pending.output
    assert f"schema revision: {OLD}" in pending.output
    assert "0011  log records: every line the agents read" in pending.output
    as_json = _cli("server", "check-upgrade", "--data-dir", str(data_dir), "-o", "json")
    assert as_json.exit_code == 1
    report = json.loads(as_json.output)
    assert report["current"] == OLD
    assert report["upgrade_pending"]
    assert not report["newer_than_this_gpufleet"]
    assert report["pending"][0] == {"revision": "0011", "title": migrations()[10].title}
    assert _digest(database) == before, "the check wrote to the database"

    engine = make_engine(f"sqlite:///{database}")
    upgrade(engine)
    engine.dispose()
    done = _cli("server", "check-upgrade", "--data-dir", str(data_dir))
    assert done.exit_code == 0, done.output
    assert "up to date" in done.output


@pytest.mark.postgres
def test_check_upgrade_on_postgresql(postgres_url: str, tmp_path: Path) -> None:
    engine = make_engine(postgres_url)
    try:
        upgrade(engine, OLD)
        with_password = postgres_url.replace("://gpufleet@", "://gpufleet:s3cret@")  # the test server trusts
        settings = load_settings(client_file=tmp_path / "none.toml", data_dir=tmp_path, database_url=with_password)
        result = check(settings)
        assert result.exists
        assert result.status.current == OLD
        assert result.status.pending[0].revision == "0011"
        assert "s3cret" not in result.database
        with engine.connect() as conn:
            assert schema_status(conn).current == OLD  # unchanged
    finally:
        engine.dispose()


def _stamp_future(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '0999'"))


def test_a_database_newer_than_this_gpufleet_is_refused(engine: Engine) -> None:
    _stamp_future(engine)
    with pytest.raises(SchemaTooNew, match=r"schema revision 0999, newer than this gpufleet .* knows"):
        upgrade(engine)
    with engine.connect() as conn:
        status = schema_status(conn)
        assert status.newer
        assert status.current == "0999"
        assert not status.pending


@pytest.mark.one_database
def test_the_head_refuses_to_start_on_a_newer_database(
    tmp_path: Path, sqlite_template: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUFLEET_CLIENT_CONFIG", str(tmp_path / "none.toml"))
    from tests.e2e.conftest import GPUFLEET, base_env, free_port

    data_dir = tmp_path / "head"
    data_dir.mkdir()
    shutil.copyfile(sqlite_template, data_dir / "gpufleet.db")
    engine = make_engine(f"sqlite:///{data_dir / 'gpufleet.db'}")
    _stamp_future(engine)
    engine.dispose()
    before = _digest(data_dir / "gpufleet.db")
    checked = _cli("server", "--check-upgrade", "--data-dir", str(data_dir))
    assert checked.exit_code == 4, checked.output
    assert "newer than this gpufleet" in checked.output
    argv = [*GPUFLEET, "server", "--data-dir", str(data_dir)]
    served = subprocess.run(
        [*argv, "--listen", f"127.0.0.1:{free_port()}"],
        env=base_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert served.returncode == 4, served.stderr
    assert "gpufleet: error: the database is at schema revision 0999, newer than this gpufleet" in served.stderr
    assert "Traceback" not in served.stderr
    assert _digest(data_dir / "gpufleet.db") == before
