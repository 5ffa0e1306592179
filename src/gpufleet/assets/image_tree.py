"""What a software image holds, read from its directory tree on the head (no chroot, no program run).

An image is a root filesystem, so its distribution and Debian/Ubuntu packages are files: os-release
(systemd reads /etc first, then /usr/lib) and dpkg's status file. That is what distribution advisories
are matched against, which is where an image's exposure lies; the drivers, firmware and GPU facts
the agent also reports belong to a running node, not to the files it will be built from.
"""

from __future__ import annotations

from pathlib import Path

from gpufleet.assets.installed import parse_dpkg_status, parse_os_release
from gpufleet.assets.records import Distro, Installed

DPKG_STATUS = "var/lib/dpkg/status"


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except (FileNotFoundError, NotADirectoryError):
        return None


def read_image(root: Path) -> tuple[Distro | None, list[Installed]]:
    """The distribution and the distribution packages of the tree at `root`.

    An image with no os-release or no dpkg database (a tarball of something else) holds no packages
    gpufleet can match: (None, []) or (distro, []), never an error.
    """
    distro = None
    for candidate in ("etc/os-release", "usr/lib/os-release"):
        text = _read(root / candidate)
        if text is not None:
            distro = parse_os_release(text)
            break
    status = _read(root / DPKG_STATUS)
    if status is None or distro is None:
        return distro, []
    return distro, parse_dpkg_status(status, distro.ecosystem)
