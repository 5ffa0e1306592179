"""Which NVIDIA driver a CUDA version needs: the rule the scheduler and `gpufleet env check` apply, and
the simulator follows when it reports an older driver.

A program built with CUDA X.Y needs, for full compatibility, a driver at least as new as the one that
toolkit shipped with: NVIDIA's "CUDA Toolkit and Corresponding Driver Versions" table (CUDA Toolkit
release notes, Linux x86_64 column, the GA release of each minor version), kept below. CUDA's minor
version compatibility (a 12.x program on any 525.60.13+ driver) holds only for programs that need no
newer PTX JIT or driver features, and the forward-compatibility package only on data-center GPUs, so an
environment that relies on either names its own `min_driver` instead of this table's.

Driver versions are compared as numbers ("550.54.14" < "550.127.05"), never as text.
"""

from __future__ import annotations

import re

from gpufleet.core.errors import InvalidInput

DriverVersion = tuple[int, ...]  # "550.54.14" -> (550, 54, 14): compared as numbers, never as text

# CUDA major.minor -> the Linux driver its GA toolkit shipped with (NVIDIA's table, see above).
TOOLKIT_DRIVER: dict[tuple[int, int], DriverVersion] = {
    (11, 0): (450, 51, 5),
    (11, 1): (455, 23, 0),
    (11, 2): (460, 27, 3),
    (11, 3): (465, 19, 1),
    (11, 4): (470, 42, 1),
    (11, 5): (495, 29, 5),
    (11, 6): (510, 39, 1),
    (11, 7): (515, 43, 4),
    (11, 8): (520, 61, 5),
    (12, 0): (525, 60, 13),
    (12, 1): (530, 30, 2),
    (12, 2): (535, 54, 3),
    (12, 3): (545, 23, 6),
    (12, 4): (550, 54, 14),
    (12, 5): (555, 42, 2),
    (12, 6): (560, 28, 3),
    (12, 8): (570, 26, 0),
    (12, 9): (575, 51, 3),
    (13, 0): (580, 65, 6),
}

_DRIVER = re.compile(r"\d{1,4}(\.\d{1,4}){0,2}", re.ASCII)
_CUDA = re.compile(r"(\d{1,2})\.(\d{1,2})(\.\d{1,4})?", re.ASCII)


def parse_driver(text: str) -> DriverVersion:
    """A driver version as three numbers: "550.54.14" -> (550, 54, 14), "570.26" -> (570, 26, 0). Always
    three, so that tuples compare as versions ((570, 26) would sort before (570, 26, 0)). InvalidInput for
    anything else."""
    if not _DRIVER.fullmatch(text.strip()):
        raise InvalidInput(f"{text!r} is not an NVIDIA driver version (like 550.54.14)")
    parts = [int(part) for part in text.strip().split(".")]
    return tuple(parts + [0] * (3 - len(parts)))


def format_driver(version: DriverVersion) -> str:
    """(550, 54, 14) -> "550.54.14", with the two-digit minor fields NVIDIA writes ("525.60.13", "470.42.01");
    trailing fields of 0 are left out, as NVIDIA writes it: (570, 26, 0) -> "570.26"."""
    head, *rest = version
    while rest and rest[-1] == 0:
        rest.pop()
    return ".".join([str(head), *(f"{part:02d}" for part in rest)])


def parse_cuda(text: str) -> tuple[int, int]:
    """ "12.4" or "12.4.1" -> (12, 4). InvalidInput for anything else."""
    found = _CUDA.fullmatch(text.strip())
    if found is None:
        raise InvalidInput(f"{text!r} is not a CUDA version (like 12.4)")
    return int(found.group(1)), int(found.group(2))


def driver_for_cuda(cuda: str) -> DriverVersion:
    """The least driver that runs CUDA `cuda` fully. InvalidInput for a version not in the table: the
    environment must then say which driver it needs."""
    version = parse_cuda(cuda)
    found = TOOLKIT_DRIVER.get(version)
    if found is None:
        known = ", ".join(f"{major}.{minor}" for major, minor in TOOLKIT_DRIVER)
        raise InvalidInput(
            f"CUDA {cuda} is not in gpufleet's driver table ({known}); give the driver it needs (--min-driver)"
        )
    return found


def newest_cuda(driver: DriverVersion) -> tuple[int, int] | None:
    """The newest CUDA version in the table that `driver` runs fully; None if it is older than them all."""
    fits = [cuda for cuda, needs in TOOLKIT_DRIVER.items() if driver >= needs]
    return max(fits) if fits else None
