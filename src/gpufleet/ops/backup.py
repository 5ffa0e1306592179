"""`gpufleet server backup`: the head's state in one archive, taken while the head runs.

What it holds (see `manifest`): the database (SQLite through its online backup API, a consistent
snapshot that never stops the head's writers; PostgreSQL through `pg_dump --format=custom`), the TLS
directory (the CA with its key, the server certificate and key), the secrets key that seals BMC
passwords and SNMP secrets (`bmc_key_file`), the admins' job templates and burn-in profiles where they
live under the data directory, and the manifest: gpufleet's version, the schema revision, the time,
the database kind and each member's mode and SHA-256.

The archive therefore holds secrets (the CA key, the secrets key, every token's hash): it is written
with mode 0600, atomically (a temporary file renamed into place), and is as sensitive as the head.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import io
import os
import shutil
import socket
import sqlite3
import stat
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from gpufleet import __version__
from gpufleet.core.config import Settings
from gpufleet.core.db import make_engine
from gpufleet.core.errors import ConfigError, NotFound, Unavailable
from gpufleet.migrations.status import current_revision
from gpufleet.ops import pgtools
from gpufleet.ops.manifest import (
    DATA_PREFIX,
    DATABASE_MEMBERS,
    MANIFEST,
    SETTING_DEFAULTS,
    SETTINGS_PREFIX,
    Entry,
    Manifest,
)

_CHUNK = 1024 * 1024


@dataclass(frozen=True)
class BackupResult:
    path: Path
    size: int
    manifest: Manifest


@dataclass(frozen=True)
class _Member:
    entry: Entry
    content: bytes | Path | None  # a file's bytes, or the staged file to stream; None for a directory


def default_name(now: dt.datetime) -> str:
    """`gpufleet-backup-HOST-YYYYmmddTHHMMSSZ.tar.gz`."""
    host = socket.gethostname().split(".")[0] or "head"
    return f"gpufleet-backup-{host}-{now.astimezone(dt.UTC):%Y%m%dT%H%M%SZ}.tar.gz"


def database_kind(url: str) -> str:
    return make_url(url).get_backend_name()


def sqlite_path(url: str) -> Path:
    """The file of a SQLite URL. Raises ConfigError for an in-memory database."""
    database = make_url(url).database
    if not database or database == ":memory:":
        raise ConfigError("an in-memory SQLite database cannot be backed up or restored")
    return Path(database).absolute()


def backup(settings: Settings, out: Path, now: dt.datetime | None = None) -> BackupResult:
    """Write the head's backup to `out` (replaced atomically if it exists; a directory: a new file named
    by `default_name` in it), mode 0600.

    Raises NotFound when there is no gpufleet database to back up, Unavailable when PostgreSQL or
    pg_dump cannot be reached, ConfigError when `out` cannot be written.
    """
    now = now or dt.datetime.now(dt.UTC)
    out = out.expanduser().absolute()
    if out.is_dir():
        out = out / default_name(now)
    if not out.parent.is_dir():
        raise ConfigError(f"cannot write the backup: {out.parent} is not a directory")
    url = settings.effective_database_url
    kind = database_kind(url)
    if kind not in ("sqlite", "postgresql"):
        raise ConfigError(f"cannot back up a {kind!r} database: gpufleet runs on sqlite or postgresql")
    with staging_dir(out.parent, f".{out.name}.") as staging:
        if kind == "sqlite":
            database, revision = _sqlite_copy(sqlite_path(url), staging / "gpufleet.sqlite")
        else:
            database, revision = _postgres_dump(url, staging / "gpufleet.pgdump")
        members = [_file_member(DATABASE_MEMBERS[kind], database, 0o600)]
        files, not_included = _collect(settings, sqlite_path(url) if kind == "sqlite" else None, out)
        members += files
        manifest = Manifest(
            gpufleet_version=__version__,
            alembic_revision=revision,
            created_at=now.astimezone(dt.UTC).isoformat(timespec="seconds"),
            database="sqlite" if kind == "sqlite" else "postgresql",
            source_host=socket.gethostname(),  # not getfqdn: a slow resolver would hold the backup
            source_data_dir=str(settings.data_dir.absolute()),
            entries=tuple(m.entry for m in members),
            not_included=tuple(not_included),
        )
        _write_archive(out, manifest, members, now)
    return BackupResult(out, out.stat().st_size, manifest)


@contextlib.contextmanager
def staging_dir(parent: Path, prefix: str) -> Iterator[Path]:
    """A private (0700) scratch directory beside the archive, removed afterwards whatever happens."""
    try:
        path = Path(tempfile.mkdtemp(dir=parent, prefix=prefix))
    except OSError as exc:
        raise ConfigError(f"cannot write in {parent}: {exc.strerror}") from None
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _sqlite_copy(source: Path, target: Path) -> tuple[Path, str]:
    """SQLite's online backup of `source` into `target`: one consistent snapshot, read in one step
    (in WAL mode the head's writers go on meanwhile). Opened read-only: the head's file is never written.
    Returns the copy and its schema revision. Raises NotFound when there is no gpufleet database."""
    if not source.is_file():
        raise NotFound(f"no database at {source}: is data_dir (or database_url) the head's?")
    try:
        src = sqlite3.connect(f"file:{quote(str(source))}?mode=ro", uri=True, timeout=30)
        try:
            dst = sqlite3.connect(target)
            try:
                src.backup(dst)
            finally:
                dst.close()
        finally:
            src.close()
    except sqlite3.Error as exc:
        raise Unavailable(f"cannot back up the SQLite database {source}: {exc}") from None
    os.chmod(target, 0o600)
    revision = sqlite_revision(target)
    if revision is None:
        raise NotFound(f"the database {source} holds no gpufleet schema: has the head ever started on it?")
    return target, revision


def sqlite_revision(path: Path) -> str | None:
    """The schema revision recorded in a SQLite file, None where it has none. Reads only."""
    try:
        conn = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True)
        try:
            row = conn.execute("SELECT version_num FROM alembic_version").fetchone()
        finally:
            conn.close()
    except sqlite3.OperationalError:
        return None  # no such table
    except sqlite3.DatabaseError as exc:
        raise Unavailable(f"{path} is not a SQLite database: {exc}") from None
    return None if row is None else str(row[0])


def _postgres_dump(url: str, target: Path) -> tuple[Path, str]:
    pgtools.require("pg_dump")  # before anything else: the clearest error first
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            revision = current_revision(conn)
    except OperationalError as exc:
        raise Unavailable(f"cannot reach the database: {exc.orig}") from None
    finally:
        engine.dispose()
    if revision is None:
        raise NotFound("the database holds no gpufleet schema: has the head ever started on it?")
    pgtools.dump(url, target)
    os.chmod(target, 0o600)
    return target, revision


def _file_member(member: str, path: Path, mode: int) -> _Member:
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return _Member(Entry(member, "file", mode, size, digest.hexdigest()), path)


def _bytes_member(member: str, data: bytes, mode: int) -> _Member:
    return _Member(Entry(member, "file", mode, len(data), hashlib.sha256(data).hexdigest()), data)


def _under(path: Path, root: Path) -> bool:
    return path.resolve().is_relative_to(root.resolve())


def _collect(settings: Settings, database: Path | None, out: Path) -> tuple[list[_Member], list[str]]:
    """The data directory's parts a head needs, and the settings' files outside them; also what lies
    in the data directory and is left out (software images, Ansible runs, logs; not the archive being
    written, should it be written there)."""
    data_dir = settings.data_dir.absolute()
    members: list[_Member] = []
    covered: list[Path] = []
    wanted = [(data_dir / "tls", "the TLS directory")]
    if settings.bmc_key_file is None:
        wanted.append((data_dir / "bmc.key", "the secrets key"))
    for configured, default in (
        (settings.job_templates_dir, "job-templates"),
        (settings.burnin_profiles_dir, "burnin-profiles"),
    ):
        wanted.append((configured or data_dir / default, default))
    not_included: list[str] = []
    for path, what in wanted:
        if not path.exists():
            continue
        if not _under(path, data_dir):
            not_included.append(f"{path} ({what}: outside the data directory, back it up with the config)")
            continue
        members += _tree(path, data_dir)
        covered.append(path.resolve())
    for name in SETTING_DEFAULTS:
        configured_path: Path | None = getattr(settings, name)
        if configured_path is None or any(_under(configured_path, c) for c in covered):
            continue
        if not configured_path.is_file():
            not_included.append(f"{configured_path} ({name}: not found)")
            continue
        mode = stat.S_IMODE(configured_path.stat().st_mode)
        members.append(_bytes_member(SETTINGS_PREFIX + name, configured_path.read_bytes(), mode))
    if database is not None:
        covered += [Path(f"{database}{suffix}").resolve() for suffix in ("", "-wal", "-shm", "-journal")]
    return members, not_included + _left_out(data_dir, covered, out)


def _left_out(data_dir: Path, covered: list[Path], out: Path) -> list[str]:
    """What else lies at the top of the data directory (not the archive being written there, if it is)."""
    if not data_dir.is_dir():
        return []
    left = []
    for child in sorted(data_dir.iterdir()):
        if child.name == out.name or child.name.startswith(f".{out.name}."):
            continue
        if child.resolve() not in covered and not any(c.is_relative_to(child.resolve()) for c in covered):
            left.append(str(child))
    return left


def _tree(root: Path, data_dir: Path) -> list[_Member]:
    """A file, or a directory with every regular file and directory under it (links are not followed)."""
    base = data_dir.resolve()

    def member(path: Path) -> str:
        return DATA_PREFIX + path.resolve().relative_to(base).as_posix()

    def read(path: Path) -> _Member:
        return _bytes_member(member(path), path.read_bytes(), stat.S_IMODE(path.lstat().st_mode))

    if not root.is_dir():
        return [read(root)] if root.is_file() and not root.is_symlink() else []
    found = [_Member(Entry(member(root), "dir", stat.S_IMODE(root.stat().st_mode)), None)]
    for current, dirs, files in os.walk(root):
        dirs.sort()
        here = Path(current)
        for name in dirs:
            if not (here / name).is_symlink():
                found.append(
                    _Member(Entry(member(here / name), "dir", stat.S_IMODE((here / name).stat().st_mode)), None)
                )
        for name in sorted(files):
            path = here / name
            if path.is_symlink() or not path.is_file() or name.endswith(".tmp"):
                continue  # a half-written file of `server init` or the key file's creation
            found.append(read(path))
    return found


def _write_archive(out: Path, manifest: Manifest, members: list[_Member], now: dt.datetime) -> None:
    """The tar.gz, manifest first, written to a 0600 temporary file beside `out`, synced, renamed into place."""
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    mtime = int(now.timestamp())
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)  # a stale temporary file keeps its old mode otherwise
        with os.fdopen(fd, "wb") as raw:
            with tarfile.open(fileobj=raw, mode="w:gz", compresslevel=6) as tar:
                data = manifest.to_bytes()
                tar.addfile(_info(MANIFEST, "file", 0o600, len(data), mtime), io.BytesIO(data))
                for m in members:
                    info = _info(m.entry.member, m.entry.kind, m.entry.mode, m.entry.size, mtime)
                    if isinstance(m.content, Path):
                        with m.content.open("rb") as fh:
                            tar.addfile(info, fh)
                    else:
                        tar.addfile(info, io.BytesIO(m.content) if m.content is not None else None)
            raw.flush()
            os.fsync(raw.fileno())
        tmp.replace(out)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ConfigError(f"cannot write the backup {out}: {exc.strerror or exc}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    with contextlib.suppress(OSError):  # the rename itself survives a crash once the directory is synced
        dir_fd = os.open(out.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _info(name: str, kind: str, mode: int, size: int, mtime: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE if kind == "dir" else tarfile.REGTYPE
    info.mode = mode
    info.size = size if kind == "file" else 0
    info.mtime = mtime
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info
