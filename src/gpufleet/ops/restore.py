"""`gpufleet server restore`: a backup (see `backup`) onto a new, empty data directory and database.

Everything is checked before anything is written where the head will look: the target data directory
is empty or absent, the database target is new (SQLite) or empty (PostgreSQL), no restored file would
replace one, the backup's schema is one this gpufleet knows, and every member matches its checksum
(the archive is unpacked into a private scratch directory beside the target first). Only then is the
database restored (`pg_restore` in one transaction) and the scratch directory renamed into place. A
refused or failed restore changes nothing. Files keep the modes they were backed up with.

The restored head migrates its database on start, as after any upgrade (`gpufleet server --check-upgrade`
says what will run).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from gpufleet.core.config import Settings
from gpufleet.core.db import make_engine
from gpufleet.core.errors import Conflict, InvalidInput, Unavailable
from gpufleet.migrations.status import Migration, is_known, pending_after, too_new
from gpufleet.ops import pgtools
from gpufleet.ops.backup import database_kind, sqlite_path, sqlite_revision, staging_dir
from gpufleet.ops.manifest import (
    DATA_PREFIX,
    MANIFEST,
    SETTING_DEFAULTS,
    SETTINGS_PREFIX,
    Entry,
    Manifest,
    data_target,
)

_CHUNK = 1024 * 1024


@dataclass(frozen=True)
class RestoreResult:
    manifest: Manifest
    data_dir: Path
    database: str  # the SQLite file, or the PostgreSQL URL without its password
    files: tuple[tuple[str, Path], ...]  # each restored file: its member and where it went
    pending: tuple[Migration, ...]  # the migrations the head runs on its first start
    dry_run: bool

    def as_dict(self) -> dict[str, object]:
        m = self.manifest
        return {
            "dry_run": self.dry_run,
            "data_dir": str(self.data_dir),
            "database": {"kind": m.database, "target": self.database},
            "backup": {
                "created_at": m.created_at,
                "gpufleet_version": m.gpufleet_version,
                "alembic_revision": m.alembic_revision,
                "source_host": m.source_host,
                "source_data_dir": m.source_data_dir,
            },
            "files": [{"member": member, "path": str(path)} for member, path in self.files],
            "migrations_on_start": [{"revision": p.revision, "title": p.title} for p in self.pending],
        }


@contextlib.contextmanager
def open_archive(archive: Path) -> Iterator[tuple[tarfile.TarFile, Manifest]]:
    """The archive, read as a stream, and its manifest (its first member). Raises InvalidInput when the
    file is missing, unreadable or not a gpufleet backup."""
    try:
        tar = tarfile.open(archive, mode="r|gz")  # noqa: SIM115 (closed below, after the caller is done)
    except FileNotFoundError:
        raise InvalidInput(f"no backup at {archive}") from None
    except OSError as exc:
        raise InvalidInput(f"cannot read {archive}: {exc.strerror or exc}") from None
    except tarfile.TarError as exc:
        raise InvalidInput(f"{archive} is not a gpufleet backup (a tar.gz archive): {exc}") from None
    try:
        try:
            first = tar.next()
            if first is None or first.name != MANIFEST or not first.isreg():
                raise InvalidInput(f"{archive} is not a gpufleet backup: it does not start with {MANIFEST}")
            manifest = Manifest.from_bytes(_reader(tar, first).read())
        except (tarfile.TarError, EOFError, OSError) as exc:
            raise InvalidInput(f"{archive} is damaged: {exc}") from None
        yield tar, manifest
    finally:
        tar.close()


def read_manifest(archive: Path) -> Manifest:
    """A backup's manifest, without unpacking the rest. Raises InvalidInput as `open_archive` does."""
    with open_archive(archive) as (_tar, manifest):
        return manifest


def restore(settings: Settings, archive: Path, *, dry_run: bool = False) -> RestoreResult:
    """Restore `archive` into `settings.data_dir` and the database `settings` name; with `dry_run`, check
    and unpack it into scratch space only.

    Raises Conflict for a target that is not empty or a database of the other kind, SchemaTooNew for a
    backup from a newer schema, InvalidInput for a damaged archive, Unavailable when the database or
    pg_restore cannot be reached. Nothing is changed when any of these is raised.
    """
    archive = archive.expanduser().absolute()
    data_dir = settings.data_dir.expanduser().absolute()
    url = settings.effective_database_url
    kind = database_kind(url)
    _check_empty_dir(data_dir)
    with open_archive(archive) as (tar, manifest):
        if manifest.database != kind:
            raise Conflict(
                f"the backup holds a {manifest.database} database, but this head's database_url is {kind}:"
                f" restore it with a {manifest.database} database_url"
                + (" (unset: SQLite under the data directory)" if manifest.database == "sqlite" else "")
            )
        if not is_known(manifest.alembic_revision):
            raise too_new(
                manifest.alembic_revision,
                "the backup",
                f"Restore it with gpufleet {manifest.gpufleet_version} or later; nothing was changed",
            )
        targets = _targets(manifest, settings, data_dir)
        if kind == "sqlite":
            database_target = sqlite_path(url)
            for suffix in ("", "-wal", "-shm", "-journal"):
                if Path(f"{database_target}{suffix}").exists():
                    raise Conflict(f"{database_target}{suffix} exists: a restore writes a new database only")
            where = str(database_target)
        else:
            pgtools.require("pg_restore")
            where = make_url(url).render_as_string(hide_password=True)
            _check_postgres_empty(url, where)
        for member, target in targets.items():
            if not target.is_relative_to(data_dir) and (target.exists() or target.is_symlink()):
                raise Conflict(f"{target} exists ({member}): a restore never replaces a file; move it away first")
        try:
            data_dir.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise Conflict(f"cannot create {data_dir.parent}: {exc.strerror}") from None
        with staging_dir(data_dir.parent, f".{data_dir.name}.restore-") as staging:
            stage = staging / "data"
            stage.mkdir(mode=0o700)
            staged = _unpack(tar, manifest, staging, stage)
            if kind == "sqlite":
                found = sqlite_revision(staged[manifest.database_member])
                if found != manifest.alembic_revision:
                    raise InvalidInput(
                        f"the backup's database is at revision {found}, but its manifest says"
                        f" {manifest.alembic_revision}: the archive is not one gpufleet wrote"
                    )
            files = tuple(
                (e.member, targets[e.member]) for e in manifest.entries if e.kind == "file" and e.member in targets
            )
            result = RestoreResult(manifest, data_dir, where, files, pending_after(manifest.alembic_revision), dry_run)
            if dry_run:
                return result
            _apply(manifest, url, kind, staged, targets, stage, data_dir)
    return result


def _check_empty_dir(data_dir: Path) -> None:
    if data_dir.is_symlink() or (data_dir.exists() and not data_dir.is_dir()):
        raise Conflict(f"{data_dir} is not a directory: a restore needs an empty or new data directory")
    if data_dir.is_dir() and any(data_dir.iterdir()):
        raise Conflict(
            f"{data_dir} is not empty: a restore writes only into an empty or new data directory; nothing was changed"
        )


def _check_postgres_empty(url: str, where: str) -> None:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            pgtools.check_empty(conn, where)
    except OperationalError as exc:
        raise Unavailable(f"cannot reach the database {where}: {exc.orig}") from None
    finally:
        engine.dispose()


def _targets(manifest: Manifest, settings: Settings, data_dir: Path) -> dict[str, Path]:
    """Where each file and directory goes (the database aside). Raises InvalidInput when two members
    would land on one path."""
    targets: dict[str, Path] = {}
    for entry in manifest.entries:
        if entry.member.startswith(DATA_PREFIX):
            targets[entry.member] = data_target(entry.member, data_dir)
        elif entry.member.startswith(SETTINGS_PREFIX):
            name = entry.member.removeprefix(SETTINGS_PREFIX)
            configured: Path | None = getattr(settings, name)
            target = configured.expanduser().absolute() if configured else data_dir / SETTING_DEFAULTS[name]
            targets[entry.member] = target
    if manifest.database == "sqlite":
        database = sqlite_path(settings.effective_database_url)
        targets_all = [*targets.values(), database]
    else:
        targets_all = list(targets.values())
    if len(set(targets_all)) != len(targets_all):
        raise InvalidInput("two members of the backup would be restored to the same path with these settings")
    return targets


def _unpack(tar: tarfile.TarFile, manifest: Manifest, staging: Path, stage: Path) -> dict[str, Path]:
    """Every member into scratch space, each checked against the manifest. Returns where each went.
    Raises InvalidInput for a missing, unexpected or damaged member."""
    expected = {e.member: e for e in manifest.entries}
    staged: dict[str, Path] = {}
    (staging / "settings").mkdir(mode=0o700)
    manifest_seen = False
    try:
        for info in tar:
            if info.name == MANIFEST and not manifest_seen:  # read already (iteration starts over)
                manifest_seen = True
                continue
            entry = expected.get(info.name)
            if entry is None or info.name in staged:
                raise InvalidInput(f"the backup holds {info.name[:200]!r}, which its manifest does not name")
            if info.name == manifest.database_member:
                path = staging / "database"
            elif info.name.startswith(SETTINGS_PREFIX):
                path = staging / "settings" / info.name.removeprefix(SETTINGS_PREFIX)
            else:
                path = data_target(info.name, stage)
            _stage(tar, info, entry, path)
            staged[info.name] = path
    except (tarfile.TarError, EOFError) as exc:
        raise InvalidInput(f"the backup is damaged (cut short?): {exc}") from None
    missing = sorted(set(expected) - set(staged))
    if missing:
        raise InvalidInput(f"the backup is incomplete: {', '.join(missing[:5])} missing")
    dirs = [(staged[e.member], e.mode) for e in manifest.entries if e.kind == "dir"]
    for path, mode in sorted(dirs, key=lambda d: len(d[0].parts), reverse=True):  # deepest first
        path.chmod(mode)
    return staged


def _stage(tar: tarfile.TarFile, info: tarfile.TarInfo, entry: Entry, path: Path) -> None:
    """One member into scratch space: a directory (its mode is set once its files are in), or a file
    checked against the manifest. Raises InvalidInput when it is not what the manifest says."""
    try:
        if entry.kind == "dir":
            if not info.isdir():
                raise InvalidInput(f"{info.name} should be a directory in the backup")
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
            return
        if not info.isreg():
            raise InvalidInput(f"{info.name} should be a regular file in the backup")
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        _write_checked(tar, info, entry, path)
    except (FileExistsError, NotADirectoryError, IsADirectoryError) as exc:  # a file where a directory is
        raise InvalidInput(f"cannot unpack {info.name}: {exc.strerror or exc}") from None


def _reader(tar: tarfile.TarFile, info: tarfile.TarInfo) -> IO[bytes]:
    source = tar.extractfile(info)
    if source is None:
        raise InvalidInput(f"{info.name} should be a regular file in the backup")
    return source


def _write_checked(tar: tarfile.TarFile, info: tarfile.TarInfo, entry: Entry, path: Path) -> None:
    source = _reader(tar, info)
    digest = hashlib.sha256()
    size = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        while chunk := source.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
            fh.write(chunk)
        fh.flush()
        os.fsync(fh.fileno())
        os.fchmod(fh.fileno(), entry.mode)
    if size != entry.size or digest.hexdigest() != entry.sha256:
        raise InvalidInput(f"{entry.member} does not match its checksum in the manifest: the backup is damaged")


def _apply(
    manifest: Manifest,
    url: str,
    kind: str,
    staged: dict[str, Path],
    targets: dict[str, Path],
    stage: Path,
    data_dir: Path,
) -> None:
    """Put what was unpacked and checked in place: the database, files outside the data directory,
    then the data directory itself, renamed from the scratch directory."""
    database = staged[manifest.database_member]
    if kind == "postgresql":
        pgtools.restore(url, database)  # one transaction: all or nothing
        outside: list[tuple[Path, Path]] = []
    else:
        outside = [(database, sqlite_path(url))]
    for member, target in targets.items():
        if member.startswith(SETTINGS_PREFIX):
            outside.append((staged[member], target))
    for source, target in outside:
        if target.is_relative_to(data_dir):
            inside = stage.joinpath(*target.relative_to(data_dir).parts)
            inside.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            source.rename(inside)
        else:
            _place(source, target)
    if data_dir.exists():
        data_dir.rmdir()  # checked empty
    stage.rename(data_dir)


def _place(source: Path, target: Path) -> None:
    """Copy `source` to `target` (never replacing one) with its mode, through a temporary file."""
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.restore-{os.getpid()}.tmp")
    mode = source.stat().st_mode & 0o777
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh, source.open("rb") as src:
            shutil.copyfileobj(src, fh, _CHUNK)
            fh.flush()
            os.fsync(fh.fileno())
            os.fchmod(fh.fileno(), mode)
        os.link(tmp, target)  # fails rather than replace a file that appeared meanwhile
    finally:
        tmp.unlink(missing_ok=True)
