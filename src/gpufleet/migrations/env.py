"""Alembic environment: runs on the engine or connection the caller passed in `config.attributes`."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, Engine

from gpufleet.migrations import metadata

config = context.config
target_metadata = metadata()


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",  # SQLite alters tables by copying them
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


connection: Connection | None = config.attributes.get("connection")
engine: Engine | None = config.attributes.get("engine")
if connection is not None:
    _run(connection)
elif engine is not None:
    with engine.connect() as conn:
        _run(conn)
        conn.commit()
else:
    raise RuntimeError("gpufleet migrations run through gpufleet.migrations.upgrade(engine)")
