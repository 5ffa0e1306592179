"""Host facts for the inventory: hostname, CPUs, memory, OS, kernel (psutil and /etc/os-release)."""

from __future__ import annotations

import platform
import socket
from dataclasses import dataclass
from pathlib import Path

import psutil


@dataclass(frozen=True)
class HostFacts:
    hostname: str
    cpus: int
    cpu_model: str | None
    memory_total_mib: int
    os_name: str | None
    kernel: str | None
    arch: str | None


def parse_os_release(text: str) -> dict[str, str]:
    """Parse /etc/os-release (shell-style KEY=value lines, values optionally quoted)."""
    values: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        values[key.strip()] = value
    return values


def _cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def read_host_facts(os_release: Path = Path("/etc/os-release")) -> HostFacts:
    """Read this machine's facts. Missing sources give None, never an error."""
    try:
        release = parse_os_release(os_release.read_text())
    except OSError:
        release = {}
    return HostFacts(
        hostname=socket.gethostname(),
        cpus=psutil.cpu_count(logical=True) or 0,
        cpu_model=_cpu_model(),
        memory_total_mib=psutil.virtual_memory().total // (1024 * 1024),
        os_name=release.get("PRETTY_NAME") or release.get("NAME"),
        kernel=platform.release() or None,
        arch=platform.machine() or None,
    )
