"""A stand-in for the `pynvml` module that describes one simulated node's GPUs.

Hand it to `NvmlReader(SimulatedNvml(...), source="simulated")` and the agent's real NVML code path
runs against it. Values are shaped like a real H200's NVML readout (tests/fixtures/h200/nvml-probe.json,
driver 580.159.04); the constants are written out here so that building thousands of simulated nodes
reads no file. Identities derive from (node name, GPU index), so a restarted simulated node keeps them.
"""

from __future__ import annotations

import random
import time
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass

from gpufleet.protocol.inventory import MAX_GPUS_PER_NODE

BYTES_PER_MIB = 1024 * 1024

# System-wide values of the probed H200 machine (nvml-probe.json: driver, nvml, cuda_driver).
DRIVER_VERSION = "580.159.04"
NVML_VERSION = "13.580.159.04"
CUDA_DRIVER_VERSION = 13000

# Enable states as NVML spells them (NVML_FEATURE_ENABLED, NVML_DEVICE_MIG_DISABLE).
_ENABLED = 1
_DISABLED = 0
NVML_TEMPERATURE_GPU = 0

# PCI buses of the eight GPUs on an HGX baseboard; GPUs past eight go to further PCI domains.
HGX_PCI_BUSES = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")

# Fixed namespace for GPU UUIDs, so the same (node, index) gives the same UUID on every run.
_UUID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_DNS, "sim.gpufleet")

# Telemetry levels of the probe's time series: idle about 40 C, 79 W, 0.6 GB used; under a bf16
# matmul about 65 C, 692 W (99 % of the 700 W limit), 100 % busy, 25 % memory-busy, 1.8 GB used.
_IDLE_TEMP_C = 40
_LOAD_TEMP_C = 65
_IDLE_POWER_SHARE = 79_300 / 700_000
_LOAD_POWER_SHARE = 692_000 / 700_000
_LOAD_MEMORY_UTIL = 25
_IDLE_USED_BYTES = 644_939_776
_LOAD_USED_BYTES = 1_839_071_232


@dataclass(frozen=True, slots=True)
class GpuModel:
    """What a simulated GPU model reports."""

    name: str
    memory_total_bytes: int
    vbios_version: str
    compute_capability: tuple[int, int]
    power_limit_mw: int


MODELS: dict[str, GpuModel] = {
    # nvml-probe.json, a real H200.
    "H200": GpuModel("NVIDIA H200", 150_754_820_096, "96.00.A5.00.1A", (9, 0), 700_000),
    # Name, VBIOS and memory as nvidia-smi printed them on an 8x H100 HGX (gpud's
    # nvidia-smi-query.535.183.01.out.0.valid); 700 W is the SXM5 part's limit.
    "H100": GpuModel("NVIDIA H100 80GB HBM3", 81_559 * BYTES_PER_MIB, "96.00.74.00.01", (9, 0), 700_000),
    # tests/fixtures/nvidia-smi/a100-sxm4-v12.xml.
    "A100": GpuModel("NVIDIA A100-SXM4-80GB", 81_920 * BYTES_PER_MIB, "92.00.36.00.02", (8, 0), 500_000),
}


class NVMLError(Exception):
    """An NVML call failed: the simulator's counterpart of pynvml.NVMLError."""


class NVMLError_NotSupported(NVMLError):  # named as pynvml names it
    """The simulated GPU does not support this query."""


class NVMLError_Uninitialized(NVMLError):  # named as pynvml names it
    """A query before nvmlInit or after the matching nvmlShutdown, as real NVML refuses it."""


class NVMLError_InvalidArgument(NVMLError):  # named as pynvml names it
    """A bad device index or sensor."""


@dataclass(frozen=True, slots=True)
class PciInfo:
    """The fields of pynvml's nvmlPciInfo_t that matter here; bus ids are bytes as pynvml's are."""

    busId: bytes  # pynvml's field name
    busIdLegacy: bytes  # pynvml's field name
    domain: int
    bus: int
    device: int


@dataclass(frozen=True, slots=True)
class MemoryInfo:
    """pynvml's nvmlMemory_t: bytes."""

    total: int
    free: int
    used: int


@dataclass(frozen=True, slots=True)
class Utilization:
    """pynvml's nvmlUtilization_t: percent busy over the last sample period."""

    gpu: int
    memory: int


@dataclass(slots=True)
class SimulatedGpu:
    """One simulated GPU: the handle nvmlDeviceGetHandleByIndex returns, and its mutable load state."""

    index: int
    uuid: str
    serial: str
    pci: PciInfo
    load: float = 0.0
    energy_mj: float = 0.0
    energy_at: float = 0.0


class SimulatedNvml:
    """A pynvml look-alike for one node: `gpu_count` GPUs of `gpu_model` (one of MODELS).

    `seed` fixes the telemetry noise; by default it derives from the node name, so a simulated fleet
    replays identically. `clock` (seconds, monotonic) drives energy accumulation.
    Raises ValueError for an unknown model or a GPU count outside 0..MAX_GPUS_PER_NODE.
    """

    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_Uninitialized = NVMLError_Uninitialized
    NVMLError_InvalidArgument = NVMLError_InvalidArgument
    NVML_TEMPERATURE_GPU = NVML_TEMPERATURE_GPU

    def __init__(
        self,
        node_name: str,
        gpu_count: int = 8,
        gpu_model: str = "H200",
        seed: int | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Describe the node's GPUs; cheap enough to build thousands (no I/O, a hash per GPU)."""
        if gpu_model not in MODELS:
            raise ValueError(f"unknown GPU model {gpu_model!r}; known: {', '.join(sorted(MODELS))}")
        if not 0 <= gpu_count <= MAX_GPUS_PER_NODE:
            raise ValueError(f"gpu_count must be between 0 and {MAX_GPUS_PER_NODE}, not {gpu_count}")
        self.node_name = node_name
        self.model = MODELS[gpu_model]
        self._clock = clock
        self._rng = random.Random(zlib.crc32(node_name.encode()) if seed is None else seed)
        self._init_count = 0
        now = clock()
        self._gpus = [_make_gpu(node_name, index, now) for index in range(gpu_count)]

    # Control, for the simulator: not part of pynvml.

    def set_load(self, index: int, load: float) -> None:
        """Set how busy GPU `index` is, 0.0 (idle) to 1.0 (full matmul load); energy so far is kept."""
        gpu = self._gpus[index]
        self._accumulate_energy(gpu)
        gpu.load = min(1.0, max(0.0, load))

    # Library lifetime. Real NVML counts nested inits; so does this.

    def nvmlInit(self) -> None:
        """Start (or nest) a session."""
        self._init_count += 1

    def nvmlShutdown(self) -> None:
        """End one session; raises NVMLError_Uninitialized without one."""
        self._check()
        self._init_count -= 1

    # System queries.

    def nvmlSystemGetDriverVersion(self) -> str:
        """The driver version, e.g. "580.159.04"."""
        self._check()
        return DRIVER_VERSION

    def nvmlSystemGetNVMLVersion(self) -> str:
        """The NVML library version."""
        self._check()
        return NVML_VERSION

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        """The CUDA version the driver supports, as 1000 * major + 10 * minor."""
        self._check()
        return CUDA_DRIVER_VERSION

    def nvmlDeviceGetCount(self) -> int:
        """How many GPUs the node has."""
        self._check()
        return len(self._gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> SimulatedGpu:
        """The handle of GPU `index`; raises NVMLError_InvalidArgument past the last one."""
        self._check()
        if not 0 <= index < len(self._gpus):
            raise NVMLError_InvalidArgument(f"no GPU {index}")
        return self._gpus[index]

    # Device identity: fixed for the life of the node.

    def nvmlDeviceGetName(self, handle: SimulatedGpu) -> str:
        """The marketing name, e.g. "NVIDIA H200"."""
        self._check()
        return self.model.name

    def nvmlDeviceGetUUID(self, handle: SimulatedGpu) -> str:
        """ "GPU-" and a UUID derived from (node name, index)."""
        self._check()
        return handle.uuid

    def nvmlDeviceGetSerial(self, handle: SimulatedGpu) -> str:
        """A 13-digit board serial derived from the UUID."""
        self._check()
        return handle.serial

    def nvmlDeviceGetPciInfo(self, handle: SimulatedGpu) -> PciInfo:
        """PCI address in the HGX layout."""
        self._check()
        return handle.pci

    def nvmlDeviceGetMemoryInfo(self, handle: SimulatedGpu) -> MemoryInfo:
        """Framebuffer size and use in bytes; use grows with load as in the probe."""
        self._check()
        used = round(_IDLE_USED_BYTES + handle.load * (_LOAD_USED_BYTES - _IDLE_USED_BYTES))
        total = self.model.memory_total_bytes
        return MemoryInfo(total=total, free=total - used, used=used)

    def nvmlDeviceGetVbiosVersion(self, handle: SimulatedGpu) -> str:
        """The VBIOS version of the model."""
        self._check()
        return self.model.vbios_version

    def nvmlDeviceGetMigMode(self, handle: SimulatedGpu) -> list[int]:
        """[current, pending]: MIG is off."""
        self._check()
        return [_DISABLED, _DISABLED]

    def nvmlDeviceGetEccMode(self, handle: SimulatedGpu) -> list[int]:
        """[current, pending]: ECC is on, as on every data-centre GPU."""
        self._check()
        return [_ENABLED, _ENABLED]

    def nvmlDeviceGetCudaComputeCapability(self, handle: SimulatedGpu) -> tuple[int, int]:
        """(major, minor) of the model."""
        self._check()
        return self.model.compute_capability

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: SimulatedGpu) -> int:
        """The power cap in mW."""
        self._check()
        return self.model.power_limit_mw

    # Telemetry: levels follow the load set through set_load, with a little noise.

    def nvmlDeviceGetUtilizationRates(self, handle: SimulatedGpu) -> Utilization:
        """Percent of time the GPU and its memory were busy."""
        self._check()
        if handle.load == 0.0:
            return Utilization(gpu=0, memory=0)
        busy = min(100, max(0, round(100 * handle.load) - self._rng.randint(0, 1)))
        return Utilization(gpu=busy, memory=round(_LOAD_MEMORY_UTIL * handle.load))

    def nvmlDeviceGetTemperature(self, handle: SimulatedGpu, sensor: int) -> int:
        """GPU temperature in C; only the GPU sensor exists, as on real boards."""
        self._check()
        if sensor != NVML_TEMPERATURE_GPU:
            raise NVMLError_InvalidArgument(f"no temperature sensor {sensor}")
        level = _IDLE_TEMP_C + handle.load * (_LOAD_TEMP_C - _IDLE_TEMP_C)
        return round(level + self._rng.uniform(-0.5, 0.5))

    def nvmlDeviceGetPowerUsage(self, handle: SimulatedGpu) -> int:
        """Current draw in mW, within about half a percent of the load's level."""
        self._check()
        return round(self._power_mw(handle) * self._rng.uniform(0.995, 1.005))

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: SimulatedGpu) -> int:
        """Energy used since the node was built, in mJ: power integrated over the clock."""
        self._check()
        self._accumulate_energy(handle)
        return int(handle.energy_mj)

    def _power_mw(self, gpu: SimulatedGpu) -> float:
        """Draw without noise: the probe's idle and load levels, scaled to the model's limit."""
        share = _IDLE_POWER_SHARE + gpu.load * (_LOAD_POWER_SHARE - _IDLE_POWER_SHARE)
        return share * self.model.power_limit_mw

    def _accumulate_energy(self, gpu: SimulatedGpu) -> None:
        """Add the energy drawn at the current load since the last update (mW x s = mJ)."""
        now = self._clock()
        gpu.energy_mj += self._power_mw(gpu) * max(0.0, now - gpu.energy_at)
        gpu.energy_at = now

    def _check(self) -> None:
        """Refuse queries outside an nvmlInit/nvmlShutdown session, as NVML does."""
        if self._init_count <= 0:
            raise NVMLError_Uninitialized("NVML not initialised: call nvmlInit first")


def _make_gpu(node_name: str, index: int, now: float) -> SimulatedGpu:
    """GPU `index` of `node_name`: UUID, serial and PCI address are functions of those two alone."""
    gpu_uuid = uuid.uuid5(_UUID_NAMESPACE, f"{node_name}/{index}")
    domain, slot = divmod(index, len(HGX_PCI_BUSES))
    bus = HGX_PCI_BUSES[slot]
    pci = PciInfo(
        busId=f"{domain:08X}:{bus}:00.0".encode(),
        busIdLegacy=f"{domain:04X}:{bus}:00.0".encode(),
        domain=domain,
        bus=int(bus, 16),
        device=0,
    )
    serial = str(10**12 + gpu_uuid.int % (9 * 10**12))
    return SimulatedGpu(index=index, uuid=f"GPU-{gpu_uuid}", serial=serial, pci=pci, energy_at=now)
