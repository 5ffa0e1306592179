"""The head's maintenance commands: `gpufleet server backup`, `server restore` and `server check-upgrade`
(also `gpufleet server --check-upgrade`). They run on the head machine with the head's settings, as
`gpufleet server init` does; the work is imported inside each command, so the CLI never loads it.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Annotated

import typer

from gpufleet.cli.output import Format, OutputOpt, print_json
from gpufleet.cli.state import state
from gpufleet.core.config import Settings

DataDirOpt = Annotated[Path | None, typer.Option(help="the head's state directory (env GPUFLEET_DATA_DIR)")]
# `gpufleet server --check-upgrade` and `server check-upgrade`: what each outcome exits with.
UP_TO_DATE = 0
UPGRADE_PENDING = 1


def add_commands(server_app: typer.Typer) -> None:
    """Add backup, restore and check-upgrade under `gpufleet server`."""
    server_app.command("backup")(server_backup)
    server_app.command("restore")(server_restore)
    server_app.command("check-upgrade")(server_check_upgrade)


def server_backup(
    ctx: typer.Context,
    data_dir: DataDirOpt = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            help="the archive to write, or a directory for a new one (default: ./gpufleet-backup-HOST-TIME.tar.gz)",
        ),
    ] = None,
    output: Format = OutputOpt,
) -> None:
    """Back up the head while it runs: database, CA and TLS keys, secrets key, templates, into one tar.gz (0600).

    The archive holds secrets (the CA key, the key sealing BMC passwords and SNMP secrets): keep it as
    safe as the head itself.
    """
    settings = state(ctx).settings(data_dir=data_dir)
    from gpufleet.ops.backup import backup, default_name

    now = dt.datetime.now(dt.UTC)
    result = backup(settings, out or Path.cwd() / default_name(now), now)
    m = result.manifest
    if output == Format.json:
        print_json({"path": str(result.path), "size": result.size, "manifest": m.as_dict()})
        return
    typer.echo(f"backup written: {result.path} ({_size(result.size)}, mode 0600)")
    typer.echo(f"  database: {m.database} at schema revision {m.alembic_revision} (gpufleet {m.gpufleet_version})")
    files = [e.member for e in m.entries if e.kind == "file" and not e.member.startswith("database/")]
    typer.echo(f"  files: {', '.join(files) if files else 'none'}")
    for skipped in m.not_included:
        typer.echo(f"  not included: {skipped}")
    typer.echo("It holds the CA key and the secrets key: store it as safely as the head itself.")


def server_restore(
    ctx: typer.Context,
    archive: Annotated[Path, typer.Argument(help="a backup written by `gpufleet server backup`")],
    data_dir: DataDirOpt = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="check the backup and the targets, unpack to scratch space only")
    ] = False,
    output: Format = OutputOpt,
) -> None:
    """Restore a backup into an empty data directory (and an empty database), ready for `gpufleet server`.

    Refuses, changing nothing, a target that is not empty, a damaged archive, or a backup from a newer
    schema than this gpufleet knows. Start the head on the same address so agents reconnect.
    """
    settings = state(ctx).settings(data_dir=data_dir)
    from gpufleet.ops.restore import restore

    result = restore(settings, archive, dry_run=dry_run)
    if output == Format.json:
        print_json(result.as_dict())
        return
    m = result.manifest
    verb = "would restore" if dry_run else "restored"
    typer.echo(f"{verb} the backup of {m.source_host} taken {m.created_at} (gpufleet {m.gpufleet_version})")
    typer.echo(f"  data directory: {result.data_dir}")
    typer.echo(f"  database: {m.database} {result.database}, schema revision {m.alembic_revision}")
    for member, path in result.files:
        typer.echo(f"  {member} -> {path}")
    if result.pending:
        typer.echo(f"  on start the head runs {len(result.pending)} migration(s), to {result.pending[-1].revision}")
    if dry_run:
        typer.echo("dry run: the backup is whole and the targets are free; nothing was written")
    else:
        typer.echo(
            f"ready: gpufleet server --data-dir {result.data_dir} (on the old head's address, so agents reconnect)"
        )


def server_check_upgrade(ctx: typer.Context, data_dir: DataDirOpt = None, output: Format = OutputOpt) -> None:
    """Say what starting this gpufleet would do to the database, changing nothing.

    Exit status: 0 up to date, 1 migrations pending, 4 the database is newer than this gpufleet
    (the head refuses to start on it).
    """
    check_upgrade(state(ctx).settings(data_dir=data_dir), output)


def check_upgrade(settings: Settings, output: Format = Format.table) -> None:
    """Print the database's revision and the migrations that would run; exit with the outcome's status."""
    from gpufleet.migrations.status import SchemaTooNew, too_new
    from gpufleet.ops.upgrade import check

    result = check(settings)
    status = result.status
    if output == Format.json:
        print_json(result.as_dict())
    else:
        if not result.exists:
            typer.echo(f"database: {result.database} (no database yet)")
        else:
            typer.echo(f"database: {result.database}")
            typer.echo(f"schema revision: {status.current or 'none (no gpufleet schema yet)'}")
        typer.echo(f"this gpufleet migrates to: {status.newest}")
        if status.pending:
            typer.echo(f"{len(status.pending)} migration(s) will run when the head starts:")
            for m in status.pending:
                typer.echo(f"  {m.revision}  {m.title}")
        elif not status.newer:
            typer.echo("up to date: nothing to migrate")
    if status.newer:
        typer.echo(f"gpufleet: error: {too_new(status.current or '?')}", err=True)
        raise typer.Exit(SchemaTooNew.exit_code)
    raise typer.Exit(UPGRADE_PENDING if status.upgrade_pending else UP_TO_DATE)


def _size(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"
