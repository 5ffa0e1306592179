"""The doctor's checks: each a plain function over what was observed, answering one `Finding`.

Nothing here reaches the network, a database or a driver (`probes` does that), so every check is
tested with plain values. A finding says in one line what is wrong and in one line how to fix it.
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.core import tls
from gpufleet.core.errors import ConfigError
from gpufleet.deploy.units import AGENT_UNIT, SERVER_UNIT  # the units `install-unit` writes

CLOCK_WARN_S = 2.0  # heartbeats and job times: a few seconds show in the dashboard's ages
CLOCK_FAIL_S = 30.0  # liveness, join-token and web-session expiry, certificate validity
CERT_WARN_DAYS = 30
TIME_SYNC_FIX = (
    "enable time synchronisation on this machine and the head: `timedatectl set-ntp true` "
    "(systemd-timesyncd) or install chrony"
)


class Role(enum.StrEnum):
    head = "head"
    node = "node"


class Status(enum.StrEnum):
    ok = "ok"
    warn = "warn"
    fail = "fail"


_RANK = {Status.ok: 0, Status.warn: 1, Status.fail: 2}


@dataclass(frozen=True)
class Finding:
    """One check's verdict: what it found, and the one thing to do about it (empty when ok)."""

    check: str
    status: Status
    finding: str
    fix: str = ""

    def as_dict(self) -> dict[str, str]:
        return {"check": self.check, "status": str(self.status), "finding": self.finding, "fix": self.fix}


def worst(statuses: Iterable[Status]) -> Status:
    """The most serious of `statuses`; ok for none."""
    return max(statuses, key=_RANK.__getitem__, default=Status.ok)


def _unit_of(role: Role) -> str:
    return SERVER_UNIT if role == Role.head else AGENT_UNIT


# --- the head: reachable, its version, its clock ---------------------------------------------------


@dataclass(frozen=True)
class HeadAnswer:
    """What the head said to one GET /healthz, with this machine's clock read before and after."""

    url: str
    sent: dt.datetime
    received: dt.datetime
    status_code: int | None = None
    health: str | None = None  # the answer's "status": ok, or error when its database does not answer
    version: str | None = None
    date: dt.datetime | None = None  # the HTTP Date header
    error: str | None = None  # why no answer came

    @property
    def answered(self) -> bool:
        return self.status_code is not None


def check_head(answer: HeadAnswer, role: Role) -> Finding:
    """Whether the head answers its health check. The version, clock and CA checks need an answer."""
    if not answer.answered:
        if role == Role.head:
            fix = f"start the head: `systemctl start {SERVER_UNIT}` (why it stopped: `journalctl -u {SERVER_UNIT}`)"
        else:
            fix = (
                f"check the server setting ({answer.url}), that the head runs and that this node reaches it "
                "(DNS, firewall, port)"
            )
        return Finding(
            "head",
            Status.fail,
            f"cannot reach the head at {answer.url}: {answer.error}; versions, clock and CA not compared",
            fix,
        )
    if answer.status_code == 503 or answer.health == "error":
        where = "see the database check" if role == Role.head else "run `gpufleet doctor --role head` on the head"
        return Finding("head", Status.fail, f"the head at {answer.url} answers but cannot reach its database", where)
    if answer.status_code != 200:
        return Finding(
            "head",
            Status.fail,
            f"{answer.url}/healthz answered HTTP {answer.status_code}",
            "check the server setting: is this URL a gpufleet head?",
        )
    return Finding("head", Status.ok, f"the head at {answer.url} answers")


def check_versions(local: str, head: str | None, role: Role) -> Finding:
    """This gpufleet's version against the running head's; a difference is a warning."""
    if head is None:
        return Finding(
            "versions", Status.warn, f"gpufleet {local} here; the head does not say its version", "upgrade the head"
        )
    if head == local:
        return Finding("versions", Status.ok, f"gpufleet {local} here and on the head")
    if role == Role.head:
        return Finding(
            "versions",
            Status.warn,
            f"gpufleet {local} is installed, but the running head is {head}",
            f"`gpufleet server --check-upgrade`, then `systemctl restart {SERVER_UNIT}`",
        )
    return Finding(
        "versions",
        Status.warn,
        f"this node's agent is gpufleet {local}, the head {head}",
        f"install gpufleet[agent]=={head} on this node, then `systemctl restart {AGENT_UNIT}`",
    )


def check_clock(
    sent: dt.datetime,
    received: dt.datetime,
    head_date: dt.datetime | None,
    warn_s: float = CLOCK_WARN_S,
    fail_s: float = CLOCK_FAIL_S,
) -> Finding:
    """This machine's clock against the head's HTTP Date header.

    The header holds whole seconds, cut down (and uvicorn renews it every tenth of a second), so the
    head's time when it answered lies in about [date, date + 1.1 s); the answer came between `sent`
    and `received`. Only what remains of the
    difference beyond that uncertainty counts against the thresholds.
    """
    if head_date is None:
        return Finding("clock", Status.warn, "the head sent no Date header: clocks not compared")
    round_trip = (received - sent).total_seconds()
    middle = sent + (received - sent) / 2
    skew = (middle - (head_date + dt.timedelta(seconds=0.5))).total_seconds()  # > 0: this clock is ahead
    slack = 0.6 + round_trip / 2
    beyond = max(0.0, abs(skew) - slack)
    said = f"this clock is {abs(skew):.1f} s {'ahead of' if skew > 0 else 'behind'} the head's (±{slack:.1f} s)"
    if beyond >= fail_s:
        return Finding("clock", Status.fail, f"{said}, over {fail_s:g} s", TIME_SYNC_FIX)
    if beyond >= warn_s:
        return Finding("clock", Status.warn, f"{said}, over {warn_s:g} s", TIME_SYNC_FIX)
    return Finding("clock", Status.ok, f"{said}: within {warn_s:g} s")


# --- TLS ------------------------------------------------------------------------------------------


def check_node_trust(
    server: str,
    insecure_http: bool,
    pinned_pem: str | None,
    pinned_path: Path,
    served_pem: str | None,
    verify_error: str | None,
    trust: str,
) -> Finding:
    """The CA this node pinned at its join (`pinned_pem`, from `pinned_path`) against the CA the head
    serves now (`served_pem`, from /ca.pem). Without a pin, whether the head's certificate verifies
    against what the agent would trust instead (`trust`: the ca_file or the system's CAs), as
    `verify_error` says."""
    if server.startswith("http://"):
        try:
            tls.check_plain_http(server, insecure_http)
        except ConfigError as exc:
            return Finding("tls", Status.fail, str(exc).split(". ")[0], "use the head's https:// URL")
        return Finding("tls", Status.ok, f"plain HTTP to {server} (loopback or insecure_http): no CA to compare")
    if pinned_pem is None:
        if verify_error is not None:
            return Finding(
                "tls",
                Status.fail,
                f"no CA pinned in {pinned_path.parent}, and the head's certificate does not verify against "
                f"{trust}: {verify_error}",
                "join with a join token that pins the head's CA (`gpufleet token create` on the head), "
                "or set ca_file to the head's CA",
            )
        return Finding("tls", Status.ok, f"no CA pinned; the head's certificate verifies against {trust}")
    return _compare_pin(pinned_pem, pinned_path, served_pem)


def _compare_pin(pinned_pem: str, pinned_path: Path, served_pem: str | None) -> Finding:
    rejoin = (
        f"if the head's CA was made anew on purpose, delete {pinned_path} and "
        f"{pinned_path.with_name('credential.json')} and join again with a new join token (`gpufleet token create` "
        "on the head); otherwise this is not your head, or someone is in between: check the server URL"
    )
    pinned = _fingerprint_or_none(pinned_pem)
    served = _fingerprint_or_none(served_pem) if served_pem is not None else None
    if pinned is None:
        return Finding("tls", Status.fail, f"{pinned_path} is not a PEM certificate", rejoin)
    if served is None:
        what = "no CA" if served_pem is None else "a /ca.pem that is not a PEM certificate"
        return Finding("tls", Status.fail, f"this node pinned CA {pinned}, but the head serves {what}", rejoin)
    if served != pinned:
        return Finding(
            "tls", Status.fail, f"the head serves CA {served}, but this node pinned {pinned} ({pinned_path})", rejoin
        )
    return Finding("tls", Status.ok, f"the head serves the CA this node pinned ({pinned})")


Problem = tuple[Status, str, str]  # how bad, what, the fix


def check_head_tls(
    files: tuple[Path, Path, Path | None] | None,
    own: bool,
    now: dt.datetime,
    served_ca_pem: str | None,
    error: str | None = None,
) -> Finding:
    """The head's server certificate, key and CA (`Settings.effective_tls()`; `error` when that
    refused), at `now`: readable, valid and not expiring within CERT_WARN_DAYS, the key the
    certificate's, the certificate signed by the CA, and the CA the running head serves (from
    /ca.pem, None where not asked) the one on disk. `own`: made by `gpufleet server init`."""
    if error is not None:
        return Finding("tls", Status.fail, error, "set both tls_cert and tls_key, or neither")
    if files is None:
        return Finding(
            "tls",
            Status.warn,
            "the head serves plain HTTP: agents and the CLI send their secrets unencrypted",
            f"`gpufleet server init`, then `systemctl restart {SERVER_UNIT}`",
        )
    from cryptography import x509

    cert_path, key_path, ca_path = files
    renew = (
        f"`gpufleet server init --reissue`, then `systemctl restart {SERVER_UNIT}`"
        if own
        else f"renew {cert_path} with your CA, then `systemctl restart {SERVER_UNIT}`"
    )
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    except OSError as exc:
        return Finding("tls", Status.fail, f"cannot read {cert_path}: {exc.strerror}", _read_fix(exc))
    except ValueError:
        return Finding("tls", Status.fail, f"{cert_path} is not a PEM certificate", renew)
    problems = _validity(cert, now, renew) + _key(cert, cert_path, key_path, renew)
    ca_said = ""
    if ca_path is not None:
        ca_problems, ca_fingerprint = _issuer(cert, cert_path, ca_path, served_ca_pem, renew)
        problems += ca_problems
        ca_said = f", signed by the CA {ca_fingerprint}" if ca_fingerprint else ""
    if problems:
        return Finding(
            "tls",
            worst(p[0] for p in problems),
            "; ".join(p[1] for p in problems),
            "; ".join(dict.fromkeys(p[2] for p in problems)),
        )
    until = cert.not_valid_after_utc
    days = int((until - now).total_seconds() // 86400)
    return Finding("tls", Status.ok, f"server certificate valid until {until:%Y-%m-%d} ({days} days){ca_said}")


def _validity(cert: Any, now: dt.datetime, renew: str) -> list[Problem]:
    until: dt.datetime = cert.not_valid_after_utc
    since: dt.datetime = cert.not_valid_before_utc
    days = (until - now).total_seconds() / 86400
    if since > now:
        return [(Status.fail, f"the certificate is valid only from {since:%Y-%m-%d %H:%M}Z", renew)]
    if until <= now:
        return [(Status.fail, f"the certificate expired on {until:%Y-%m-%d}", renew)]
    if days < CERT_WARN_DAYS:
        return [(Status.warn, f"the certificate expires on {until:%Y-%m-%d}, in {int(days)} days", renew)]
    return []


def _key(cert: Any, cert_path: Path, key_path: Path, renew: str) -> list[Problem]:
    from cryptography.hazmat.primitives import serialization

    der, spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    try:
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except OSError as exc:
        return [(Status.fail, f"cannot read {key_path}: {exc.strerror}", _read_fix(exc))]
    except (ValueError, TypeError):
        return [(Status.fail, f"{key_path} is not an unencrypted PEM private key", renew)]
    if key.public_key().public_bytes(der, spki) != cert.public_key().public_bytes(der, spki):
        return [(Status.fail, f"{key_path} is not the key of {cert_path}", renew)]
    return []


def _issuer(
    cert: Any, cert_path: Path, ca_path: Path, served_ca_pem: str | None, renew: str
) -> tuple[list[Problem], str | None]:
    """Whether the CA at `ca_path` signed `cert`, and whether the running head serves that CA; and the
    CA's fingerprint."""
    from cryptography import x509
    from cryptography.exceptions import InvalidSignature

    try:
        ca_pem = ca_path.read_text()
        ca = x509.load_pem_x509_certificate(ca_pem.encode())
    except OSError as exc:
        return [(Status.fail, f"cannot read {ca_path}: {exc.strerror}", _read_fix(exc))], None
    except ValueError:
        return [(Status.fail, f"{ca_path} is not a PEM certificate", renew)], None
    problems: list[Problem] = []
    ours = tls.fingerprint(ca_pem)
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        problems.append((Status.fail, f"{cert_path} is not signed by the CA in {ca_path}", renew))
    if served_ca_pem is not None and _fingerprint_or_none(served_ca_pem) != ours:
        problems.append(
            (
                Status.fail,
                f"the running head serves CA {_fingerprint_or_none(served_ca_pem)}, but {ca_path} is {ours}",
                f"`systemctl restart {SERVER_UNIT}` (the head reads its certificates on start)",
            )
        )
    return problems, ours


def _fingerprint_or_none(pem: str) -> str | None:
    try:
        return tls.fingerprint(pem)
    except ConfigError:
        return None


def _read_fix(exc: OSError) -> str:
    if isinstance(exc, PermissionError):
        return "run `gpufleet doctor` as root or as the user the head runs as"
    return "`gpufleet server init` makes the CA and the server certificate"


# --- the database ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class DatabaseState:
    """What reading the head's database told: its URL (password masked), and either why it could not
    be read or its schema revision against this gpufleet's."""

    url: str
    error: str | None = None
    missing: bool = False  # a SQLite file not created yet
    current: tuple[str, ...] = ()  # the revisions in alembic_version; () for no schema
    expected: tuple[str, ...] = ()  # this gpufleet's head revisions
    pending: int = 0  # migrations between current and expected
    unknown: tuple[str, ...] = ()  # current revisions this gpufleet does not know


def check_database(state: DatabaseState, timeout_s: float) -> Finding:
    """The head's database: reachable within `timeout_s`, its schema at this gpufleet's revision."""
    if state.error is not None:
        return Finding(
            "database",
            Status.fail,
            f"cannot reach the database {state.url} within {timeout_s:g} s: {state.error}",
            "check database_url (`gpufleet config show`) and that the database server runs and lets this host in "
            "(PostgreSQL: `pg_isready -h HOST -p PORT`)",
        )
    if state.missing:
        return Finding(
            "database",
            Status.warn,
            f"{state.url} does not exist yet",
            f"start the head (`systemctl start {SERVER_UNIT}`): it creates and migrates the database",
        )
    expected = ", ".join(state.expected)
    if not state.current:
        return Finding(
            "database",
            Status.warn,
            f"{state.url} answers but holds no gpufleet schema yet",
            "start the head: it migrates on start (`gpufleet server --check-upgrade` shows the plan)",
        )
    current = ", ".join(state.current)
    if state.unknown:
        return Finding(
            "database",
            Status.fail,
            f"{state.url} is at revision {current}, which this gpufleet (at {expected}) does not know: "
            "a newer gpufleet migrated it",
            "run that gpufleet release (or a later one), or restore a backup taken before the upgrade",
        )
    if state.pending:
        return Finding(
            "database",
            Status.warn,
            f"{state.url} is at revision {current}, this gpufleet at {expected}: {state.pending} migration(s) pending",
            f"`gpufleet server --check-upgrade` to see them, then `systemctl restart {SERVER_UNIT}` (it migrates on "
            "start)",
        )
    return Finding("database", Status.ok, f"{state.url} answers; schema at revision {current}")


# --- the node: its credential and its GPUs ----------------------------------------------------------


def check_credential(path: Path, node: str | None, issued_by: str | None, error: str | None, server: str) -> Finding:
    """The node's credential file: present and readable, issued by the head this node talks to."""
    if error is not None:
        return Finding("credential", Status.fail, error, f"delete {path} and join again with a join token")
    if node is None:
        return Finding(
            "credential",
            Status.warn,
            f"this node has not joined: no {path}",
            "start the agent once with `--join-token` (`gpufleet token create` on the head makes one)",
        )
    if issued_by is not None and issued_by != server:
        return Finding(
            "credential",
            Status.warn,
            f"node {node}'s credential comes from {issued_by}, but the server setting is {server}",
            f"set server (the unit's --server) to {issued_by}, or join {server} with a join token",
        )
    return Finding("credential", Status.ok, f"joined as node {node}")


@dataclass(frozen=True)
class NvmlState:
    """What NVML said: the GPUs it counts and the driver, or why it did not load; and how many NVIDIA
    GPUs the PCI bus lists, whatever the driver."""

    gpus: int | None = None
    driver: str | None = None
    error: str | None = None
    pci_gpus: int = 0


def check_nvml(state: NvmlState, expect_gpus: bool | None) -> Finding:
    """Whether NVML loads and counts the GPUs. Without it the node is a node with no GPUs: a warning,
    unless GPUs are expected (`expect_gpus`, or by default NVIDIA GPUs on the PCI bus)."""
    pci = f"the PCI bus lists {state.pci_gpus} NVIDIA GPU(s)" if state.pci_gpus else "GPUs are expected (--expect-gpus)"
    expected = state.pci_gpus > 0 if expect_gpus is None else expect_gpus
    if state.gpus is None:
        if state.error and "nvidia-ml-py" in state.error:
            fix = "`pip install 'gpufleet[agent]'` (nvidia-ml-py)"
        else:
            fix = f"install or load the NVIDIA driver (`nvidia-smi` lists the GPUs), then restart {AGENT_UNIT}"
        if expected:
            return Finding("nvml", Status.fail, f"NVML does not load ({state.error}), but {pci}", fix)
        return Finding(
            "nvml",
            Status.warn,
            f"no NVML (no NVIDIA driver?): {state.error}",
            f"none on a node without NVIDIA GPUs; on a GPU node: {fix}",
        )
    driver = f", driver {state.driver}" if state.driver else ""
    if state.gpus == 0 and expected:
        return Finding("nvml", Status.fail, f"NVML loads{driver} but counts no GPUs, while {pci}", _lost_gpu_fix())
    if state.gpus < state.pci_gpus:
        return Finding(
            "nvml",
            Status.warn,
            f"NVML counts {state.gpus} GPU(s), but the PCI bus lists {state.pci_gpus} NVIDIA GPUs",
            _lost_gpu_fix(),
        )
    return Finding("nvml", Status.ok, f"NVML loads: {state.gpus} GPU(s){driver}")


def _lost_gpu_fix() -> str:
    return "look for a GPU fallen off the bus or not bound to nvidia: `nvidia-smi`, `dmesg | grep -i xid`"


# --- systemd and the disk ---------------------------------------------------------------------------


@dataclass(frozen=True)
class UnitState:
    """What `systemctl is-enabled` and `systemctl is-active` answered for a unit."""

    enabled: str
    active: str


_ENABLED = frozenset({"enabled", "enabled-runtime", "static", "alias", "indirect", "generated"})


def check_unit(role: Role, unit_dir: Path, present: bool, state: UnitState | None) -> Finding:
    """The role's systemd unit: its file in `unit_dir`, and where systemd runs (`state`), enabled and active."""
    unit = _unit_of(role)
    if not present:
        command = "server" if role == Role.head else "agent"
        return Finding("unit", Status.fail, f"{unit} is not in {unit_dir}", f"`gpufleet {command} install-unit`")
    if state is None:
        return Finding("unit", Status.ok, f"{unit} is in {unit_dir} (systemd not asked: enabled and active unknown)")
    if state.active != "active":
        return Finding(
            "unit",
            Status.fail,
            f"{unit} is {state.active or 'unknown'} (enabled: {state.enabled or 'unknown'})",
            f"`systemctl enable --now {unit}`; why it stopped: `journalctl -u {unit}`",
        )
    if state.enabled not in _ENABLED:
        return Finding(
            "unit",
            Status.warn,
            f"{unit} is active but {state.enabled or 'not enabled'}: it will not start at boot",
            f"`systemctl enable {unit}`",
        )
    return Finding("unit", Status.ok, f"{unit} is enabled and active")


@dataclass(frozen=True)
class DiskState:
    """Free and total bytes of the filesystem holding `path` (read at `measured`, its nearest existing
    directory)."""

    path: Path
    measured: Path
    free: int
    total: int
    error: str | None = None
    label: str = field(default="data")


def check_disk(state: DiskState, min_free_gb: float, min_free_pct: float) -> Finding:
    """Free space where the head keeps its database or the agent its state: at least `min_free_gb`
    and `min_free_pct` of the filesystem."""
    name = f"disk ({state.label})"
    if state.error is not None:
        return Finding(name, Status.fail, f"cannot read the free space of {state.path}: {state.error}", "")
    pct = 100.0 * state.free / state.total if state.total else 0.0
    said = f"{state.path}: {state.free / 1e9:,.2f} GB free of {state.total / 1e9:,.2f} GB ({pct:.1f} %)"
    if state.measured != state.path:
        said += f" (measured at {state.measured}: {state.path} does not exist yet)"
    if state.free < min_free_gb * 1e9 or pct < min_free_pct:
        return Finding(
            name,
            Status.fail,
            f"{said}, below {min_free_gb:g} GB or {min_free_pct:g} %",
            f"free space on the filesystem holding {state.path} (old logs, images, caches) or grow it",
        )
    return Finding(name, Status.ok, said)
