"""gpufleet server install-unit and gpufleet agent install-unit: the systemd units of the head and the agent
(rendered by deploy.units, written atomically, never over a different unit without --force)."""

from __future__ import annotations

import os
import pwd
import shutil
import sys
from pathlib import Path
from typing import Annotated

import typer

from gpufleet.cli.state import state
from gpufleet.core.errors import InvalidInput
from gpufleet.deploy import units

UnitDirOpt = Annotated[
    Path, typer.Option("--unit-dir", help="where to write the unit (systemd's directory for admins' units)")
]
PrintOpt = Annotated[bool, typer.Option("--print", help="print the unit to stdout; write nothing")]
ForceOpt = Annotated[bool, typer.Option("--force", help="replace an existing unit that differs")]
ProgramOpt = Annotated[
    str | None,
    typer.Option("--program", help="the gpufleet executable ExecStart runs (default: this one's absolute path)"),
]


def running_program() -> tuple[str, ...]:
    """How this gpufleet was started, as ExecStart should start it: the `gpufleet` script that runs
    now (absolute, symbolic links kept: a virtual environment's script stays itself), else the one
    beside this Python, else on PATH, else this Python with `-m gpufleet.entry`."""
    argv0 = Path(sys.argv[0])
    if argv0.name == "gpufleet" and argv0.is_file():
        return (os.path.abspath(argv0),)
    beside = Path(sys.executable).parent / "gpufleet"
    if beside.is_file():
        return (str(beside),)
    found = shutil.which("gpufleet")
    if found is not None:
        return (os.path.abspath(found),)
    return (sys.executable, "-m", "gpufleet.entry")


def _home_of(user: str) -> str | None:
    try:
        return pwd.getpwnam(user).pw_dir
    except KeyError:
        return None


def _write(unit_dir: Path, name: str, text: str, print_: bool, force: bool) -> None:
    if print_:
        typer.echo(text, nl=False)
        return
    path = unit_dir / name
    if units.install(path, text, force=force):
        typer.echo(f"wrote {path}")
    else:
        typer.echo(f"{path} is up to date (unchanged)")
    service = name.removesuffix(".service")
    typer.echo(f"then: systemctl daemon-reload && systemctl enable --now {service}")


def server_install_unit(
    ctx: typer.Context,
    user: Annotated[str, typer.Option(help="the user the head runs as (root to build software images)")] = (
        units.SERVER_USER
    ),
    data_dir: Annotated[
        Path | None, typer.Option(help="the head's data directory, its only writable place (default: data_dir)")
    ] = None,
    env_file: Annotated[
        Path, typer.Option(help="settings as GPUFLEET_*=value lines (EnvironmentFile=, optional)")
    ] = Path(units.SERVER_ENV_FILE),
    program: ProgramOpt = None,
    read_write: Annotated[
        list[Path] | None,
        typer.Option("--read-write", help="another directory the head writes, e.g. an images_dir elsewhere (repeat)"),
    ] = None,
    unit_dir: UnitDirOpt = Path(units.UNIT_DIR),
    print_: PrintOpt = False,
    force: ForceOpt = False,
) -> None:
    """Write gpufleet-server.service: the head as USER, the file system read-only but for its data directory."""
    data = str(data_dir) if data_dir is not None else str(state(ctx).settings().data_dir)
    home = _home_of(user)
    unit = units.ServerUnit(
        program=(units.check_path(program, "--program"),) if program else running_program(),
        user=user,
        data_dir=data,
        env_file=str(env_file),
        read_write=tuple(str(p) for p in read_write or []),
        protect_home=not units.home_is_protected(home),
    )
    _write(unit_dir, units.SERVER_UNIT, unit.render(), print_, force)
    if home is None:
        typer.echo(
            f"note: there is no user {user} here yet: useradd --system --home-dir {data} "
            f"--shell /usr/sbin/nologin {user}",
            err=True,
        )
    if units.state_directory(units.check_path(data, "the data directory")) is None:
        typer.echo(
            f"note: {data} is not under /var/lib: create it first (install -d -m 0700 -o {user} {data})", err=True
        )


def agent_install_unit(
    ctx: typer.Context,
    state_dir: Annotated[
        Path | None, typer.Option(help="where the agent keeps its credential (default: agent_state_dir)")
    ] = None,
    env_file: Annotated[
        Path, typer.Option(help="GPUFLEET_SERVER, GPUFLEET_JOIN_TOKEN and other settings (EnvironmentFile=)")
    ] = Path(units.AGENT_ENV_FILE),
    program: ProgramOpt = None,
    zipapp: Annotated[
        Path | None,
        typer.Option(help=f"run the agent from this zipapp instead, e.g. {units.AGENT_LIB_DIR}/{units.zipapp_name()}"),
    ] = None,
    python: Annotated[str, typer.Option(help="the interpreter that runs --zipapp")] = units.DEFAULT_PYTHON,
    name: Annotated[str | None, typer.Option(help="the node's name (default: the agent's, the short hostname)")] = None,
    unit_dir: UnitDirOpt = Path(units.UNIT_DIR),
    print_: PrintOpt = False,
    force: ForceOpt = False,
) -> None:
    """Write gpufleet-agent.service: the agent as root, restarted on failure but never into a refusal."""
    if program is not None and zipapp is not None:
        raise InvalidInput("give --program or --zipapp, not both")
    state_path = str(state_dir) if state_dir is not None else str(state(ctx).settings().agent_state_dir)
    if zipapp is not None:
        run = units.zipapp_program(str(zipapp), python)
    elif program is not None:
        run = (units.check_path(program, "--program"),)
    else:
        run = running_program()
    unit = units.AgentUnit(
        program=run,
        state_dir=state_path,
        env_file=str(env_file),
        name=name,
        shiv_root=f"{units.check_path(state_path, 'the state directory')}/shiv" if zipapp is not None else None,
    )
    _write(unit_dir, units.AGENT_UNIT, unit.render(), print_, force)
    if not env_file.exists():
        typer.echo(
            f"note: write {env_file} (mode 0600) with GPUFLEET_SERVER=https://HEAD:8443 and, until the node has "
            "joined, GPUFLEET_JOIN_TOKEN=gfj_... (gpufleet token create)",
            err=True,
        )
