"""`gpufleet server --check-upgrade`: what starting this gpufleet's head would do to its database.

The database is opened read-only (SQLite) or only read (PostgreSQL): the check changes nothing, not
even a missing SQLite file (reported as "no database yet").
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from urllib.parse import quote

from sqlalchemy import Engine, create_engine
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError
from sqlalchemy.pool import NullPool

from gpufleet.core.config import Settings
from gpufleet.core.db import make_engine
from gpufleet.core.errors import ConfigError, Unavailable
from gpufleet.migrations.status import SchemaStatus, migrations, newest, schema_status
from gpufleet.ops.backup import database_kind, sqlite_path


@dataclass(frozen=True)
class UpgradeCheck:
    database: str  # the SQLite file, or the PostgreSQL URL without its password
    exists: bool  # False: a SQLite file the head will create on its first start
    status: SchemaStatus

    def as_dict(self) -> dict[str, object]:
        return {"database": self.database, "exists": self.exists, **self.status.as_dict()}


def check(settings: Settings) -> UpgradeCheck:
    """Where the head's database stands against this gpufleet's migrations. Reads only.

    Raises Unavailable when the database cannot be reached, ConfigError for a URL gpufleet cannot use.
    """
    url = settings.effective_database_url
    kind = database_kind(url)
    if kind == "sqlite":
        path = sqlite_path(url)
        if not path.exists():
            return UpgradeCheck(str(path), False, SchemaStatus(None, newest(), migrations(), newer=False))
        where = str(path)
        engine = _read_only_sqlite(where)
    elif kind == "postgresql":
        where = make_url(url).render_as_string(hide_password=True)
        engine = make_engine(url)
    else:
        raise ConfigError(f"unsupported database {kind!r}: use sqlite or postgresql+psycopg")
    try:
        with engine.connect() as conn:
            status = schema_status(conn)
    except OperationalError as exc:
        raise Unavailable(f"cannot read the database {where}: {exc.orig}") from None
    finally:
        engine.dispose()
    return UpgradeCheck(where, True, status)


def _read_only_sqlite(path: str) -> Engine:
    """An engine that opens the file read-only (no WAL switch, no pragmas that write)."""
    uri = f"file:{quote(path)}?mode=ro"
    return create_engine("sqlite://", creator=lambda: sqlite3.connect(uri, uri=True), poolclass=NullPool)
