"""GPU inventory from `nvidia-smi -q -x`, for machines where NVML cannot be loaded from Python.

MIG devices come from the same XML, which does not name them: their UUIDs (what CUDA_VISIBLE_DEVICES
takes) are only in `nvidia-smi -L`, run once where the XML lacks one, and their profiles are derived
from the SM count and memory where -L does not say. A MIG device that cannot be named is left out
with a warning; MIG never costs a GPU its place in the inventory.
"""

from __future__ import annotations

import errno
import logging
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from pydantic import ValidationError

from gpufleet.agent.gpu.ports import GpuReadError, normalise_pci_bus_id
from gpufleet.core.errors import describe
from gpufleet.protocol.inventory import GpuInfo, GpuSource, Mode
from gpufleet.protocol.mig import COMPUTE_SLICES, MigInstance, mig_family, profiles_of

logger = logging.getLogger(__name__)

COMMAND = ("nvidia-smi", "-q", "-x")
LIST_COMMAND = ("nvidia-smi", "-L")
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
# SMs in one compute slice, by protocol.mig family, for the XML, which gives a MIG device's SMs but
# not its profile. Source: NVIDIA's MIG user guide (its `nvidia-smi mig -lgip` listings: an A100's
# 1g profiles have 14 SMs, an H100's or H200's 16). Bigger Hopper instances have a few SMs more than
# their slices' share (3g: 60, as the H100 capture in tests/fixtures shows; 7g: 132), so the slices
# are the SM count divided by this, rounded down, at most COMPUTE_SLICES.
_SMS_PER_SLICE = {"A100-40GB": 14, "A100-80GB": 14, "H100-80GB": 16, "H200": 16}
# How far a device's memory may be from its profile's (NVML's figures move a little between drivers)
# before the profile is called unknown rather than guessed: 1/8 of the profile's memory.
_MEMORY_SLACK = 8
# `nvidia-smi -L`: "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-…)" and under it one line per MIG device,
# "  MIG 3g.40gb     Device  0: (UUID: MIG-…)"; R450 drivers wrote the UUID as MIG-GPU-…/1/0.
_LISTED_GPU = re.compile(r"^GPU (\d+): .*\(UUID: (GPU-[^\s)]+)\)\s*$")
_LISTED_MIG = re.compile(r"^\s+MIG (\S+)\s+Device\s+(\d+): \(UUID: (MIG-[^\s)]+)\)\s*$")
# The compute slices of a GPU instance in a profile name: "3g.40gb", "1c.3g.40gb" (a compute
# instance of a 3g GPU instance), "1g.10gb+me".
_PROFILE_SLICES = re.compile(r"(?:^|\.)([1-8])g\.")


class UnsafeXmlError(GpuReadError, ValueError):
    """The XML declares entities, which nvidia-smi never does: refused rather than expanded."""


@dataclass(frozen=True, slots=True)
class ListedMig:
    """A MIG device as `nvidia-smi -L` lists it."""

    uuid: str
    profile: str  # "3g.40gb", "1c.3g.40gb"


@dataclass(frozen=True, slots=True)
class ListedGpu:
    """A GPU as `nvidia-smi -L` lists it, with its MIG devices by device index."""

    uuid: str
    mig: dict[int, ListedMig]


@dataclass(frozen=True, slots=True)
class _MigDevice:
    """A <mig_device> as the XML gives it; None where a field is missing."""

    index: int
    gpu_instance: int
    compute_instance: int
    memory_mib: int | None
    sm_count: int | None
    uuid: str | None


def parse_nvidia_smi_xml(text: str, listing: Mapping[int, ListedGpu] | None = None) -> list[GpuInfo]:
    """Parse the output of `nvidia-smi -q -x` into GPUs, in the order nvidia-smi lists them.

    MIG devices take their UUIDs from the XML or else from `listing` (parse_nvidia_smi_list); one
    with neither is left out, with a warning. Raises UnsafeXmlError (a GpuReadError) for documents
    that declare entities, and GpuReadError for anything that is not a complete nvidia-smi log or
    lacks a field every GPU must have.
    """
    return [_with_mig(gpu, devices, listing or {}) for gpu, devices in _parse_log(text)]


def parse_nvidia_smi_list(text: str) -> dict[int, ListedGpu]:
    """The GPUs of `nvidia-smi -L` by index, with their MIG devices.

    Lines of any other shape are skipped: the listing only ever supplies MIG UUIDs, and a line it
    cannot read costs at most the MIG devices it would have named.
    """
    gpus: dict[int, ListedGpu] = {}
    current: ListedGpu | None = None
    for line in text.splitlines():
        if gpu := _LISTED_GPU.match(line):
            current = gpus[int(gpu[1])] = ListedGpu(gpu[2], {})
        elif (mig := _LISTED_MIG.match(line)) and current is not None:
            current.mig[int(mig[2])] = ListedMig(mig[3], mig[1])
    return gpus


def derive_mig_profile(model: str, memory_total_mib: int, sm_count: int | None, memory_mib: int | None) -> str:
    """The profile of a MIG device that nvidia-smi does not name; "" where it cannot be told.

    The SM count gives the compute slices, and of the model's profiles with that many the one
    nearest the device's memory is it. A device far from every such profile (a compute instance
    smaller than its GPU instance has the SMs of one profile and the memory of another) is unknown
    rather than mislabelled.
    """
    slices = _slices_of_sms(model, memory_total_mib, sm_count)
    candidates = [p for p in profiles_of(model, memory_total_mib).values() if p.slices == slices]
    if not candidates or memory_mib is None:
        return ""
    nearest = min(candidates, key=lambda p: abs(p.memory_mib - memory_mib))
    return nearest.name if abs(nearest.memory_mib - memory_mib) <= nearest.memory_mib // _MEMORY_SLACK else ""


def _parse_log(text: str) -> list[tuple[GpuInfo, list[_MigDevice]]]:
    """The GPUs of the XML, each with its MIG devices as the XML has them (not yet named)."""
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
    parsed = []
    for index, element in enumerate(root.findall("gpu")):
        gpu = _parse_gpu(element, index, driver, cuda)
        parsed.append((gpu, _mig_devices(element, index) if gpu.mig_mode == "enabled" else []))
    return parsed


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
        """Run nvidia-smi and parse its XML, and `nvidia-smi -L` too where MIG devices lack UUIDs.

        Raises GpuReadError when nvidia-smi is missing, cannot be started, times out, exits non-zero
        (its own message included: typically the driver is not loaded) or prints unparsable output.
        A failing -L only costs the MIG devices it would have named.
        """
        parsed = _parse_log(self._output(COMMAND))
        unnamed = any(device.uuid is None for _, devices in parsed for device in devices)
        listing = self._listing() if unnamed else {}
        return [_with_mig(gpu, devices, listing) for gpu, devices in parsed]

    def _listing(self) -> dict[int, ListedGpu]:
        """`nvidia-smi -L`, parsed; empty (with a warning) where it fails."""
        try:
            return parse_nvidia_smi_list(self._output(LIST_COMMAND))
        except GpuReadError as exc:
            logger.warning("MIG devices left out: nvidia-smi -L failed: %s", exc)
            return {}

    def _output(self, args: Sequence[str]) -> str:
        """What nvidia-smi printed; raises GpuReadError where it did not run or did not succeed."""
        try:
            done = self._run(args, self._timeout_s)
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
        return _decode(done.stdout)


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


def _int(element: ET.Element, path: str) -> int | None:
    """The whole number at path, or None where it is missing or not a number."""
    value = _field(element, path)
    return int(value) if value is not None and value.isdecimal() else None


def _mig_devices(gpu: ET.Element, index: int) -> list[_MigDevice]:
    """The <mig_device>s of a GPU; one without its instance ids is left out, with a warning."""
    devices = []
    for position, element in enumerate(gpu.findall("mig_devices/mig_device")):
        gpu_instance, compute_instance = _int(element, "gpu_instance_id"), _int(element, "compute_instance_id")
        if gpu_instance is None or compute_instance is None:
            logger.warning("GPU %d: MIG device %d left out: no GPU or compute instance id", index, position)
            continue
        memory = _MIB.match(_field(element, "fb_memory_usage/total") or "")
        number = _int(element, "index")  # NVML's MIG device index, which -L numbers its devices by
        devices.append(
            _MigDevice(
                index=position if number is None else number,
                gpu_instance=gpu_instance,
                compute_instance=compute_instance,
                memory_mib=int(memory[1]) if memory else None,
                sm_count=_int(element, "device_attributes/shared/multiprocessor_count"),
                uuid=_field(element, "uuid"),
            )
        )
    return devices


def _with_mig(gpu: GpuInfo, devices: list[_MigDevice], listing: Mapping[int, ListedGpu]) -> GpuInfo:
    """The GPU with the MIG devices that could be named; without any where they do not fit the model."""
    if not devices:
        return gpu
    listed = _listed_mig(gpu, listing)
    found = [mig for device in devices if (mig := _mig_instance(gpu, device, listed.get(device.index))) is not None]
    try:
        return GpuInfo.model_validate({**gpu.model_dump(), "mig": found})
    except ValidationError as exc:
        logger.warning("GPU %d: MIG devices left out: %s", gpu.index, describe(exc))
        return gpu


def _listed_mig(gpu: GpuInfo, listing: Mapping[int, ListedGpu]) -> Mapping[int, ListedMig]:
    """The -L entries of this GPU's MIG devices, if -L lists this GPU (same index, same UUID)."""
    listed = listing.get(gpu.index)
    if listed is None:
        return {}
    if listed.uuid != gpu.uuid:
        logger.warning(
            "GPU %d: nvidia-smi -L lists %s there, not %s; its MIG UUIDs are not used", gpu.index, listed.uuid, gpu.uuid
        )
        return {}
    return listed.mig


def _mig_instance(gpu: GpuInfo, device: _MigDevice, listed: ListedMig | None) -> MigInstance | None:
    """One MIG device for the inventory; None (with a warning) where it has no UUID or does not fit."""
    uuid = device.uuid or (listed.uuid if listed else None)
    where = f"GPU {gpu.index}: MIG device {device.index} (GPU instance {device.gpu_instance})"
    if uuid is None:
        logger.warning("%s left out: neither the XML nor nvidia-smi -L gives its UUID", where)
        return None
    named = listed.profile if listed is not None and listed.uuid == uuid else ""
    profile = named or derive_mig_profile(gpu.model, gpu.memory_total_mib, device.sm_count, device.memory_mib)
    slices = _slices_of_name(profile) or _slices_of_sms(gpu.model, gpu.memory_total_mib, device.sm_count) or 1
    try:
        return MigInstance(
            uuid=uuid,
            profile=profile,
            gpu_instance=device.gpu_instance,
            compute_instance=device.compute_instance,
            slices=slices,
            memory_mib=device.memory_mib or 0,
        )
    except ValidationError as exc:
        logger.warning("%s left out: %s", where, describe(exc))
        return None


def _slices_of_sms(model: str, memory_total_mib: int, sm_count: int | None) -> int | None:
    """Compute slices from a MIG device's SM count (see _SMS_PER_SLICE); None where not known."""
    per_slice = _SMS_PER_SLICE.get(mig_family(model, memory_total_mib) or "")
    if per_slice is None or sm_count is None or sm_count < per_slice:
        return None
    return min(sm_count // per_slice, COMPUTE_SLICES)


def _slices_of_name(profile: str) -> int | None:
    """The GPU instance's compute slices a profile name states ("1c.3g.40gb" -> 3); None if none."""
    match = _PROFILE_SLICES.search(profile)
    return int(match[1]) if match else None
