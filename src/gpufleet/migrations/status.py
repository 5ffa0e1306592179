"""Where a database's schema stands against this gpufleet's migrations: its revision, the migrations an
upgrade would run, and whether it is newer than this gpufleet knows (written by a later release).

Read-only: nothing here writes to the database. `gpufleet server --check-upgrade` reports it, the head
refuses to start on a newer schema (`refuse_newer`, called by `migrations.upgrade`), and a restore
refuses a backup taken from one.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection

from gpufleet import __version__
from gpufleet.core.errors import Conflict


@dataclass(frozen=True)
class Migration:
    """One migration: its revision id and the first line of its docstring."""

    revision: str
    title: str


@dataclass(frozen=True)
class SchemaStatus:
    """A database's revision (None: no gpufleet schema yet) against this gpufleet's newest."""

    current: str | None
    newest: str
    pending: tuple[Migration, ...]
    newer: bool  # the database is at a revision this gpufleet does not know

    @property
    def upgrade_pending(self) -> bool:
        return bool(self.pending)

    def as_dict(self) -> dict[str, object]:
        return {
            "gpufleet_version": __version__,
            "current": self.current,
            "newest": self.newest,
            "newer_than_this_gpufleet": self.newer,
            "upgrade_pending": self.upgrade_pending,
            "pending": [{"revision": m.revision, "title": m.title} for m in self.pending],
        }


class SchemaTooNew(Conflict):
    """The database was migrated by a later gpufleet: this one must not serve or change it."""


@functools.cache
def migrations() -> tuple[Migration, ...]:
    """This gpufleet's migrations, oldest first (read once per process)."""
    from gpufleet.migrations import alembic_config

    script = ScriptDirectory.from_config(alembic_config())
    found = [Migration(s.revision, _title(s.doc)) for s in script.walk_revisions()]
    return tuple(reversed(found))


def _title(doc: str | None) -> str:
    lines = (doc or "").strip().splitlines()
    return lines[0] if lines else ""


def newest() -> str:
    """The revision this gpufleet migrates a database to."""
    return migrations()[-1].revision


def is_known(revision: str) -> bool:
    return any(m.revision == revision for m in migrations())


def pending_after(revision: str | None) -> tuple[Migration, ...]:
    """The migrations an upgrade from `revision` (None: an empty database) runs, in order.

    Raises SchemaTooNew for a revision this gpufleet does not know.
    """
    known = migrations()
    if revision is None:
        return known
    for index, migration in enumerate(known):
        if migration.revision == revision:
            return known[index + 1 :]
    raise too_new(revision)


def current_revision(conn: Connection) -> str | None:
    """The database's revision; None where it holds no gpufleet schema. Reads only."""
    return MigrationContext.configure(conn).get_current_revision()


def schema_status(conn: Connection) -> SchemaStatus:
    """Where the database behind `conn` stands. Reads only."""
    current = current_revision(conn)
    if current is not None and not is_known(current):
        return SchemaStatus(current, newest(), (), newer=True)
    return SchemaStatus(current, newest(), pending_after(current), newer=False)


def too_new(revision: str, what: str = "the database", advice: str = "") -> SchemaTooNew:
    """The error for a schema revision this gpufleet does not know (a later release migrated it)."""
    advice = advice or (
        "Run that release (or a later one), or restore a backup taken before the upgrade; nothing was changed"
    )
    return SchemaTooNew(
        f"{what} is at schema revision {revision}, newer than this gpufleet ({__version__}) knows"
        f" (its newest is {newest()}): a later gpufleet migrated it. {advice}"
    )


def refuse_newer(conn: Connection) -> None:
    """Raise SchemaTooNew when the database's revision is one this gpufleet does not know."""
    current = current_revision(conn)
    if current is not None and not is_known(current):
        raise too_new(current)
