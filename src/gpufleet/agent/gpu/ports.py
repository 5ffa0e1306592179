"""The one interface every GPU backend implements, its error, and helpers the backends share."""

from __future__ import annotations

import re
from typing import Protocol

from gpufleet.protocol.inventory import GpuInfo, GpuSource

BYTES_PER_MIB = 1024 * 1024

# domain:bus:device.function, with the domain optional (lspci style) and of any width up to 8 digits:
# NVML's legacy field has 4, its current one and nvidia-smi have 8.
_PCI_BUS_ID = re.compile(
    r"^(?:(?P<domain>[0-9a-f]{1,8}):)?(?P<bus>[0-9a-f]{1,2}):(?P<device>[0-9a-f]{1,2})\.(?P<function>[0-7])$"
)


class GpuReadError(Exception):
    """A backend could not read the GPUs at all: library or tool missing, driver down, output unparsable."""


class GpuReader(Protocol):
    """Something that lists the GPUs of this machine, and says which backend it is."""

    source: GpuSource

    def read(self) -> list[GpuInfo]:
        """Return every GPU the backend sees, in its index order.

        Raises GpuReadError when the backend is unavailable or its answer cannot be understood.
        """
        ...


def as_text(value: str | bytes) -> str:
    """Return a driver string as str: nvidia-ml-py returns bytes or str depending on its version and field."""
    if isinstance(value, bytes):
        # Driver strings are ASCII; a stray byte should not cost us the whole inventory.
        value = value.decode("utf-8", errors="replace")
    # ctypes char arrays can carry the C terminator along when a caller slices them raw.
    return value.rstrip("\x00").strip()


def normalise_pci_bus_id(value: str | bytes) -> str:
    """Return a PCI bus id as "00000000:2a:00.0": 8-digit domain, lowercase.

    NVML's busId, its legacy busIdLegacy ("0000:2A:00.0") and nvidia-smi spell the same address
    differently; one spelling lets the head match a GPU across backends and restarts.
    A value that is not a bus id at all is returned trimmed and lowercased rather than refused,
    since losing the whole inventory over one odd field would help nobody.
    """
    text = as_text(value).lower()
    match = _PCI_BUS_ID.match(text)
    if match is None:
        return text
    domain = int(match["domain"] or "0", 16)
    bus = int(match["bus"], 16)
    device = int(match["device"], 16)
    return f"{domain:08x}:{bus:02x}:{device:02x}.{match['function']}"


def bytes_to_mib(value: int) -> int:
    """Whole MiB in a byte count, rounded down (GPU memory sizes are whole MiB in practice)."""
    return value // BYTES_PER_MIB
