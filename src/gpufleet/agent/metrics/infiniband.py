"""InfiniBand (and RoCE) ports from /sys/class/infiniband: state, physical state, rate and error counters.

The files are the kernel's (drivers/infiniband/core/sysfs.c): `state` reads "4: ACTIVE",
`phys_state` "5: LinkUp", `rate` "400 Gb/sec (4X NDR)", and each counter under `counters/` a bare
number, or "N/A (no PMA)" where the adapter keeps none. Reading goes through an `IbSource`, so the
simulator can hand the same collector its simulated ports.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from gpufleet.agent.metrics.ports import Collected

SYSFS_ROOT = Path("/sys/class/infiniband")

# counters/<file> -> metric
COUNTERS: dict[str, str] = {
    "link_downed": "ib_link_downed",
    "symbol_error": "ib_symbol_errors",
    "link_error_recovery": "ib_link_error_recovery",
    "port_rcv_errors": "ib_rcv_errors",
    "port_xmit_discards": "ib_xmit_discards",
}
MAX_PORTS = 64
_LEADING_NUMBER = re.compile(r"^\s*(\d+)\s*:")
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec")
_NAME = re.compile(r"^\S{1,60}$")


class IbSource(Protocol):
    """Where the port files come from: sysfs on a real node, memory in the simulator."""

    def ports(self) -> list[tuple[str, int]]:
        """(device, port number) of every port, in a stable order; empty where there is no InfiniBand."""
        ...

    def read(self, device: str, port: int, attribute: str) -> str | None:
        """The text of one port file (`state`, `counters/link_downed`), or None if it cannot be read."""
        ...


class SysfsInfiniband:
    """The port files under a sysfs root (`/sys/class/infiniband`; a temporary tree in tests)."""

    def __init__(self, root: Path = SYSFS_ROOT) -> None:
        self.root = root

    def ports(self) -> list[tuple[str, int]]:
        """Every port of every device; none if the root is missing (a node without RDMA adapters)."""
        found: list[tuple[str, int]] = []
        try:
            devices = sorted(self.root.iterdir())
        except OSError:
            return found
        for device in devices:
            try:
                numbers = sorted(int(p.name) for p in (device / "ports").iterdir() if p.name.isdigit())
            except OSError:
                continue
            found.extend((device.name, number) for number in numbers)
        return found

    def read(self, device: str, port: int, attribute: str) -> str | None:
        """One file's text, or None when it is missing or unreadable."""
        try:
            return (self.root / device / "ports" / str(port) / attribute).read_text()
        except OSError:
            return None


class IbCollector:
    """One `ib:<device>/<port>` entity per port, from any IbSource."""

    name = "infiniband"

    def __init__(self, source: IbSource | None = None) -> None:
        self.source: IbSource = source if source is not None else SysfsInfiniband()

    def collect(self) -> Collected:
        """Read every port; a value that is missing or unreadable is left out. Raises OSError only if the
        source itself fails unexpectedly."""
        out = Collected()
        for device, port in self.source.ports()[:MAX_PORTS]:
            if not _NAME.match(device):
                continue
            values = port_values(functools.partial(self.source.read, device, port))
            if values:
                out.entities[f"ib:{device}/{port}"] = values
        return out


def port_values(read: Callable[[str], str | None]) -> dict[str, float]:
    """The metrics of one port, given a function that reads its files."""
    values: dict[str, float] = {}
    for attribute, metric in (("state", "ib_state"), ("phys_state", "ib_phys_state")):
        number = leading_number(read(attribute))
        if number is not None:
            values[metric] = float(number)
    rate = rate_gbps(read("rate"))
    if rate is not None:
        values["ib_rate_gbps"] = rate
    for counter, metric in COUNTERS.items():
        text = read(f"counters/{counter}")
        if text is not None and text.strip().isdigit():
            values[metric] = float(int(text))
    return values


def leading_number(text: str | None) -> int | None:
    """4 from "4: ACTIVE\\n", 5 from "5: LinkUp"; None for anything else."""
    if text is None:
        return None
    match = _LEADING_NUMBER.match(text)
    return int(match.group(1)) if match else None


def rate_gbps(text: str | None) -> float | None:
    """400.0 from "400 Gb/sec (4X NDR)", 2.5 from "2.5 Gb/sec (1X SDR)"; None for anything else."""
    if text is None:
        return None
    match = _RATE.match(text)
    return float(match.group(1)) if match else None
