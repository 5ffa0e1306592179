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
