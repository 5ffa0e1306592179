"""The software inventory of this node: distribution and Python packages, the NVIDIA stack, firmware.

Every source is optional: a missing tool, an unreadable file or a machine without a GPU is noted in
the inventory's `notes` and the rest is still collected. What is reported, by ecosystem:

- the distribution's packages (ecosystem "Ubuntu", "Debian", "Rocky Linux", ...): dpkg-query, or
  /var/lib/dpkg/status, or rpm; each with the source package advisories may name instead (Debian's
  ${source:Package} and its version, rpm's %{SOURCERPM});
- Python distributions ("PyPI", normalized names) from each environment's *.dist-info/METADATA, no
  subprocess; location: the site-packages directory;
- "Linux" "kernel": uname -r (also the inventory's `kernel`);
- "NVIDIA" "driver" (/proc/driver/nvidia/version, else NVML), "cuda-driver" (the CUDA version the driver
  supports, NVML's 13000 -> "13.0"), "cuda-toolkit" (/usr/local/cuda*/version.json), "cudnn" and "nccl"
  (headers' #defines, libcudnn.so.X.Y.Z / libnccl.so.X.Y.Z); location: the directory;
- "firmware": "gpu-vbios" and "gpu-inforom" per GPU (NVML; location "<index>/<uuid>"), "hca" per
  InfiniBand/RoCE device (/sys/class/infiniband/<dev>/fw_ver; location "<dev>; board_id=...; hca_type=..."),
  "bios" (/sys/class/dmi/id, no root needed; location "system=<vendor> <product>; bios_vendor=...; ...");
- "container-image": podman's and docker's images; name the repository, version the tag, location the
  image id.

`root` relocates every file read (tests point it at a fake tree; the package databases are then read
from the tree too: /var/lib/dpkg/status directly, rpm with --root). NVML and the container tools always
describe the running machine. `python -m gpufleet.agent.software` prints what this node has.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gpufleet.agent.gpu.nvml import cuda_version_text
from gpufleet.agent.gpu.nvml_api import NvmlLibrary, NvmlUnavailable
from gpufleet.agent.gpu.ports import as_text
from gpufleet.assets.installed import (
    DPKG_QUERY_FORMAT,
    RPM_QUERY_FORMAT,
    export_json,
    parse_dpkg_query,
    parse_dpkg_status,
    parse_os_release,
    parse_rpm_qa,
)
from gpufleet.assets.records import ECOSYSTEMS, Distro, Installed
from gpufleet.protocol.software import MAX_NOTES, MAX_PACKAGES, SoftwareInventory, SoftwarePackage, package_digest

logger = logging.getLogger(__name__)

Runner = Callable[..., subprocess.CompletedProcess[Any]]

# Python environments read by default (relative to root): pip's target for root on Debian/Ubuntu
# (/usr/local/lib/python3.X/dist-packages), NGC containers, and a conda base. /usr itself is left out:
# its dist-packages belong to dpkg or rpm, which already report them with the distribution's versions.
DEFAULT_PIP_ENVS: tuple[Path, ...] = (Path("/usr/local"), Path("/opt/conda"))
COMMAND_TIMEOUT_S = 60.0
MAX_IMAGES = 500
# Where the dynamic linker finds cuDNN and NCCL on Debian, Ubuntu and RHEL, and in CUDA toolkits.
LIBRARY_DIRS = ("usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu", "usr/lib64", "usr/local/cuda*/lib64")
INCLUDE_DIRS = (
    "usr/include",
    "usr/include/x86_64-linux-gnu",
    "usr/include/aarch64-linux-gnu",
    "usr/local/cuda*/include",
)

# "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (nixbld@)"
_NVRM_VERSION = re.compile(r"NVRM version:.*?\s(\d+\.\d+(?:\.\d+)?)\s")
_LIBRARIES = {
    "cudnn": re.compile(r"^libcudnn\.so\.(\d+\.\d+\.\d+)$"),
    "nccl": re.compile(r"^libnccl\.so\.(\d+\.\d+\.\d+)$"),
}
# (header glob, the three #define names of major, minor, patch)
_HEADERS = {
    "cudnn": ("cudnn_version*.h", ("CUDNN_MAJOR", "CUDNN_MINOR", "CUDNN_PATCHLEVEL")),
    "nccl": ("nccl.h", ("NCCL_MAJOR", "NCCL_MINOR", "NCCL_PATCH")),
}


class Skipped(Exception):
    """One source could not be read here; the message says why (it becomes a note)."""


@dataclass
class _Node:
    """What the sources read from: the file tree, the command runner and NVML."""

    root: Path
    run: Runner
    nvml: Any | None
    distro: Distro | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def live(self) -> bool:
        """True when root is this machine's own /, so commands and files describe the same machine."""
        return self.root == Path("/")

    def path(self, node_path: str) -> Path:
        """The file at `node_path` ("/etc/os-release") under root."""
        return self.root / node_path.lstrip("/")

    def node_path(self, path: Path) -> str:
        """How the node itself names `path`: its path below root, from /."""
        relative = path.relative_to(self.root)
        return "/" if relative == Path() else f"/{relative.as_posix()}"

    def command(self, argv: list[str]) -> str:
        """stdout of a command; raises Skipped when it is missing, fails or hangs."""
        try:
            done = self.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False)
        except FileNotFoundError as exc:
            raise Skipped(f"{argv[0]} is not installed") from exc
        except subprocess.TimeoutExpired as exc:
            raise Skipped(f"{argv[0]} did not answer within {COMMAND_TIMEOUT_S:.0f} s") from exc
        if done.returncode != 0:
            first = (done.stderr or "").strip().splitlines()[:1]
            raise Skipped(f"{argv[0]} exited with {done.returncode}" + (f": {first[0][:160]}" if first else ""))
        return str(done.stdout)


def _read(path: Path) -> str:
    """A small text file; raises Skipped when it is missing or unreadable."""
    try:
        return path.read_text(errors="replace")
    except OSError as exc:
        raise Skipped(f"{path}: {exc.strerror or exc}") from exc


def _read_optional(path: Path) -> str | None:
    """A sysfs or proc attribute, stripped, or None where it is missing or unreadable."""
    try:
        return path.read_text(errors="replace").strip() or None
    except OSError:
        return None


# -- the distribution and the kernel ---------------------------------------------------------------------


def _distro(node: _Node) -> Distro | None:
    """The distribution os-release names (systemd reads /etc first, then /usr/lib)."""
    for candidate in ("/etc/os-release", "/usr/lib/os-release"):
        text = _read_optional(node.path(candidate))
        if text is not None:
            return parse_os_release(text)
    node.notes.append("os-release: not found")
    return None


def _kernel(node: _Node) -> str | None:
    """uname -r: /proc/sys/kernel/osrelease holds it (and can be faked in a test tree)."""
    release = _read_optional(node.path("/proc/sys/kernel/osrelease"))
    if release is None and node.live:
        release = os.uname().release
    return release


# -- distribution packages -------------------------------------------------------------------------------


def _dpkg(node: _Node, ecosystem: str) -> list[Installed]:
    """Debian/Ubuntu packages: dpkg-query on the live machine, else (or when it fails) the status file."""
    if node.live:
        try:
            return parse_dpkg_query(node.command(["dpkg-query", "-W", f"-f={DPKG_QUERY_FORMAT}"]), ecosystem)
        except Skipped as exc:
            logger.debug("dpkg-query failed, reading the status file instead: %s", exc)
    return parse_dpkg_status(_read(node.path("/var/lib/dpkg/status")), ecosystem)


def _rpm(node: _Node, ecosystem: str) -> list[Installed]:
    """RPM packages: rpm -qa, with --root when reading a tree other than this machine's."""
    argv = ["rpm", "-qa", "--qf", RPM_QUERY_FORMAT]
    if not node.live:
        argv[1:1] = ["--root", str(node.root)]
    return parse_rpm_qa(node.command(argv), ecosystem)


def _distribution_packages(node: _Node) -> list[Installed]:
    """The package manager of the node's distribution; none for a distribution gpufleet cannot name."""
    distro = node.distro
    scheme = ECOSYSTEMS.get(distro.ecosystem) if distro else None
    if distro and scheme == "deb":
        return _dpkg(node, distro.ecosystem)
    if distro and scheme == "rpm":
        return _rpm(node, distro.ecosystem)
    # Packages need an ecosystem advisories use; guessing one would match the wrong advisories.
    raise Skipped("the distribution is not one gpufleet knows, so its packages cannot be matched")


# -- Python environments -----------------------------------------------------------------------------------


def _site_dirs(env: Path) -> list[Path]:
    """The package directories of an environment (a prefix or venv), or `env` itself if it is one."""
    if any(env.glob("*.dist-info")) or any(env.glob("*.egg-info")):
        return [env]
    patterns = ("lib/python3*/site-packages", "lib/python3*/dist-packages", "lib64/python3*/site-packages")
    found: dict[Path, Path] = {}
    for pattern in patterns:
        for path in sorted(env.glob(pattern)):
            if path.is_dir():
                found.setdefault(path.resolve(), path)  # a venv's lib64 is a link to lib: read it once
    return list(found.values())


def _metadata_headers(path: Path) -> dict[str, str]:
    """Name and Version from a METADATA or PKG-INFO file: the headers end at the first blank line."""
    headers: dict[str, str] = {}
    with path.open(encoding="utf-8", errors="replace") as lines:
        for line in lines:
            if not line.strip():
                break
            key, sep, value = line.partition(":")
            if sep and key in ("Name", "Version"):
                headers[key] = value.strip()
    return headers


def _distribution(dist: Path) -> tuple[str, str] | None:
    """(name, version) of one *.dist-info or *.egg-info (directory, or file for old egg-info)."""
    metadata = dist / ("METADATA" if dist.suffix == ".dist-info" else "PKG-INFO") if dist.is_dir() else dist
    try:
        headers = _metadata_headers(metadata)
    except OSError:
        headers = {}
    if "Name" in headers and "Version" in headers:
        return headers["Name"], headers["Version"]
    # Without readable metadata the directory name still says "name-version.dist-info".
    name, sep, version = dist.stem.partition("-")
    return (name, version.split("-")[0]) if sep and version else None


def _pip(node: _Node, envs: Sequence[Path]) -> list[Installed]:
    """Python distributions installed in each environment, read from their metadata (no subprocess)."""
    from packaging.utils import canonicalize_name

    packages = []
    for env in envs:
        for site in _site_dirs(node.path(str(env))):
            location = node.node_path(site)
            for dist in sorted([*site.glob("*.dist-info"), *site.glob("*.egg-info")]):
                found = _distribution(dist)
                if found is not None:
                    packages.append(Installed("PyPI", canonicalize_name(found[0]), found[1], location=location))
    return packages


# -- the NVIDIA stack ------------------------------------------------------------------------------------


def _driver_from_proc(node: _Node) -> str | None:
    """The loaded kernel module's version: what actually runs, even if the user-space libraries differ."""
    text = _read_optional(node.path("/proc/driver/nvidia/version"))
    match = _NVRM_VERSION.search(text or "")
    return match[1] if match else None


def _nvml_call(nvml: Any, names: Iterable[str], *args: Any) -> Any | None:
    """The first of `names` this NVML binding has, called; None where it lacks them all or refuses."""
    for name in names:
        function = getattr(nvml, name, None)
        if function is None:
            continue  # an older nvidia-ml-py without this binding
        try:
            return function(*args)
        except nvml.NVMLError as exc:
            logger.debug("%s unavailable: %s", name, exc)
            return None
    return None


def _gpu_firmware(nvml: Any) -> list[Installed]:
    """VBIOS and InfoROM image versions of every GPU, located by "<index>/<uuid>"."""
    packages = []
    count = _nvml_call(nvml, ["nvmlDeviceGetCount"]) or 0
    for index in range(int(count)):
        handle = _nvml_call(nvml, ["nvmlDeviceGetHandleByIndex"], index)
        if handle is None:
            continue
        uuid = _nvml_call(nvml, ["nvmlDeviceGetUUID"], handle)
        location = f"{index}/{as_text(uuid)}" if uuid else str(index)
        for name, call in (
            ("gpu-vbios", "nvmlDeviceGetVbiosVersion"),
            ("gpu-inforom", "nvmlDeviceGetInforomImageVersion"),
        ):
            version = _nvml_call(nvml, [call], handle)
            if version and as_text(version):
                packages.append(Installed("firmware", name, as_text(version), location=location))
    return packages


def _nvidia_driver(node: _Node) -> list[Installed]:
    """The driver, the CUDA version it supports and the GPUs' firmware; proc first, then NVML."""
    driver = _driver_from_proc(node)
    packages: list[Installed] = []
    library = NvmlLibrary(node.nvml)
    try:
        nvml = library.open()
    except NvmlUnavailable as exc:
        if driver is None:
            raise Skipped(str(exc)) from exc
        node.notes.append(f"gpu firmware: {exc}")
        return [Installed("NVIDIA", "driver", driver)]
    try:
        driver = driver or _text_or_none(_nvml_call(nvml, ["nvmlSystemGetDriverVersion"]))
        if driver:
            packages.append(Installed("NVIDIA", "driver", driver))
        cuda = _nvml_call(nvml, ["nvmlSystemGetCudaDriverVersion_v2", "nvmlSystemGetCudaDriverVersion"])
        if isinstance(cuda, int) and cuda > 0:
            packages.append(Installed("NVIDIA", "cuda-driver", cuda_version_text(cuda)))
        packages.extend(_gpu_firmware(nvml))
    finally:
        library.close()
    return packages


def _text_or_none(value: Any) -> str | None:
    """A driver string as text, or None for no answer (None or empty)."""
    if value is None:
        return None
    return as_text(value) or None


def _cuda_toolkits(node: _Node) -> list[Installed]:
    """CUDA toolkits under /usr/local: version.json (CUDA 11.1 on) or version.txt (before)."""
    packages = []
    for home in _globbed(node, ["usr/local/cuda*"]):  # /usr/local/cuda is usually a link to cuda-X.Y
        version = None
        raw = _read_optional(home / "version.json")
        if raw is not None:
            try:
                version = json.loads(raw)["cuda"]["version"]
            except (ValueError, KeyError, TypeError):
                version = None
        if version is None:
            match = re.search(r"CUDA Version (\S+)", _read_optional(home / "version.txt") or "")
            version = match[1] if match else None
        if isinstance(version, str) and version:
            packages.append(Installed("NVIDIA", "cuda-toolkit", version, location=node.node_path(home)))
    return packages


def _header_version(path: Path, defines: tuple[str, str, str]) -> str | None:
    """ "9.1.0" from the MAJOR/MINOR/PATCH #defines of a cuDNN or NCCL header, or None without them."""
    text = _read_optional(path) or ""
    parts = [re.search(rf"^\s*#\s*define\s+{name}\s+(\d+)\b", text, re.MULTILINE) for name in defines]
    return ".".join(m[1] for m in parts if m) if all(parts) else None


def _nvidia_libraries(node: _Node) -> list[Installed]:
    """cuDNN and NCCL found as headers or as versioned shared libraries, once per version."""
    packages = []
    for name, (pattern, defines) in _HEADERS.items():
        for directory in _globbed(node, INCLUDE_DIRS):
            for header in sorted(directory.glob(pattern)):
                version = _header_version(header, defines)
                if version:
                    packages.append(Installed("NVIDIA", name, version, location=node.node_path(directory)))
    for directory in _globbed(node, LIBRARY_DIRS):
        for library in sorted(directory.glob("lib*.so.*")):
            for name, library_re in _LIBRARIES.items():
                match = library_re.match(library.name)
                if match:
                    packages.append(Installed("NVIDIA", name, match[1], location=node.node_path(directory)))
    # A header and its library, or two symlinked directories, name the same install: keep the first.
    first: dict[tuple[str, str], Installed] = {}
    for package in packages:
        first.setdefault((package.name, package.version), package)
    return list(first.values())


def _globbed(node: _Node, patterns: Iterable[str]) -> list[Path]:
    """The existing directories matching node-relative glob patterns, each real directory once."""
    seen: dict[Path, Path] = {}
    for pattern in patterns:
        for path in sorted(node.root.glob(pattern)):
            if path.is_dir():
                seen.setdefault(path.resolve(), path)
    return list(seen.values())


# -- firmware ----------------------------------------------------------------------------------------------


def _hca_firmware(node: _Node) -> list[Installed]:
    """InfiniBand/RoCE adapters' firmware; board_id (the PSID) and hca_type say which card it is for."""
    packages = []
    for device in sorted(node.path("/sys/class/infiniband").glob("*")):
        version = _read_optional(device / "fw_ver")
        if version is None:
            continue
        details = [f"{key}={value}" for key in ("board_id", "hca_type") if (value := _read_optional(device / key))]
        packages.append(Installed("firmware", "hca", version, location="; ".join([device.name, *details])))
    return packages


def _bios(node: _Node) -> list[Installed]:
    """The system BIOS from DMI in sysfs, readable without root (dmidecode needs root)."""
    dmi = node.path("/sys/class/dmi/id")
    version = _read_optional(dmi / "bios_version")
    if version is None:
        return []
    system = " ".join(v for v in (_read_optional(dmi / "sys_vendor"), _read_optional(dmi / "product_name")) if v)
    details = [f"system={system}"] if system else []
    details += [f"{key}={value}" for key in ("bios_vendor", "bios_date") if (value := _read_optional(dmi / key))]
    return [Installed("firmware", "bios", version, location="; ".join(details) or None)]


# -- container images ------------------------------------------------------------------------------------


def _split_reference(reference: str) -> tuple[str, str] | None:
    """ "docker.io/library/ubuntu:22.04" -> ("docker.io/library/ubuntu", "22.04"); None without a tag."""
    if "@" in reference:
        return None  # a digest reference: no tag to report
    repository, sep, tag = reference.rpartition(":")
    if not sep or "/" in tag:
        return None  # the colon was a registry port, no tag
    return repository, tag


def _podman_images(text: str) -> list[Installed]:
    """`podman images --format json`: an array of images, each with its names ("repo:tag")."""
    images = []
    for image in json.loads(text or "[]") or []:
        image_id = str(image.get("Id") or image.get("ID") or "")[:12] or None
        for reference in image.get("Names") or image.get("RepoTags") or []:
            parts = _split_reference(str(reference))
            if parts:
                images.append(Installed("container-image", parts[0], parts[1], location=image_id))
    return images


def _docker_images(text: str) -> list[Installed]:
    """`docker images --format '{{json .}}'`: one JSON object per line, Repository and Tag apart."""
    images = []
    for line in text.splitlines():
        if not line.strip():
            continue
        image = json.loads(line)
        repository, tag = image.get("Repository", "<none>"), image.get("Tag", "<none>")
        if repository != "<none>" and tag != "<none>":
            images.append(Installed("container-image", repository, tag, location=image.get("ID") or None))
    return images


def _container_images(node: _Node) -> list[Installed]:
    """Images in podman's and docker's stores, whichever are installed; at most MAX_IMAGES."""
    images: list[Installed] = []
    tools = (
        (["podman", "images", "--format", "json"], _podman_images),
        (["docker", "images", "--format", "{{json .}}"], _docker_images),
    )
    for argv, parse in tools:
        try:
            images += parse(node.command(argv))
        except Skipped as exc:
            node.notes.append(f"container images: {exc}")
        except (ValueError, AttributeError) as exc:
            node.notes.append(f"container images: {argv[0]} printed what gpufleet cannot read: {exc}")
    unique = list(dict.fromkeys(images))
    if len(unique) > MAX_IMAGES:
        node.notes.append(f"container images: {len(unique) - MAX_IMAGES} of {len(unique)} left out")
    return unique[:MAX_IMAGES]


# -- putting it together ---------------------------------------------------------------------------------


def _gather(node: _Node, label: str, source: Callable[[], list[Installed]]) -> list[Installed]:
    """Run one source; a failure becomes a note, never the end of the inventory."""
    try:
        return source()
    except Skipped as exc:
        node.notes.append(f"{label}: {exc}")
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        node.notes.append(f"{label}: could not be read: {exc}")
    logger.debug("software source %s skipped: %s", label, node.notes[-1])
    return []


def _wire(packages: Iterable[Installed], notes: list[str]) -> list[SoftwarePackage]:
    """The wire form of each package, once; one that breaks the protocol's limits is left out and noted."""
    wire, rejected = [], 0
    for package in dict.fromkeys(packages):
        try:
            wire.append(SoftwarePackage(**vars(package)))
        except ValidationError:
            rejected += 1
    if rejected:
        notes.append(f"{rejected} package(s) left out: a field is longer than the protocol allows")
    return wire


def collect_software(
    root: Path = Path("/"),
    run: Runner = subprocess.run,
    nvml: Any | None = None,
    pip_envs: Sequence[Path] = DEFAULT_PIP_ENVS,
) -> SoftwareInventory:
    """Read everything installed on the node at `root` (see the module docstring for what and where).

    `run` runs commands (subprocess.run's signature); `nvml` is a pynvml-like object (None: import
    pynvml); `pip_envs` are Python prefixes, venvs or site-packages directories, relative to root.
    Never raises for a missing source: each one that could not be read is in the result's `notes`.
    """
    node = _Node(root=root, run=run, nvml=nvml)
    node.distro = _distro(node)
    kernel = _kernel(node)
    # In order of importance: what is cut when a node has more than MAX_PACKAGES is cut from the end.
    packages = [Installed("Linux", "kernel", kernel)] if kernel else []
    packages += _gather(node, "nvidia driver", lambda: _nvidia_driver(node))
    packages += _gather(node, "cuda toolkit", lambda: _cuda_toolkits(node))
    packages += _gather(node, "cudnn/nccl", lambda: _nvidia_libraries(node))
    packages += _gather(node, "hca firmware", lambda: _hca_firmware(node))
    packages += _gather(node, "bios", lambda: _bios(node))
    packages += _gather(node, "distribution packages", lambda: _distribution_packages(node))
    packages += _gather(node, "python packages", lambda: _pip(node, pip_envs))
    packages += _gather(node, "container images", lambda: _container_images(node))
    wire = _wire(packages, node.notes)
    truncated = len(wire) > MAX_PACKAGES
    if truncated:
        node.notes.append(f"{len(wire) - MAX_PACKAGES} of {len(wire)} packages left out (limit {MAX_PACKAGES})")
        wire = wire[:MAX_PACKAGES]
    return SoftwareInventory(
        distro_ecosystem=node.distro.ecosystem if node.distro else None,
        distro_release=node.distro.release if node.distro else None,
        kernel=kernel,
        packages=wire,
        digest=package_digest(wire),
        truncated=truncated,
        notes=[note[:256] for note in node.notes[:MAX_NOTES]],
    )


# -- python -m gpufleet.agent.software ------------------------------------------------------------------------

_SHOWN_IN_FULL = ("NVIDIA", "firmware", "Linux")


def summary(inventory: SoftwareInventory) -> dict[str, Any]:
    """Counts per ecosystem, and the kernel, NVIDIA and firmware entries in full."""
    return {
        "distro": {"ecosystem": inventory.distro_ecosystem, "release": inventory.distro_release},
        "kernel": inventory.kernel,
        "digest": inventory.digest,
        "truncated": inventory.truncated,
        "counts": dict(sorted(Counter(p.ecosystem for p in inventory.packages).items())),
        "pip_locations": dict(Counter(str(p.location) for p in inventory.packages if p.ecosystem == "PyPI")),
        "nvidia_and_firmware": [
            p.model_dump(exclude_none=True) for p in inventory.packages if p.ecosystem in _SHOWN_IN_FULL
        ],
        "notes": inventory.notes,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Print this node's software inventory as JSON: a summary, everything (--full) or an export."""
    parser = argparse.ArgumentParser(prog="python -m gpufleet.agent.software", description=main.__doc__)
    parser.add_argument("--root", type=Path, default=Path("/"), help="read the file tree under this directory")
    parser.add_argument("--pip-env", type=Path, action="append", help="a Python prefix, venv or site-packages dir")
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--full", action="store_true", help="print the whole inventory as the agent sends it")
    output.add_argument("--export", action="store_true", help="print a gpufleet-software/1 file for `cve scan`")
    args = parser.parse_args(argv)
    # A relative --pip-env means one in the current directory, not one below root.
    envs = [env if env.is_absolute() else Path.cwd() / env for env in args.pip_env or DEFAULT_PIP_ENVS]
    inventory = collect_software(root=args.root, pip_envs=envs)
    if args.full:
        print(inventory.model_dump_json(indent=1))
    elif args.export:
        distro = (
            Distro(inventory.distro_ecosystem, inventory.distro_release or "") if inventory.distro_ecosystem else None
        )
        print(export_json((Installed(**p.model_dump()) for p in inventory.packages), distro))
    else:
        print(json.dumps(summary(inventory), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
