"""What a simulated node reports as its software: the agent's real collector (agent.software) over a
small file tree of the node's own and its simulated NVML, so the head, the asset views and the CVE
matching see a node like a real one: Ubuntu 22.04 packages with their source packages, the driver,
CUDA and each GPU's VBIOS as the simulated NVML reports them.

The packages are real Ubuntu 22.04 (jammy) packages at versions jammy once shipped, and the NVIDIA
Container Toolkit from NVIDIA's apt repository (advised as a Go module: assets.links matches it); the
status file names each package's source, as dpkg records it. `variant` moves a node to an older image
(as a node left behind by an upgrade), so a simulated fleet shows drift and, once advisories are
imported, findings: the older image's glibc predates the fix of CVE-2023-4911 and its toolkit the fix
of CVE-2024-0132.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from gpufleet.agent.software import collect_software
from gpufleet.protocol.software import SoftwareInventory
from gpufleet.sim.nvml import SimulatedNvml

OS_RELEASE = 'NAME="Ubuntu"\nVERSION_ID="22.04"\nID=ubuntu\nID_LIKE=debian\nVERSION_CODENAME=jammy\n'
KERNELS = {"current": "5.15.0-126-generic", "older": "5.15.0-91-generic"}
# (package, version, source, source version) of jammy's releases, newer and older image.
IMAGES: dict[str, list[tuple[str, str, str, str]]] = {
    "current": [
        ("libc6", "2.35-0ubuntu3.8", "glibc", "2.35-0ubuntu3.8"),
        ("libc-bin", "2.35-0ubuntu3.8", "glibc", "2.35-0ubuntu3.8"),
        ("openssl", "3.0.2-0ubuntu1.18", "openssl", "3.0.2-0ubuntu1.18"),
        ("libssl3", "3.0.2-0ubuntu1.18", "openssl", "3.0.2-0ubuntu1.18"),
        ("sudo", "1.9.9-1ubuntu2.4", "sudo", "1.9.9-1ubuntu2.4"),
        ("openssh-server", "1:8.9p1-3ubuntu0.10", "openssh", "1:8.9p1-3ubuntu0.10"),
        ("bash", "5.1-6ubuntu1.1", "bash", "5.1-6ubuntu1.1"),
        ("python3.10", "3.10.12-1~22.04.6", "python3.10", "3.10.12-1~22.04.6"),
        ("nvidia-container-toolkit", "1.17.3-1", "nvidia-container-toolkit", "1.17.3-1"),
        ("nvidia-container-toolkit-base", "1.17.3-1", "nvidia-container-toolkit", "1.17.3-1"),
    ],
    "older": [
        ("libc6", "2.35-0ubuntu3.1", "glibc", "2.35-0ubuntu3.1"),
        ("libc-bin", "2.35-0ubuntu3.1", "glibc", "2.35-0ubuntu3.1"),
        ("openssl", "3.0.2-0ubuntu1.10", "openssl", "3.0.2-0ubuntu1.10"),
        ("libssl3", "3.0.2-0ubuntu1.10", "openssl", "3.0.2-0ubuntu1.10"),
        ("sudo", "1.9.9-1ubuntu2.2", "sudo", "1.9.9-1ubuntu2.2"),
        ("openssh-server", "1:8.9p1-3ubuntu0.1", "openssh", "1:8.9p1-3ubuntu0.1"),
        ("bash", "5.1-6ubuntu1", "bash", "5.1-6ubuntu1"),
        ("python3.10", "3.10.6-1~22.04.2", "python3.10", "3.10.6-1~22.04.2"),
        ("nvidia-container-toolkit", "1.16.1-1", "nvidia-container-toolkit", "1.16.1-1"),
        ("nvidia-container-toolkit-base", "1.16.1-1", "nvidia-container-toolkit", "1.16.1-1"),
    ],
}


def _status(packages: list[tuple[str, str, str, str]]) -> str:
    stanzas = []
    for name, version, source, source_version in packages:
        source_field = source if source_version == version else f"{source} ({source_version})"
        stanzas.append(
            f"Package: {name}\nStatus: install ok installed\nArchitecture: amd64\nVersion: {version}\n"
            f"Source: {source_field}\n"
        )
    return "\n".join(stanzas)


def _no_commands(argv: list[str], **_kwargs: Any) -> subprocess.CompletedProcess[str]:
    """A simulated node runs no programs: every command the collector tries is missing."""
    raise FileNotFoundError(argv[0])


class SimulatedSoftware:
    def __init__(self, root: Path, nvml: SimulatedNvml, variant: str = "current") -> None:
        self.root = root
        self.nvml = nvml
        (root / "etc").mkdir(parents=True, exist_ok=True)
        (root / "etc" / "os-release").write_text(OS_RELEASE)
        (root / "var" / "lib" / "dpkg").mkdir(parents=True, exist_ok=True)
        (root / "var" / "lib" / "dpkg" / "status").write_text(_status(IMAGES[variant]))
        (root / "proc" / "sys" / "kernel").mkdir(parents=True, exist_ok=True)
        (root / "proc" / "sys" / "kernel" / "osrelease").write_text(KERNELS[variant] + "\n")

    def __call__(self) -> SoftwareInventory:
        return collect_software(self.root, run=_no_commands, nvml=self.nvml, pip_envs=[])
