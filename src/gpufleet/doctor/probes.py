"""What the doctor observes: the head over HTTP, the database, NVML, systemd, the disk.

Each probe answers plain values for `checks` and raises nothing for what it finds broken: a failure
to observe is itself what it reports. The server's and the agent's libraries (SQLAlchemy, Alembic,
nvidia-ml-py) are imported inside the probe that needs them, so a node without the server's
dependencies runs the node's checks, and a head without NVML the head's.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import email.utils
import os
import shutil
import ssl
import subprocess
from pathlib import Path
from typing import Any

import httpx

from gpufleet.doctor.checks import DatabaseState, DiskState, HeadAnswer, NvmlState, UnitState

SYSTEMD_RUNNING = Path("/run/systemd/system")  # what sd_booted(3) looks at
PCI_DEVICES = Path("/sys/bus/pci/devices")
NVIDIA_VENDOR = "0x10de"


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def ask_head(url: str, timeout_s: float) -> HeadAnswer:
    """GET /healthz from the head, unverified: nothing secret is sent, and the TLS check judges the
    head's certificate on its own, so a broken trust does not hide the version and the clock."""
    sent = _now()
    try:
        response = httpx.get(url + "/healthz", timeout=timeout_s, verify=False)  # noqa: S501
    except httpx.HTTPError as exc:
        return HeadAnswer(url, sent, _now(), error=_reason(exc) or type(exc).__name__)
    received = _now()
    body: dict[str, Any] = {}
    try:
        parsed = response.json()
        body = parsed if isinstance(parsed, dict) else {}
    except ValueError:
        pass
    date = None
    if "date" in response.headers:
        try:
            date = email.utils.parsedate_to_datetime(response.headers["date"])
        except (TypeError, ValueError):
            date = None
    return HeadAnswer(
        url,
        sent,
        received,
        status_code=response.status_code,
        health=str(body["status"]) if "status" in body else None,
        version=str(body["version"]) if "version" in body else None,
        date=date,
    )


def served_ca(url: str, timeout_s: float) -> str | None:
    """The CA the head serves at /ca.pem (unverified, as the agent fetches it to compare with its pin);
    None where it serves none or cannot be asked."""
    if not url.startswith("https://"):
        return None
    try:
        response = httpx.get(url + "/ca.pem", timeout=timeout_s, verify=False)  # noqa: S501
    except httpx.HTTPError:
        return None
    return response.text if response.status_code == 200 else None


def verify_error(url: str, context: ssl.SSLContext, timeout_s: float) -> str | None:
    """Why a connection verified with `context` fails, or None when the head's certificate verifies."""
    try:
        httpx.get(url + "/healthz", timeout=timeout_s, verify=context)
    except httpx.HTTPError as exc:
        return _reason(exc)
    return None


def read_text(path: Path) -> tuple[str | None, str | None]:
    """The file's text and None, or None and why it cannot be read; (None, None) where it does not exist."""
    try:
        return path.read_text(), None
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"cannot read {path}: {exc.strerror}"


def database_state(url: str, timeout_s: float) -> DatabaseState:
    """Connect to the head's database with a `timeout_s` connect timeout and read its schema revision
    against this gpufleet's migrations (`migrations.status`, what `gpufleet server --check-upgrade`
    reports). A SQLite file that does not exist is not created."""
    try:
        from sqlalchemy import create_engine, make_url
        from sqlalchemy.exc import ArgumentError, SQLAlchemyError
        from sqlalchemy.pool import NullPool

        from gpufleet.migrations.status import newest, schema_status
    except ImportError as exc:
        return DatabaseState(url="(database_url)", error=f"{exc.name} is missing: pip install 'gpufleet[server]'")
    try:
        parsed = make_url(url)
    except ArgumentError:
        return DatabaseState(url="(database_url)", error="database_url is not a valid SQLAlchemy URL")
    shown = parsed.render_as_string(hide_password=True)
    expected = (newest(),)
    connect_args: dict[str, Any] = {}
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        if parsed.database and parsed.database != ":memory:" and not Path(parsed.database).exists():
            return DatabaseState(url=shown, missing=True, expected=expected)
        connect_args["timeout"] = timeout_s
    elif backend == "postgresql":
        connect_args["connect_timeout"] = max(1, round(timeout_s))
    engine = create_engine(parsed, poolclass=NullPool, connect_args=connect_args)
    try:
        with engine.connect() as conn:
            status = schema_status(conn)
    except (SQLAlchemyError, OSError) as exc:
        cause = getattr(exc, "orig", None) or exc
        return DatabaseState(url=shown, error=_reason(cause), expected=expected)
    except ImportError as exc:  # the URL names a driver not installed
        return DatabaseState(url=shown, error=f"{exc.name} is missing", expected=expected)
    finally:
        engine.dispose()
    current = (status.current,) if status.current is not None else ()
    return DatabaseState(
        url=shown,
        current=current,
        expected=expected,
        pending=0 if status.newer else len(status.pending),
        unknown=current if status.newer else (),
    )


def nvml_state(pci_root: Path = PCI_DEVICES) -> NvmlState:
    """Load NVML as the agent does, count the GPUs and read the driver version; count the NVIDIA
    display and 3D controllers on the PCI bus under `pci_root`."""
    pci = pci_gpus(pci_root)
    try:
        import pynvml
    except ImportError:
        return NvmlState(error="nvidia-ml-py is not installed", pci_gpus=pci)
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return NvmlState(error=str(exc), pci_gpus=pci)
    try:
        count = int(pynvml.nvmlDeviceGetCount())
        try:
            driver: str | None = str(pynvml.nvmlSystemGetDriverVersion())
        except pynvml.NVMLError:
            driver = None
        return NvmlState(gpus=count, driver=driver, pci_gpus=pci)
    except pynvml.NVMLError as exc:
        return NvmlState(error=str(exc), pci_gpus=pci)
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()


def pci_gpus(root: Path = PCI_DEVICES) -> int:
    """NVIDIA display controllers (PCI class 0x03xx: VGA and 3D) under `root`; NVSwitches are bridges."""
    count = 0
    try:
        devices = list(root.iterdir())
    except OSError:
        return 0
    for device in devices:
        try:
            vendor = (device / "vendor").read_text().strip()
            klass = (device / "class").read_text().strip()
        except OSError:
            continue
        if vendor == NVIDIA_VENDOR and klass.startswith("0x03"):
            count += 1
    return count


def systemd_running(marker: Path = SYSTEMD_RUNNING) -> bool:
    """Whether this machine booted with systemd and systemctl is there to ask."""
    return marker.is_dir() and shutil.which("systemctl") is not None


def unit_state(unit: str, timeout_s: float) -> UnitState:
    """`systemctl is-enabled UNIT` and `systemctl is-active UNIT`, their first line each."""

    systemctl = shutil.which("systemctl") or "/usr/bin/systemctl"

    def ask(verb: str) -> str:
        try:
            done = subprocess.run(
                [systemctl, verb, unit], capture_output=True, text=True, timeout=timeout_s, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"unknown ({_reason(exc)})"
        lines = done.stdout.strip().splitlines()
        return lines[0] if lines else "unknown"

    return UnitState(enabled=ask("is-enabled"), active=ask("is-active"))


def disk_state(path: Path, label: str) -> DiskState:
    """Free and total bytes of the filesystem holding `path`, measured at its nearest existing directory
    (a head not started yet has no data directory)."""
    measured = path
    while not measured.exists() and measured.parent != measured:
        measured = measured.parent
    try:
        stat = os.statvfs(measured)
    except OSError as exc:
        return DiskState(path, measured, 0, 0, error=exc.strerror or str(exc), label=label)
    return DiskState(path, measured, stat.f_bavail * stat.f_frsize, stat.f_blocks * stat.f_frsize, label=label)
