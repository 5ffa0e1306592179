"""Links from a distribution package to the name advisories give the same software elsewhere.

Some software ships as a distribution package but is advised under another ecosystem: NVIDIA's
Container Toolkit installs as the deb or rpm `nvidia-container-toolkit` while OSV and GitHub advise
it as the Go module `github.com/NVIDIA/nvidia-container-toolkit`, and the NVD (through its CPE) as
gpufleet's `NVIDIA` `container-toolkit`. A link says so, and the matcher then also judges the
installed package against those advisories, with its upstream version (`1.16.1-1` -> `1.16.1`).

`DEFAULT_LINKS` are the links gpufleet knows; an admin adds more with the `package_links` setting,
one `PACKAGE = ECOSYSTEM:NAME` line each (see docs/assets.md). Pure: the head and `cve scan` share it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from gpufleet.assets.records import ECOSYSTEMS

# A distribution package name (Debian policy's and RPM's characters), " = ", an ecosystem gpufleet
# compares versions in, ":", the name advisories use there (Go module paths have no colon).
_LINK = re.compile(
    r"\s*(?P<installed>[A-Za-z0-9][A-Za-z0-9+._-]*)\s*=\s*(?P<ecosystem>[^:=]+?)\s*:\s*(?P<advised>\S+)\s*"
)
# The upstream part of a deb or rpm version: no epoch ("1:"), no packaging revision ("-1ubuntu0.1").
_EPOCH = re.compile(r"^\d+:")
_REVISION = re.compile(r"-[^-]*$")
_DISTRIBUTIONS = frozenset(e for e, scheme in ECOSYSTEMS.items() if scheme in ("deb", "rpm"))


@dataclass(frozen=True)
class PackageLink:
    """Distribution package `installed` is advised as `advised` in `ecosystem` (Go, NVIDIA, PyPI...)."""

    installed: str
    ecosystem: str
    advised: str

    def __str__(self) -> str:
        return f"{self.installed} = {self.ecosystem}:{self.advised}"


TOOLKIT_MODULE = "github.com/NVIDIA/nvidia-container-toolkit"
DEFAULT_LINKS: tuple[PackageLink, ...] = (
    # NVIDIA Container Toolkit: the package and its -base (the runtime and nvidia-ctk since 1.11).
    PackageLink("nvidia-container-toolkit", "Go", TOOLKIT_MODULE),
    PackageLink("nvidia-container-toolkit-base", "Go", TOOLKIT_MODULE),
    PackageLink("nvidia-container-toolkit", "NVIDIA", "container-toolkit"),
    PackageLink("nvidia-container-toolkit-base", "NVIDIA", "container-toolkit"),
    # DCGM (the NVD's data_center_gpu_manager): the 3.x package and 4.x's core package.
    PackageLink("datacenter-gpu-manager", "NVIDIA", "dcgm"),
    PackageLink("datacenter-gpu-manager-4-core", "NVIDIA", "dcgm"),
)


def parse_link(text: str) -> PackageLink:
    """`PACKAGE = ECOSYSTEM:NAME` as a PackageLink; ValueError saying what is wrong."""
    match = _LINK.fullmatch(text)
    if match is None:
        raise ValueError(
            f"package link {text!r} is not 'PACKAGE = ECOSYSTEM:NAME' "
            "(e.g. 'nvidia-container-toolkit = Go:github.com/NVIDIA/nvidia-container-toolkit')"
        )
    ecosystem = match["ecosystem"]
    if ecosystem not in ECOSYSTEMS or ecosystem in _DISTRIBUTIONS:
        known = ", ".join(sorted(set(ECOSYSTEMS) - _DISTRIBUTIONS))
        raise ValueError(f"package link {text!r}: the advisories' ecosystem must be one of {known}")
    return PackageLink(match["installed"], ecosystem, match["advised"])


def package_links(extra: Iterable[str] = ()) -> tuple[PackageLink, ...]:
    """The default links and the admin's (`package_links` lines), without duplicates."""
    return tuple(dict.fromkeys([*DEFAULT_LINKS, *(parse_link(line) for line in extra)]))


def upstream_version(version: str, scheme: str) -> str:
    """A deb or rpm package's version as its upstream project numbers it, for comparing with an
    advisory in `scheme`: no epoch, no packaging revision; Debian's `~` pre-release mark as semver's
    `-` (`1.17.0~rc.1-1` -> `1.17.0-rc.1`)."""
    upstream = _REVISION.sub("", _EPOCH.sub("", version))
    return upstream.replace("~", "-", 1) if scheme == "semver" else upstream
