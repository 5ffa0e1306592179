"""GPU inventory from `nvidia-smi -q -x`, for machines where NVML cannot be loaded from Python."""

from __future__ import annotations

import errno
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence

from pydantic import ValidationError

from gpufleet.agent.gpu.ports import GpuReadError, normalise_pci_bus_id
from gpufleet.protocol.inventory import GpuInfo, GpuSource, Mode

COMMAND = ("nvidia-smi", "-q", "-x")
TIMEOUT_S = 15.0

# How a runner is called: (argument list, timeout in seconds) -> the finished process.
Runner = Callable[[Sequence[str], float], subprocess.CompletedProcess[bytes]]

# Values nvidia-smi prints where a field does not apply or cannot be read.
_ABSENT = frozenset({"", "n/a", "[n/a]", "not supported", "[not supported]", "unknown error", "[unknown error]"})
_MODES: dict[str, Mode] = {"enabled": "enabled", "disabled": "disabled"}
_MIB = re.compile(r"^(\d+)\s*MiB$")
_WATTS = re.compile(r"^(\d+(?:\.\d+)?)\s*W$")
# An internal DTD subset ("<!DOCTYPE x [ ... ]>") is where entities get declared; nvidia-smi only
# ever writes an external reference to its DTD file, which expat does not fetch.
_INTERNAL_SUBSET = re.compile(r"<!DOCTYPE[^>\[]*\[")
# Where the enforced power limit lives: drivers up to ~525 use <power_readings>, later ones
# <gpu_power_readings>, whose <current_power_limit> is the enforced limit.
_POWER_LIMIT_PATHS = (
    "power_readings/enforced_power_limit",
    "gpu_power_readings/enforced_power_limit",
    "gpu_power_readings/current_power_limit",
)


class UnsafeXmlError(GpuReadError, ValueError):
    """The XML declares entities, which nvidia-smi never does: refused rather than expanded."""


def parse_nvidia_smi_xml(text: str) -> list[GpuInfo]:
    """Parse the output of `nvidia-smi -q -x` into GPUs, in the order nvidia-smi lists them.

    Raises UnsafeXmlError (a GpuReadError) for documents that declare entities, and GpuReadError for
    anything that is not a complete nvidia-smi log or lacks a field every GPU must have.
    """
    if "<!ENTITY" in text or _INTERNAL_SUBSET.search(text):
        # Entity expansion is the classic XML bomb; real nvidia-smi output never needs it.
        raise UnsafeXmlError("nvidia-smi XML declares entities; refusing to parse it")
    try:
        root = ET.fromstring(text)  # noqa: S314 - entity declarations are refused above
    except ET.ParseError as exc:
        raise GpuReadError(f"nvidia-smi output is not well-formed XML: {exc}") from exc
    if root.tag != "nvidia_smi_log":
        raise GpuReadError(f"nvidia-smi output has root <{root.tag}>, expected <nvidia_smi_log>")
    driver = _field(root, "driver_version")
    cuda = _field(root, "cuda_version")  # absent before CUDA versions were reported (older drivers)
    return [_parse_gpu(gpu, index, driver, cuda) for index, gpu in enumerate(root.findall("gpu"))]


class NvidiaSmiReader:
    """Reads the GPU inventory by running `nvidia-smi -q -x`.

    `run` replaces the process launcher in tests; it gets the argument list and the timeout.
    """

    source: GpuSource = "nvidia-smi"

    def __init__(self, run: Runner | None = None, *, timeout_s: float = TIMEOUT_S) -> None:
        """Remember how to run nvidia-smi; nothing runs until read()."""
        self._run = run or run_program
        self._timeout_s = timeout_s

    def read(self) -> list[GpuInfo]:
        """Run nvidia-smi and parse its XML.

        Raises GpuReadError when nvidia-smi is missing, cannot be started, times out, exits non-zero
        (its own message included: typically the driver is not loaded) or prints unparsable output.
        """
        try:
            done = self._run(COMMAND, self._timeout_s)
        except FileNotFoundError as exc:
            raise GpuReadError("nvidia-smi not found on PATH") from exc
        except subprocess.TimeoutExpired as exc:
            raise GpuReadError(f"nvidia-smi did not answer within {self._timeout_s:g} s") from exc
        except OSError as exc:
            raise GpuReadError(f"nvidia-smi could not be started: {exc}") from exc
        if done.returncode != 0:
            # nvidia-smi explains failures on stdout ("couldn't communicate with the NVIDIA driver").
            said = _decode(done.stderr or b"").strip() or _decode(done.stdout or b"").strip()
            raise GpuReadError(f"nvidia-smi exited with status {done.returncode}: {said[:300]}")
        return parse_nvidia_smi_xml(_decode(done.stdout))


def run_program(args: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[bytes]:
    """Run a program found on PATH with an argument list (never a shell), capturing its output.

    Raises FileNotFoundError if it is not on PATH, subprocess.TimeoutExpired if it outlives the
    timeout, OSError if it cannot be started.
    """
    program = shutil.which(args[0])
    if program is None:
        raise FileNotFoundError(errno.ENOENT, "not found on PATH", args[0])
    return subprocess.run([program, *args[1:]], capture_output=True, timeout=timeout_s, check=False)


def _decode(output: bytes) -> str:
    """nvidia-smi writes ASCII; replace anything else rather than fail on it."""
    return output.decode("utf-8", errors="replace")


def _field(element: ET.Element, path: str) -> str | None:
    """The trimmed text at path, or None where it is missing or nvidia-smi says "N/A" and the like."""
    found = element.find(path)
    if found is None or found.text is None:
        return None
    text = found.text.strip()
    return None if text.lower() in _ABSENT else text


def _required(gpu: ET.Element, index: int, path: str) -> str:
    """The text at path; raises GpuReadError if a GPU lacks a field every GPU has."""
    value = _field(gpu, path)
    if value is None:
        raise GpuReadError(f"nvidia-smi XML: GPU {index} has no <{path}>")
    return value


def _parse_gpu(gpu: ET.Element, index: int, driver: str | None, cuda: str | None) -> GpuInfo:
    """One <gpu> element -> GpuInfo; raises GpuReadError for missing or out-of-range fields.

    The index is the position in the document, which is NVML's index order (nvidia-smi enumerates
    through NVML), so both backends number a GPU alike. <minor_number> is the /dev/nvidiaN node
    and can differ from it (GPU 0 has minor number 1 on some dual-GPU machines).
    """
    memory = _MIB.match(_required(gpu, index, "fb_memory_usage/total"))
    if memory is None:
        raise GpuReadError(f"nvidia-smi XML: GPU {index} memory total is not in MiB")
    bus_id = _field(gpu, "pci/pci_bus_id") or gpu.get("id")
    if not bus_id:
        raise GpuReadError(f"nvidia-smi XML: GPU {index} has no PCI bus id")
    try:
        return GpuInfo(
            index=index,
            uuid=_required(gpu, index, "uuid"),
            model=_required(gpu, index, "product_name"),
            serial=_field(gpu, "serial"),
            pci_bus_id=normalise_pci_bus_id(bus_id),
            memory_total_mib=int(memory[1]),
            driver_version=driver,
            cuda_version=cuda,
            vbios_version=_field(gpu, "vbios_version"),
            mig_mode=_mode(_field(gpu, "mig_mode/current_mig")),
            ecc_mode=_mode(_field(gpu, "ecc_mode/current_ecc")),
            # No driver in our fixtures (418 to 590) puts the compute capability in this XML; read it
            # under its --query-gpu name should one start to.
            compute_capability=_field(gpu, "compute_cap"),
            power_limit_w=_power_limit(gpu),
        )
    except ValidationError as exc:
        raise GpuReadError(f"nvidia-smi XML: GPU {index} has values that do not fit the inventory: {exc}") from exc


def _mode(value: str | None) -> Mode | None:
    """ "Enabled" / "Disabled" -> the inventory's mode; anything else (N/A) -> None."""
    return None if value is None else _MODES.get(value.lower())


def _power_limit(gpu: ET.Element) -> float | None:
    """The enforced power limit in W, from whichever element this driver version uses."""
    for path in _POWER_LIMIT_PATHS:
        value = _field(gpu, path)
        match = _WATTS.match(value) if value else None
        if match:
            return float(match[1])
    return None
