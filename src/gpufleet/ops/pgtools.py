"""PostgreSQL's own programs for backups: `pg_dump --format=custom` and `pg_restore` into an empty database.

They take the head's `database_url` as a libpq URI without its password; the password goes in
`PGPASSWORD`, never on a command line another user could read in `ps`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from sqlalchemy import Connection, text
from sqlalchemy.engine import URL, make_url

from gpufleet.core.errors import Conflict, GpufleetError, Unavailable


class ToolFailed(GpufleetError):
    """pg_dump or pg_restore ran and failed."""

    exit_code = 7


def libpq(url: str) -> tuple[str, dict[str, str]]:
    """The SQLAlchemy URL as a libpq URI without its password, and the environment that carries it."""
    parsed = make_url(url)
    env = {"PGPASSWORD": parsed.password} if parsed.password else {}
    bare = URL.create(  # `URL.set(password=None)` would keep the password
        "postgresql", parsed.username, None, parsed.host, parsed.port, parsed.database, parsed.query
    )
    uri = bare.render_as_string(hide_password=False)
    return uri, {**env, "PGCONNECT_TIMEOUT": "15"}


def require(program: str) -> str:
    """The path of one of PostgreSQL's client programs. Raises Unavailable when it is not installed."""
    found = shutil.which(program)
    if found is None:
        raise Unavailable(
            f"{program} is not installed (or not on PATH): install PostgreSQL's client programs, of the server's"
            " major version or later (Debian and Ubuntu: apt install postgresql-client; RHEL: dnf install postgresql)"
        )
    return found


def _run(argv: list[str], env: dict[str, str]) -> None:
    result = subprocess.run(argv, env={**os.environ, **env}, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        said = "\n".join((result.stderr or result.stdout).strip().splitlines()[-8:])
        raise ToolFailed(f"{Path(argv[0]).name} failed (exit {result.returncode}): {said}")


def dump(url: str, out: Path) -> None:
    """`pg_dump --format=custom` of the database at `url` into `out`: one consistent snapshot, taken while
    the head runs. Raises Unavailable without pg_dump, ToolFailed when it fails."""
    uri, env = libpq(url)
    _run([require("pg_dump"), "--format=custom", "--no-password", f"--file={out}", f"--dbname={uri}"], env)


def restore(url: str, dump_file: Path) -> None:
    """`pg_restore` of a custom-format dump into the (empty) database at `url`, in one transaction: it
    lands whole or not at all. Objects are owned by the restoring user, whoever owned them before.
    Raises Unavailable without pg_restore, ToolFailed when it fails (the database is left as it was)."""
    uri, env = libpq(url)
    argv = [require("pg_restore"), "--single-transaction", "--exit-on-error", "--no-owner", "--no-privileges"]
    _run([*argv, "--no-password", f"--dbname={uri}", str(dump_file)], env)


def user_relations(conn: Connection, limit: int = 5) -> tuple[int, list[str]]:
    """How many tables, views and sequences the database holds outside PostgreSQL's own schemas, and a
    few of their names."""
    rows = conn.execute(
        text(
            "SELECT n.nspname || '.' || c.relname FROM pg_catalog.pg_class c"
            " JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
            " WHERE c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')"
            " AND n.nspname NOT IN ('pg_catalog', 'information_schema')"
            " AND n.nspname NOT LIKE 'pg\\_toast%' AND n.nspname NOT LIKE 'pg\\_temp\\_%'"
            " ORDER BY 1"
        )
    ).scalars()
    names = list(rows)
    return len(names), names[:limit]


def check_empty(conn: Connection, where: str) -> None:
    """Raise Conflict unless the database holds no tables, views or sequences of its own."""
    count, names = user_relations(conn)
    if count:
        raise Conflict(
            f"the database {where} is not empty ({count} tables, views or sequences, e.g. {', '.join(names)}):"
            " a restore needs an empty one (CREATE DATABASE ... OWNER ...), and changes nothing here"
        )
