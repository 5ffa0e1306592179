"""A stand-in for the `pynvml` module that describes one simulated node's GPUs, faults included.

Hand it to `NvmlReader(SimulatedNvml(...), source="simulated")` or to the metrics `GpuCollector` and
the agent's real NVML code runs against it. Values are shaped like a real H200's NVML readout
(tests/fixtures/h200/nvml-probe.json and nvidia-smi-q.xml, driver 580.159.04); the constants are
written out here so that building thousands of simulated nodes reads no file. Identities derive from
(node name, GPU index), so a restarted simulated node keeps them.

Unlike the probed machine (one H200 passed through to a VM, so no NVLink), a simulated node is an
HGX board: its GPUs have NVLinks. Retired pages are not supported, as on every GPU that remaps rows
instead (Ampere and later); the probe's nvmlDeviceGetRetiredPagesPendingStatus says so too.

`inject(kind, gpu)` and `heal()` are the simulator's controls, not pynvml's: they change what the
calls answer, the way the real failure would (see FAULTS).
"""

from __future__ import annotations

import functools
import random
import time
import uuid
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpufleet.agent.gpu import nvml_api as api
from gpufleet.core.errors import InvalidInput
from gpufleet.protocol.cuda import newest_cuda, parse_driver
from gpufleet.protocol.inventory import MAX_GPUS_PER_NODE
from gpufleet.sim.mig import ComputeInstance, MigState, SimulatedMig
from gpufleet.sim.nvml_types import (
    EventData,
    EventSet,
    FieldValue,
    FieldValueUnion,
    MemoryInfo,
    NVMLError,
    NVMLError_GpuIsLost,
    NVMLError_InvalidArgument,
    NVMLError_NotSupported,
    NVMLError_Timeout,
    NVMLError_Uninitialized,
    PciInfo,
    Utilization,
)

BYTES_PER_MIB = 1024 * 1024

# System-wide values of the probed H200 machine (nvml-probe.json: driver, nvml, cuda_driver).
DRIVER_VERSION = "580.159.04"
NVML_VERSION = "13.580.159.04"
CUDA_DRIVER_VERSION = 13000

# Enable states as NVML spells them (NVML_FEATURE_ENABLED, NVML_DEVICE_MIG_DISABLE).
_ENABLED = 1
_DISABLED = 0
NVML_TEMPERATURE_GPU = api.NVML_TEMPERATURE_GPU

# PCI buses of the eight GPUs on an HGX baseboard; GPUs past eight go to further PCI domains.
HGX_PCI_BUSES = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")

# Fixed namespace for GPU UUIDs, so the same (node, index) gives the same UUID on every run.
_UUID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_DNS, "sim.gpufleet")

# Telemetry levels of the probe's time series: idle about 40 C, 79 W, 0.6 GB used, SM clock 345 MHz;
# under a bf16 matmul about 65 C, 692 W (99 % of the 700 W limit), 100 % busy, 25 % memory-busy,
# 1.8 GB used, SM clock 1425-1500 MHz. HBM reads 2 C below the GPU (nvidia-smi-q.xml: 40 C at 42 C).
_IDLE_TEMP_C = 40
LOAD_TEMP_C = 65
_MEM_BELOW_GPU_C = 2
_IDLE_POWER_SHARE = 79_300 / 700_000
_LOAD_POWER_SHARE = 692_000 / 700_000
_LOAD_MEMORY_UTIL = 25
_IDLE_USED_BYTES = 644_939_776
_LOAD_USED_BYTES = 1_839_071_232
_IDLE_SM_CLOCK_MHZ = 345
_LOAD_SM_CLOCK_SHARE = 0.75  # of the maximum, under a power-capped load
_POWER_CAPPED_LOAD = 0.95  # above this load the SW power cap holds the clocks
# A GPU in thermal trouble: past the slowdown threshold, HBM hotter still, clocks halved.
HOT_GPU_C = 92
_HOT_MEM_C = 95
THERMAL_REASONS = (
    api.CLOCKS_EVENT_HW_SLOWDOWN | api.CLOCKS_EVENT_SW_THERMAL_SLOWDOWN | api.CLOCKS_EVENT_HW_THERMAL_SLOWDOWN
)
_NVLINKS_DOWN = (0, 1)  # the links nvlink-down takes out

# What each fault does (docs/agent.md lists the same).
FAULTS = {
    "xid79": "an Xid 79 event, then every call on the GPU fails with GPU is lost",
    "ecc-dbe": "an Xid 48 event; volatile and aggregate uncorrected ECC counts +1; a row remap pending",
    "thermal": "GPU at ~92 C, HBM at ~95 C, thermal clocks-event reasons set, SM clock halved",
    "nvlink-down": "an Xid 74 event; links 0 and 1 inactive; NVLink replay and recovery counters rise",
    "gpu-missing": "the GPU is no longer listed: the device count drops by one",
    "gpu-slow": "the GPU delivers a fifth of the load its job asks (utilization, power, clocks): a straggler",
}
SLOW_SHARE = 0.2  # of the asked load that a gpu-slow GPU delivers


@dataclass(frozen=True, slots=True)
class GpuModel:
    """What a simulated GPU model reports."""

    name: str
    memory_total_bytes: int
    vbios_version: str
    compute_capability: tuple[int, int]
    power_limit_mw: int
    sm_clock_max_mhz: int
    mem_clock_mhz: int
    pcie_gen: int
    nvlinks: int


MODELS: dict[str, GpuModel] = {
    # nvml-probe.json and nvidia-smi-q.xml, a real H200; 18 NVLinks on the HGX board.
    "H200": GpuModel("NVIDIA H200", 150_754_820_096, "96.00.A5.00.1A", (9, 0), 700_000, 1980, 3201, 5, 18),
    # Name, VBIOS, memory and clocks as nvidia-smi printed them on H100 80GB HBM3 boards (gpud's
    # nvidia-smi-query.535.183.01.out.0.valid; the 590.48.01 `nvidia-smi -q` listing); 700 W is the SXM5 limit.
    "H100": GpuModel(
        "NVIDIA H100 80GB HBM3", 81_559 * BYTES_PER_MIB, "96.00.74.00.01", (9, 0), 700_000, 1980, 2619, 5, 18
    ),
    # tests/fixtures/nvidia-smi/a100-sxm4-v12.xml; 12 NVLinks on SXM4.
    "A100": GpuModel(
        "NVIDIA A100-SXM4-80GB", 81_920 * BYTES_PER_MIB, "92.00.36.00.02", (8, 0), 500_000, 1410, 1593, 4, 12
    ),
}


@dataclass(slots=True)
class SimulatedGpu:
    """One simulated GPU: the handle NVML calls take, its load and its faults."""

    index: int  # its place on the board; NVML's index differs once a GPU goes missing
    uuid: str
    serial: str
    pci: PciInfo
    load: float = 0.0  # what it delivers: `demand`, or a fifth of it while slow
    demand: float = 0.0  # the load its job asks of it (set_load)
    slow: bool = False
    energy_mj: float = 0.0
    energy_at: float = 0.0
    lost: bool = False  # fell off the bus
    hidden: bool = False  # not listed at all
    hot: bool = False
    ecc_sbe_volatile: int = 0
    ecc_dbe_volatile: int = 0
    ecc_sbe_aggregate: int = 0
    ecc_dbe_aggregate: int = 0
    remapped_correctable: int = 0
    remapped_uncorrectable: int = 0
    remap_pending: bool = False
    links_down: set[int] = field(default_factory=set)
    nvlink_crc_errors: int = 0
    nvlink_replay_errors: int = 0
    nvlink_recovery_errors: int = 0
    pcie_replays: int = 0
    mig: MigState = field(default_factory=MigState)


def _cuda_of(driver: str) -> int:
    """NVML's CUDA driver version (1000 * major + 10 * minor) of the newest CUDA `driver` runs fully.
    ValueError for a driver gpufleet cannot read or older than every CUDA it knows."""
    try:
        cuda = newest_cuda(parse_driver(driver))
    except InvalidInput as exc:
        raise ValueError(str(exc)) from None
    if cuda is None:
        raise ValueError(f"driver {driver} runs no CUDA version gpufleet knows (11.0 needs 450.51.05)")
    return 1000 * cuda[0] + 10 * cuda[1]


class SimulatedNvml(SimulatedMig):
    """A pynvml look-alike for one node: `gpu_count` GPUs of `gpu_model` (one of MODELS), MIG included
    (sim.mig).

    `seed` fixes the telemetry noise; by default it derives from the node name, so a simulated fleet
    replays identically. `clock` (seconds, monotonic) drives energy accumulation.
    Raises ValueError for an unknown model or a GPU count outside 0..MAX_GPUS_PER_NODE.
    """

    NVMLError = NVMLError
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_Uninitialized = NVMLError_Uninitialized
    NVMLError_InvalidArgument = NVMLError_InvalidArgument
    NVMLError_Timeout = NVMLError_Timeout
    NVMLError_GpuIsLost = NVMLError_GpuIsLost
    NVML_TEMPERATURE_GPU = NVML_TEMPERATURE_GPU

    def __init__(
        self,
        node_name: str,
        gpu_count: int = 8,
        gpu_model: str = "H200",
        seed: int | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        driver_version: str = DRIVER_VERSION,
    ) -> None:
        """Describe the node's GPUs; cheap enough to build thousands (no I/O, a hash per GPU). Another
        `driver_version` (a node left on an older driver) reports the newest CUDA that driver runs."""
        if gpu_model not in MODELS:
            raise ValueError(f"unknown GPU model {gpu_model!r}; known: {', '.join(sorted(MODELS))}")
        if not 0 <= gpu_count <= MAX_GPUS_PER_NODE:
            raise ValueError(f"gpu_count must be between 0 and {MAX_GPUS_PER_NODE}, not {gpu_count}")
        self.node_name = node_name
        self.model = MODELS[gpu_model]
        self.driver_version = driver_version
        self.cuda_driver_version = _cuda_of(driver_version)
        self._clock = clock
        self._rng = random.Random(zlib.crc32(node_name.encode()) if seed is None else seed)
        self._init_count = 0
        now = clock()
        self._gpus = [_make_gpu(node_name, index, now) for index in range(gpu_count)]
        self._listed = list(self._gpus)  # what NVML lists, in index order
        self._registrations: list[tuple[EventSet, SimulatedGpu, int]] = []
        self._processes: Counter[str] = Counter()  # UUID -> processes on it (sim.mig)
        self._reset_blocked = False

    # -- control, for the simulator: not part of pynvml ----------------------------------------------

    @property
    def gpus(self) -> tuple[SimulatedGpu, ...]:
        """Every GPU on the board, in board order, missing and lost ones included."""
        return tuple(self._gpus)

    def _all_gpus(self) -> tuple[SimulatedGpu, ...]:
        return tuple(self._gpus)

    def set_load(self, index: int, load: float) -> None:
        """Set how busy GPU `index` is, 0.0 (idle) to 1.0 (full matmul load); energy so far is kept."""
        gpu = self._gpus[index]
        self._accumulate_energy(gpu)
        gpu.demand = min(1.0, max(0.0, load))
        gpu.load = gpu.demand * (SLOW_SHARE if gpu.slow else 1.0)

    def inject(self, kind: str, gpu: int | None = None) -> str:
        """Apply fault `kind` (one of FAULTS) to GPU `gpu` (its place on the board; default 0); say what changed.

        Raises InvalidInput for an unknown kind or a GPU this node does not have.
        """
        if kind not in FAULTS:
            raise InvalidInput(f"the simulated GPUs have no fault {kind!r}; known: {', '.join(FAULTS)}")
        index = 0 if gpu is None else gpu
        if not 0 <= index < len(self._gpus):
            raise InvalidInput(f"this node has no GPU {index} (it has {len(self._gpus)})")
        target = self._gpus[index]
        if target.lost or target.hidden:
            raise InvalidInput(f"GPU {index} is already gone; heal the node first")
        if kind == "xid79":
            self._xid(target, 79)
            target.lost = True
            return f"GPU {index} fell off the bus (Xid 79)"
        if kind == "ecc-dbe":
            target.ecc_dbe_volatile += 1
            target.ecc_dbe_aggregate += 1
            target.remapped_uncorrectable += 1
            target.remap_pending = True
            self._xid(target, 48)
            return f"GPU {index}: uncorrectable ECC error (Xid 48), row remap pending"
        if kind == "thermal":
            target.hot = True
            return f"GPU {index} overheats: thermal slowdown"
        if kind == "gpu-slow":
            self._accumulate_energy(target)
            target.slow = True
            target.load = target.demand * SLOW_SHARE
            return f"GPU {index} delivers a fifth of the load it is asked: a straggler"
        if kind == "nvlink-down":
            if self.model.nvlinks < len(_NVLINKS_DOWN):
                raise InvalidInput(f"{self.model.name} has no NVLinks to take down")
            target.links_down.update(_NVLINKS_DOWN)
            target.nvlink_replay_errors += 16
            target.nvlink_recovery_errors += len(_NVLINKS_DOWN)
            self._xid(target, 74)
            return f"GPU {index}: NVLinks {', '.join(map(str, _NVLINKS_DOWN))} down (Xid 74)"
        target.hidden = True
        self._listed = [g for g in self._gpus if not g.hidden]
        return f"GPU {index} is no longer listed: NVML now sees {len(self._listed)} GPU(s)"

    def heal(self) -> str:
        """Undo every fault, as a repair and GPU reset would: lost and missing GPUs return, temperatures
        and links recover, volatile ECC counts and pending remaps clear; lifetime counters stay."""
        healed = 0
        for gpu in self._gpus:
            faulty = gpu.lost or gpu.hidden or gpu.hot or gpu.links_down or gpu.remap_pending or gpu.ecc_dbe_volatile
            healed += bool(faulty or gpu.slow)
            if gpu.slow:
                self._accumulate_energy(gpu)
                gpu.load = gpu.demand
            gpu.lost = gpu.hidden = gpu.hot = gpu.remap_pending = gpu.slow = False
            gpu.links_down.clear()
            gpu.ecc_sbe_volatile = gpu.ecc_dbe_volatile = 0
        self._listed = list(self._gpus)
        return f"{healed} GPU(s) healed"

    # -- library lifetime: real NVML counts nested inits; so does this -----------------------------

    def nvmlInit(self) -> None:
        """Start (or nest) a session."""
        self._init_count += 1

    def nvmlShutdown(self) -> None:
        """End one session; raises NVMLError_Uninitialized without one."""
        self._check()
        self._init_count -= 1

    # -- system queries ----------------------------------------------------------------------------

    def nvmlSystemGetDriverVersion(self) -> str:
        """The driver version, e.g. "580.159.04"."""
        self._check()
        return self.driver_version

    def nvmlSystemGetNVMLVersion(self) -> str:
        """The NVML library version."""
        self._check()
        return NVML_VERSION

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        """The CUDA version the driver supports, as 1000 * major + 10 * minor."""
        self._check()
        return self.cuda_driver_version

    def nvmlDeviceGetCount(self) -> int:
        """How many GPUs NVML lists (a missing GPU is not counted)."""
        self._check()
        return len(self._listed)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> SimulatedGpu:
        """The handle of GPU `index`; raises NVMLError_InvalidArgument past the last one, GpuIsLost for a lost one."""
        self._check()
        if not 0 <= index < len(self._listed):
            raise NVMLError_InvalidArgument(f"no GPU {index}")
        return self._live(self._listed[index])

    def nvmlDeviceGetIndex(self, handle: SimulatedGpu) -> int:
        """The GPU's NVML index."""
        self._live(handle)
        return self._listed.index(handle)

    # -- device identity: fixed for the life of the node --------------------------------------------

    def nvmlDeviceGetName(self, handle: SimulatedGpu) -> str:
        """The marketing name, e.g. "NVIDIA H200"."""
        self._live(handle)
        return self.model.name

    def nvmlDeviceGetUUID(self, handle: SimulatedGpu | ComputeInstance) -> str:
        """ "GPU-" and a UUID derived from (node name, index); a MIG device's "MIG-…"."""
        if isinstance(handle, ComputeInstance):
            return self._mig_device(handle).uuid
        return self._live(handle).uuid

    def nvmlDeviceGetSerial(self, handle: SimulatedGpu) -> str:
        """A 13-digit board serial derived from the UUID."""
        return self._live(handle).serial

    def nvmlDeviceGetPciInfo(self, handle: SimulatedGpu) -> PciInfo:
        """PCI address in the HGX layout."""
        return self._live(handle).pci

    def nvmlDeviceGetMemoryInfo(self, handle: SimulatedGpu | ComputeInstance) -> MemoryInfo:
        """Framebuffer size and use in bytes; use grows with load as in the probe. A MIG device's own."""
        if isinstance(handle, ComputeInstance):
            return self.mig_memory(handle)
        self._live(handle)
        used = round(_IDLE_USED_BYTES + handle.load * (_LOAD_USED_BYTES - _IDLE_USED_BYTES))
        total = self.model.memory_total_bytes
        return MemoryInfo(total=total, free=total - used, used=used)

    def nvmlDeviceGetVbiosVersion(self, handle: SimulatedGpu) -> str:
        """The VBIOS version of the model."""
        self._live(handle)
        return self.model.vbios_version

    def nvmlDeviceGetEccMode(self, handle: SimulatedGpu) -> list[int]:
        """[current, pending]: ECC is on, as on every data-centre GPU."""
        self._live(handle)
        return [_ENABLED, _ENABLED]

    def nvmlDeviceGetCudaComputeCapability(self, handle: SimulatedGpu) -> tuple[int, int]:
        """(major, minor) of the model."""
        self._live(handle)
        return self.model.compute_capability

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: SimulatedGpu) -> int:
        """The power cap in mW."""
        self._live(handle)
        return self.model.power_limit_mw

    # -- telemetry: levels follow the load set through set_load, with a little noise ---------------

    def nvmlDeviceGetUtilizationRates(self, handle: SimulatedGpu) -> Utilization:
        """Percent of time the GPU and its memory were busy."""
        self._live(handle)
        if handle.load == 0.0:
            return Utilization(gpu=0, memory=0)
        busy = min(100, max(0, round(100 * handle.load) - self._rng.randint(0, 1)))
        return Utilization(gpu=busy, memory=round(_LOAD_MEMORY_UTIL * handle.load))

    def nvmlDeviceGetTemperature(self, handle: SimulatedGpu, sensor: int) -> int:
        """GPU temperature in C; only the GPU sensor exists, as on real boards."""
        self._live(handle)
        if sensor != NVML_TEMPERATURE_GPU:
            raise NVMLError_InvalidArgument(f"no temperature sensor {sensor}")
        return self._gpu_temp(handle)

    def nvmlDeviceGetPowerUsage(self, handle: SimulatedGpu) -> int:
        """Current draw in mW, within about half a percent of the load's level."""
        self._live(handle)
        return round(self._power_mw(handle) * self._rng.uniform(0.995, 1.005))

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: SimulatedGpu) -> int:
        """Energy used since the node was built, in mJ: power integrated over the clock."""
        return self._energy(self._live(handle))

    def nvmlDeviceGetClockInfo(self, handle: SimulatedGpu, clock_type: int) -> int:
        """Current clock in MHz: SM (and graphics, the same domain on these GPUs) or memory."""
        self._live(handle)
        if clock_type in (0, api.NVML_CLOCK_SM):  # 0: NVML_CLOCK_GRAPHICS
            return self._sm_clock(handle)
        if clock_type == api.NVML_CLOCK_MEM:
            return self.model.mem_clock_mhz
        raise NVMLError_InvalidArgument(f"no clock {clock_type}")

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: SimulatedGpu) -> int:
        """Why the clocks are held: idle, the power cap under full load, thermal slowdown when hot."""
        self._live(handle)
        if handle.load == 0.0:
            reasons = api.CLOCKS_EVENT_GPU_IDLE  # the probe's idle readout: 1
        elif handle.load >= _POWER_CAPPED_LOAD:
            reasons = api.CLOCKS_EVENT_SW_POWER_CAP
        else:
            reasons = 0
        return reasons | (THERMAL_REASONS if handle.hot else 0)

    nvmlDeviceGetCurrentClocksThrottleReasons = nvmlDeviceGetCurrentClocksEventReasons  # the old name

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: SimulatedGpu) -> int:
        """PCIe generation now (nvidia-smi-q.xml: 5 on the H200)."""
        self._live(handle)
        return self.model.pcie_gen

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: SimulatedGpu) -> int:
        """Highest PCIe generation of the GPU and slot."""
        self._live(handle)
        return self.model.pcie_gen

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: SimulatedGpu) -> int:
        """PCIe lanes now: 16."""
        self._live(handle)
        return 16

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: SimulatedGpu) -> int:
        """PCIe lanes at most: 16."""
        self._live(handle)
        return 16

    def nvmlDeviceGetPcieReplayCounter(self, handle: SimulatedGpu) -> int:
        """PCIe replays since driver load."""
        return self._live(handle).pcie_replays

    def nvmlDeviceGetTotalEccErrors(self, handle: SimulatedGpu, error_type: int, counter_type: int) -> int:
        """Corrected (0) or uncorrected (1) ECC errors, volatile (0) or aggregate (1)."""
        self._live(handle)
        counts = {
            (api.NVML_MEMORY_ERROR_TYPE_CORRECTED, api.NVML_VOLATILE_ECC): handle.ecc_sbe_volatile,
            (api.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, api.NVML_VOLATILE_ECC): handle.ecc_dbe_volatile,
            (api.NVML_MEMORY_ERROR_TYPE_CORRECTED, api.NVML_AGGREGATE_ECC): handle.ecc_sbe_aggregate,
            (api.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, api.NVML_AGGREGATE_ECC): handle.ecc_dbe_aggregate,
        }
        if (error_type, counter_type) not in counts:
            raise NVMLError_InvalidArgument(f"no ECC counter ({error_type}, {counter_type})")
        return counts[(error_type, counter_type)]

    def nvmlDeviceGetRemappedRows(self, handle: SimulatedGpu) -> tuple[int, int, int, int]:
        """(correctable, uncorrectable, pending, failure), as pynvml returns them."""
        self._live(handle)
        return (handle.remapped_correctable, handle.remapped_uncorrectable, int(handle.remap_pending), 0)

    def nvmlDeviceGetRetiredPages(self, handle: SimulatedGpu, cause: int) -> list[int]:
        """Not on a GPU that remaps rows: NotSupported."""
        self._live(handle)
        raise NVMLError_NotSupported("Not Supported")

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: SimulatedGpu) -> int:
        """Not on a GPU that remaps rows (the probe's answer): NotSupported."""
        self._live(handle)
        raise NVMLError_NotSupported("Not Supported")

    def nvmlDeviceGetNvLinkState(self, handle: SimulatedGpu, link: int) -> int:
        """1 if NVLink `link` is active; InvalidArgument past the model's last link."""
        self._live(handle)
        if not 0 <= link < self.model.nvlinks:
            raise NVMLError_InvalidArgument(f"no NVLink {link}")
        return _DISABLED if link in handle.links_down else _ENABLED

    def nvmlDeviceGetFieldValues(self, handle: SimulatedGpu, field_ids: list[Any]) -> list[FieldValue]:
        """Many values in one call: each request is a field id or (field id, scope id); each answer carries
        its own nvmlReturn (NOT_SUPPORTED for a field this GPU lacks)."""
        self._live(handle)
        return [self._field(handle, request) for request in field_ids]

    # -- events --------------------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> EventSet:
        """A new, empty event set."""
        self._check()
        return EventSet()

    def nvmlDeviceRegisterEvents(self, handle: SimulatedGpu, event_types: int, event_set: EventSet) -> None:
        """Deliver the GPU's events of `event_types` (a mask) to `event_set`."""
        self._live(handle)
        self._registrations.append((event_set, handle, event_types))

    def nvmlEventSetWait(self, event_set: EventSet, timeout_ms: int) -> EventData:
        """The oldest event, waiting up to `timeout_ms`; raises NVMLError_Timeout when none came."""
        self._check()
        event = event_set.take(timeout_ms)
        if event is None:
            raise NVMLError_Timeout("Timeout")
        return event

    def nvmlEventSetFree(self, event_set: EventSet) -> None:
        """Forget the set and its registrations."""
        self._check()
        self._registrations = [r for r in self._registrations if r[0] is not event_set]

    # -- inside ------------------------------------------------------------------------------------

    def _field(self, gpu: SimulatedGpu, request: Any) -> FieldValue:
        field_id, scope = request if isinstance(request, tuple) else (request, 0)
        if field_id == api.FI_NVLINK_GET_STATE:
            if not 0 <= scope < self.model.nvlinks:
                return _refused(field_id, scope, api.NVML_ERROR_INVALID_ARGUMENT)
            value: float = _DISABLED if scope in gpu.links_down else _ENABLED
        elif field_id in _FIELD_READERS:
            value = _FIELD_READERS[field_id](self, gpu)
        else:
            return _refused(field_id, scope, api.NVML_ERROR_NOT_SUPPORTED)
        if field_id == api.FI_TOTAL_ENERGY_CONSUMPTION:  # new every call: not worth keeping
            return FieldValue(field_id, scope, 0, 0, 3, api.NVML_SUCCESS, FieldValueUnion("ullVal", value))
        return _answer(field_id, scope, value)

    def _xid(self, gpu: SimulatedGpu, xid: int) -> None:
        """Deliver an Xid to every event set registered for it on this GPU."""
        for event_set, handle, mask in self._registrations:
            if handle is gpu and mask & api.EVENT_TYPE_XID_CRITICAL_ERROR:
                event_set.push(EventData(device=gpu, eventType=api.EVENT_TYPE_XID_CRITICAL_ERROR, eventData=xid))

    def _gpu_temp(self, gpu: SimulatedGpu) -> int:
        level = HOT_GPU_C if gpu.hot else _IDLE_TEMP_C + gpu.load * (LOAD_TEMP_C - _IDLE_TEMP_C)
        return round(level + self._rng.uniform(-0.5, 0.5))

    def _mem_temp(self, gpu: SimulatedGpu) -> int:
        if gpu.hot:
            return _HOT_MEM_C
        return round(_IDLE_TEMP_C + gpu.load * (LOAD_TEMP_C - _IDLE_TEMP_C)) - _MEM_BELOW_GPU_C

    def _sm_clock(self, gpu: SimulatedGpu) -> int:
        clock = _IDLE_SM_CLOCK_MHZ if gpu.load == 0.0 else self.model.sm_clock_max_mhz * _LOAD_SM_CLOCK_SHARE
        return round(clock / 2 if gpu.hot else clock)

    def _energy(self, gpu: SimulatedGpu) -> int:
        self._accumulate_energy(gpu)
        return int(gpu.energy_mj)

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

    def _live(self, gpu: SimulatedGpu) -> SimulatedGpu:
        """Refuse a query outside a session or on a GPU that fell off the bus or is no longer listed."""
        if self._init_count <= 0:
            raise NVMLError_Uninitialized("NVML not initialised: call nvmlInit first")
        if gpu.lost:
            raise NVMLError_GpuIsLost("GPU is lost")
        if gpu.hidden:
            raise NVMLError_InvalidArgument("no such GPU")
        return gpu


# Field id -> value, for nvmlDeviceGetFieldValues. Retired pages are absent on purpose (see the module).
_FIELD_READERS: dict[int, Callable[[SimulatedNvml, SimulatedGpu], float]] = {
    api.FI_ECC_SBE_VOL_TOTAL: lambda nvml, gpu: gpu.ecc_sbe_volatile,
    api.FI_ECC_DBE_VOL_TOTAL: lambda nvml, gpu: gpu.ecc_dbe_volatile,
    api.FI_ECC_SBE_AGG_TOTAL: lambda nvml, gpu: gpu.ecc_sbe_aggregate,
    api.FI_ECC_DBE_AGG_TOTAL: lambda nvml, gpu: gpu.ecc_dbe_aggregate,
    api.FI_REMAPPED_COR: lambda nvml, gpu: gpu.remapped_correctable,
    api.FI_REMAPPED_UNC: lambda nvml, gpu: gpu.remapped_uncorrectable,
    api.FI_REMAPPED_PENDING: lambda nvml, gpu: int(gpu.remap_pending),
    api.FI_REMAPPED_FAILURE: lambda nvml, gpu: 0,
    api.FI_MEMORY_TEMP: lambda nvml, gpu: nvml._mem_temp(gpu),
    api.FI_TOTAL_ENERGY_CONSUMPTION: lambda nvml, gpu: nvml._energy(gpu),
    api.FI_PCIE_REPLAY_COUNTER: lambda nvml, gpu: gpu.pcie_replays,
    api.FI_NVLINK_LINK_COUNT: lambda nvml, gpu: nvml.model.nvlinks,
    # NVML keeps flow-control and data CRC errors apart; the simulator counts them as one, on the first.
    api.FI_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: lambda nvml, gpu: gpu.nvlink_crc_errors,
    api.FI_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL: lambda nvml, gpu: 0,
    api.FI_NVLINK_REPLAY_ERROR_COUNT_TOTAL: lambda nvml, gpu: gpu.nvlink_replay_errors,
    api.FI_NVLINK_RECOVERY_ERROR_COUNT_TOTAL: lambda nvml, gpu: gpu.nvlink_recovery_errors,
}


@functools.lru_cache(maxsize=4096)
def _answer(field_id: int, scope: int, value: float) -> FieldValue:
    """A successful field answer; answers are immutable, so a thousand nodes share the few distinct ones
    (most counters are zero), which keeps the simulator's cost per sample down. Timestamps stay 0."""
    if field_id == api.FI_MEMORY_TEMP:  # a 32-bit value in real NVML; the rest are 64-bit counters
        return FieldValue(field_id, scope, 0, 0, 1, api.NVML_SUCCESS, FieldValueUnion("uiVal", value))
    return FieldValue(field_id, scope, 0, 0, 3, api.NVML_SUCCESS, FieldValueUnion("ullVal", value))


@functools.lru_cache(maxsize=1024)
def _refused(field_id: int, scope: int, code: int) -> FieldValue:
    """A field answer with an error code and no value."""
    return FieldValue(field_id, scope, 0, 0, 3, code, None)


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


__all__ = [
    "FAULTS",
    "HGX_PCI_BUSES",
    "MODELS",
    "GpuModel",
    "NVMLError",
    "NVMLError_GpuIsLost",
    "NVMLError_InvalidArgument",
    "NVMLError_NotSupported",
    "NVMLError_Timeout",
    "NVMLError_Uninitialized",
    "SimulatedGpu",
    "SimulatedNvml",
]
