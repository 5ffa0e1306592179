"""Alembic migrations, run by the head node on start (`upgrade`), and the metadata they are checked against."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, MetaData, text

from gpufleet.core.errors import ConfigError

HERE = Path(__file__).resolve().parent
# Any constant works; it names the advisory lock that serialises migrations of replicas starting together.
_MIGRATION_LOCK = 8_411_305_527


def metadata() -> MetaData:
    """All tables, for Alembic's autogenerate and the migration check in the tests."""
    from gpufleet.assets import models as _assets  # noqa: F401
    from gpufleet.auth import audit as _audit  # noqa: F401
    from gpufleet.auth import models as _auth  # noqa: F401
    from gpufleet.auth import projects as _projects  # noqa: F401
    from gpufleet.core import leases as _leases  # noqa: F401
    from gpufleet.core.db import Base
    from gpufleet.directory import models as _directory  # noqa: F401
    from gpufleet.inventory import models as _inventory  # noqa: F401
    from gpufleet.jobs import models as _jobs  # noqa: F401
    from gpufleet.lifecycle import models as _lifecycle  # noqa: F401
    from gpufleet.logs import models as _logs  # noqa: F401
    from gpufleet.monitoring import models as _monitoring  # noqa: F401
    from gpufleet.network import models as _network  # noqa: F401
    from gpufleet.power import models as _power  # noqa: F401
    from gpufleet.provisioning import image_models as _images  # noqa: F401
    from gpufleet.provisioning import models as _provisioning  # noqa: F401
    from gpufleet.tasks import models as _tasks  # noqa: F401

    return Base.metadata


def alembic_config(engine: Engine | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(HERE))
    config.attributes["engine"] = engine
    return config


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Bring the schema to `revision`. On PostgreSQL, replicas starting together take turns. On SQLite
    the migrations run in one transaction with foreign keys off (see `_upgrade_sqlite`).

    Raises status.SchemaTooNew, changing nothing, when a later gpufleet migrated the database.
    """
    from gpufleet.migrations.status import refuse_newer

    config = alembic_config(engine)
    if engine.dialect.name == "sqlite":
        _upgrade_sqlite(engine, config, revision)
        return
    if engine.dialect.name == "postgresql":
        with engine.connect() as conn:
            conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _MIGRATION_LOCK})
            try:
                refuse_newer(conn)
                config.attributes["connection"] = conn
                command.upgrade(config, revision)
                conn.commit()
            finally:
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _MIGRATION_LOCK})
                conn.commit()
        return
    with engine.connect() as conn:
        refuse_newer(conn)
    command.upgrade(config, revision)


def _upgrade_sqlite(engine: Engine, config: Config, revision: str) -> None:
    """SQLite alters a table by copying it and dropping the old one (Alembic's batch mode). With foreign
    keys on, that drop is a DELETE that cascades: upgrading a database with rows would delete every GPU,
    node credential and state transition of the altered `nodes` table. So, as SQLite's documentation
    prescribes for such changes, foreign keys are switched off (outside the transaction, where the pragma
    works) while the migrations run in one transaction, checked with `foreign_key_check` before it
    commits, and switched on again. Raises ConfigError (nothing changed) if the check finds violations."""
    from gpufleet.migrations.status import refuse_newer

    with engine.connect() as conn:
        raw = conn.connection.dbapi_connection
        if raw is None:  # a checked-out connection has one
            raise RuntimeError("no DBAPI connection to migrate on")
        raw.cursor().execute("PRAGMA foreign_keys=OFF")
        try:
            refuse_newer(conn)  # begins the transaction (BEGIN IMMEDIATE: one migrating process at a time)
            config.attributes["connection"] = conn
            command.upgrade(config, revision)
            broken = conn.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
            if broken:
                conn.rollback()
                raise ConfigError(
                    f"the migrations would leave {len(broken)} rows pointing at rows that do not exist"
                    f" (first: table {broken[0][0]}, row {broken[0][1]}); nothing was changed"
                )
            conn.commit()
        finally:
            conn.rollback()  # nothing to roll back after the commit
            raw.cursor().execute("PRAGMA foreign_keys=ON")
