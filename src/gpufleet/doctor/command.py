"""`gpufleet doctor`: run the checks for this machine's role and print what is wrong and how to fix it.

Exit status 0 when no check fails (warnings allowed), 1 when one does; `-o json` for scripts.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Annotated, Any

import typer

from gpufleet import __version__
from gpufleet.cli.output import Format, OutputOpt, console, print_json, table
from gpufleet.cli.state import state
from gpufleet.core import tls
from gpufleet.core.config import Settings
from gpufleet.core.errors import ConfigError, InvalidInput
from gpufleet.deploy.units import AGENT_UNIT, SERVER_UNIT, UNIT_DIR
from gpufleet.doctor import checks, probes, tls_checks
from gpufleet.doctor.checks import Finding, Role, Status

DEFAULT_UNIT_DIR = Path(UNIT_DIR)
CREDENTIAL_FILE = "credential.json"  # agent.credentials' file in the state directory
PINNED_CA_FILE = "head-ca.pem"  # agent.trust.CA_FILE
_SHOWN = {Status.ok: "[green]ok[/]", Status.warn: "[yellow]warn[/]", Status.fail: "[bold red]fail[/]"}


def doctor(
    ctx: typer.Context,
    role: Annotated[Role | None, typer.Option(help="head or node (default: told by what this machine holds)")] = None,
    data_dir: Annotated[Path | None, typer.Option(help="the head's state directory (env GPUFLEET_DATA_DIR)")] = None,
    state_dir: Annotated[
        Path | None, typer.Option(help="the agent's state directory (env GPUFLEET_AGENT_STATE_DIR)")
    ] = None,
    unit_dir: Annotated[
        Path, typer.Option(help="where the systemd units are; systemctl is asked only for the default")
    ] = DEFAULT_UNIT_DIR,
    min_free_gb: Annotated[float, typer.Option(min=0, help="least free space, in GB, where state is kept")] = 5.0,
    min_free_pct: Annotated[
        float, typer.Option(min=0, max=100, help="least free space, in percent of its filesystem")
    ] = 5.0,
    expect_gpus: Annotated[
        bool | None,
        typer.Option(
            "--expect-gpus/--no-expect-gpus",
            help="node: fail without working GPUs (default: expected where the PCI bus lists NVIDIA GPUs)",
        ),
    ] = None,
    timeout: Annotated[float, typer.Option(min=0.1, max=120, help="seconds to wait for the head or database")] = 5.0,
    output: Format = OutputOpt,
) -> None:
    """Check this head or node and say what is wrong and how to fix it: versions, database, clock, TLS,
    NVML, systemd unit, disk space. Exit status 1 when a check fails."""
    settings = state(ctx).settings(data_dir=data_dir, agent_state_dir=state_dir)
    chosen = role or detect_role(settings, unit_dir)
    found = run_checks(settings, chosen, unit_dir, min_free_gb, min_free_pct, expect_gpus, timeout)
    verdict = checks.worst(f.status for f in found)
    if output == Format.json:
        print_json({"role": str(chosen), "status": str(verdict), "checks": [f.as_dict() for f in found]})
    else:
        rows: list[dict[str, Any]] = [f.as_dict() | {"status": _SHOWN[f.status]} for f in found]
        table(
            rows,
            [("check", "CHECK"), ("status", "STATUS"), ("finding", "FINDING"), ("fix", "FIX")],
            title=f"gpufleet doctor: {chosen}",
        )
        failed = sum(f.status == Status.fail for f in found)
        warned = sum(f.status == Status.warn for f in found)
        console.print(f"{failed} failed, {warned} warning(s), {len(found) - failed - warned} ok")
    if verdict == Status.fail:
        raise typer.Exit(1)


def detect_role(settings: Settings, unit_dir: Path) -> Role:
    """Head where this machine holds a head's things (database_url, a data directory with a database or a
    CA key, the head's unit), else node where it holds an agent's (a credential, the agent's unit).

    Raises InvalidInput when it holds neither.
    """
    head = (
        settings.database_url is not None
        or (settings.data_dir / "gpufleet.db").exists()
        or (settings.data_dir / "tls" / "ca.key").exists()
        or (unit_dir / SERVER_UNIT).exists()
    )
    if head:
        return Role.head
    if (settings.agent_state_dir / CREDENTIAL_FILE).exists() or (unit_dir / AGENT_UNIT).exists():
        return Role.node
    raise InvalidInput(
        f"cannot tell whether this is a head or a node (no database in {settings.data_dir}, no credential in "
        f"{settings.agent_state_dir}, no gpufleet unit in {unit_dir}): pass --role head or --role node"
    )


def run_checks(
    settings: Settings,
    role: Role,
    unit_dir: Path,
    min_free_gb: float,
    min_free_pct: float,
    expect_gpus: bool | None,
    timeout_s: float,
) -> list[Finding]:
    """Every check of `role`, in the order printed."""
    found: list[Finding] = []
    url = head_url(settings) if role == Role.head else _node_server(settings)
    answer = probes.ask_head(url, timeout_s)
    found.append(checks.check_head(answer, role))
    if answer.answered:
        if answer.status_code == 200 or answer.version is not None:
            found.append(checks.check_versions(__version__, answer.version, role))
        found.append(checks.check_clock(answer.sent, answer.received, answer.date))
    if role == Role.head:
        database = probes.database_state(settings.effective_database_url, timeout_s)
        found.append(checks.check_database(database, timeout_s))
        found.append(_head_tls(settings, url, answer.answered, timeout_s))
    else:
        found.append(_credential(settings))
        if answer.answered:
            found.append(_node_trust(settings, url, timeout_s))
        found.append(checks.check_nvml(probes.nvml_state(), expect_gpus))
    found.append(_unit(role, unit_dir, timeout_s))
    where, label = (settings.data_dir, "data") if role == Role.head else (settings.agent_state_dir, "state")
    found.append(checks.check_disk(probes.disk_state(where, label), min_free_gb, min_free_pct))
    return found


def head_url(settings: Settings) -> str:
    """Where the head on this machine answers: its `listen` address (a wildcard as loopback), over
    HTTPS where it has a certificate."""
    host, port = settings.listen_host_port()
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)  # noqa: S104
    try:
        scheme = "https" if settings.effective_tls() else "http"
    except ConfigError:
        scheme = "https"
    return f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}"


def _node_server(settings: Settings) -> str:
    """The head this node's agent talks to: the server setting, or where it was left at its default,
    the head that issued the node's credential."""
    if settings.server != Settings.model_fields["server"].default:
        return settings.server
    issued_by, _ = _read_credential(settings.agent_state_dir / CREDENTIAL_FILE)
    return issued_by or settings.server


def _read_credential(path: Path) -> tuple[str | None, str | None]:
    """The server that issued the credential at `path`, or why it cannot be read."""
    from gpufleet.agent.credentials import CredentialStore

    try:
        credential = CredentialStore(path).load()
    except ConfigError as exc:
        return None, str(exc)
    return (credential.server if credential else None), None


def _credential(settings: Settings) -> Finding:
    from gpufleet.agent.credentials import CredentialStore

    path = settings.agent_state_dir / CREDENTIAL_FILE
    try:
        credential = CredentialStore(path).load()
    except ConfigError as exc:
        return checks.check_credential(path, None, None, str(exc), settings.server)
    server = _node_server(settings)
    if credential is None:
        return checks.check_credential(path, None, None, None, server)
    return checks.check_credential(path, credential.node, credential.server, None, server)


def _node_trust(settings: Settings, url: str, timeout_s: float) -> Finding:
    pinned_path = settings.agent_state_dir / PINNED_CA_FILE
    pinned, error = probes.read_text(pinned_path)
    if error is not None:
        return Finding("tls", Status.fail, error, "run `gpufleet doctor` as root or as the agent's user")
    verify_error = None
    trust = f"ca_file {settings.ca_file}" if settings.ca_file else "the system's CAs"
    if pinned is None and url.startswith("https://"):
        try:
            context = tls.client_context(ca_file=settings.ca_file)
        except ConfigError as exc:
            verify_error = str(exc)
        else:
            verify_error = probes.verify_error(url, context, timeout_s)
    return tls_checks.check_node_trust(
        url,
        settings.insecure_http,
        pinned,
        pinned_path,
        probes.served_ca(url, timeout_s),
        verify_error,
        trust,
    )


def _head_tls(settings: Settings, url: str, answered: bool, timeout_s: float) -> Finding:
    try:
        files = settings.effective_tls()
    except ConfigError as exc:
        return tls_checks.check_head_tls(None, False, dt.datetime.now(dt.UTC), None, str(exc))
    served = probes.served_ca(url, timeout_s) if answered else None
    return tls_checks.check_head_tls(files, settings.tls_cert is None, dt.datetime.now(dt.UTC), served)


def _unit(role: Role, unit_dir: Path, timeout_s: float) -> Finding:
    unit = SERVER_UNIT if role == Role.head else AGENT_UNIT
    present = (unit_dir / unit).is_file()
    unit_state = None
    if unit_dir == DEFAULT_UNIT_DIR and probes.systemd_running():
        unit_state = probes.unit_state(unit, timeout_s)
        # A unit a package installed lives in /usr/lib/systemd/system; systemctl knows it.
        present = present or not unit_state.enabled.startswith(("unknown", "not-found"))
    return checks.check_unit(role, unit_dir, present, unit_state)
