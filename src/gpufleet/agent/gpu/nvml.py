"""GPU inventory through NVML, the driver's own library, via nvidia-ml-py (the `pynvml` module).

Importing this module loads nothing: the library is imported on the first read, so a machine without
it can still import the agent and fall back to nvidia-smi or to no GPUs at all.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import ValidationError

from gpufleet.agent.gpu.mig import MigError, apply_layout, read_instances
from gpufleet.agent.gpu.nvml_api import NvmlLibrary, NvmlUnavailable, is_gpu_lost
from gpufleet.agent.gpu.ports import GpuReadError, as_text, bytes_to_mib, normalise_pci_bus_id
from gpufleet.protocol.inventory import GpuInfo, GpuSource, Mode
from gpufleet.protocol.mig import MigInstance

logger = logging.getLogger(__name__)

T = TypeVar("T")

# NVML's enable states: NVML_FEATURE_ENABLED for ECC and NVML_DEVICE_MIG_ENABLE for MIG are both 1.
_MODES: dict[int, Mode] = {1: "enabled", 0: "disabled"}


def cuda_version_text(version: int) -> str:
    """Spell NVML's CUDA driver version the way nvidia-smi does: 13000 -> "13.0", 12040 -> "12.4"."""
    return f"{version // 1000}.{(version % 1000) // 10}"


class NvmlReader:
    """Reads the GPU inventory through NVML.

    `nvml` is anything shaped like the `pynvml` module (the real one by default; a recording or the
    simulator in tests and in the fleet simulator). `source` is what the inventory will say it came
    from, so a simulated node can report "simulated" while using this same code path.
    Not thread-safe: one reader belongs to one agent loop.
    """

    source: GpuSource

    def __init__(self, nvml: Any | None = None, *, source: GpuSource = "nvml") -> None:
        """Keep the NVML object for later; nothing is loaded or initialised yet."""
        self._lib = NvmlLibrary(nvml)
        self.source = source

    def read(self) -> list[GpuInfo]:
        """Return every GPU NVML sees, in NVML index order.

        Raises GpuReadError when the library is missing, NVML cannot start, or the device count,
        a device handle or a field every GPU must have (name, UUID, PCI bus id, memory) cannot be read.
        Optional fields the GPU does not support come back as None instead. A GPU NVML reports lost
        (fallen off the bus) is left out, so the inventory still lists the GPUs that work.
        """
        nvml = self._started()
        driver = self._optional(nvml, "nvmlSystemGetDriverVersion", as_text)
        cuda = self._optional(nvml, "nvmlSystemGetCudaDriverVersion", cuda_version_text)
        count: int = self._required(nvml, "nvmlDeviceGetCount")
        gpus = []
        for index in range(count):
            try:
                handle = self._required(nvml, "nvmlDeviceGetHandleByIndex", index, gpu=index)
                gpus.append(self._read_device(nvml, index, handle, driver, cuda))
            except GpuReadError as exc:
                if exc.__cause__ is None or not is_gpu_lost(exc.__cause__):
                    raise
                logger.warning("leaving GPU %d out of the inventory: %s", index, exc)
        return gpus

    def nvml_version(self) -> str | None:
        """The NVML library's own version ("13.580.159.04"), or None where it will not say.

        Raises GpuReadError when NVML cannot be loaded or started.
        """
        return self._optional(self._started(), "nvmlSystemGetNVMLVersion", as_text)

    def close(self) -> None:
        """Shut NVML down if this reader started it; safe to call twice. A failing shutdown is only logged."""
        self._lib.close()

    def _started(self) -> Any:
        """The NVML object, imported and initialised on first use. Raises GpuReadError if it cannot be."""
        try:
            return self._lib.open()
        except NvmlUnavailable as exc:
            raise GpuReadError(str(exc)) from exc

    def _read_device(self, nvml: Any, index: int, handle: Any, driver: str | None, cuda: str | None) -> GpuInfo:
        """Build one GpuInfo; raises GpuReadError if a required field fails or the values are out of range."""
        pci = self._required(nvml, "nvmlDeviceGetPciInfo", handle, gpu=index)
        memory = self._required(nvml, "nvmlDeviceGetMemoryInfo", handle, gpu=index)
        model = as_text(self._required(nvml, "nvmlDeviceGetName", handle, gpu=index))
        mig_mode = self._optional(nvml, "nvmlDeviceGetMigMode", _current_mode, handle)
        try:
            return GpuInfo(
                index=index,
                uuid=as_text(self._required(nvml, "nvmlDeviceGetUUID", handle, gpu=index)),
                model=model,
                serial=self._optional(nvml, "nvmlDeviceGetSerial", as_text, handle),
                pci_bus_id=normalise_pci_bus_id(pci.busId),
                memory_total_mib=bytes_to_mib(int(memory.total)),
                driver_version=driver,
                cuda_version=cuda,
                vbios_version=self._optional(nvml, "nvmlDeviceGetVbiosVersion", as_text, handle),
                mig_mode=mig_mode,
                ecc_mode=self._optional(nvml, "nvmlDeviceGetEccMode", _current_mode, handle),
                compute_capability=self._optional(
                    nvml, "nvmlDeviceGetCudaComputeCapability", _compute_capability, handle
                ),
                power_limit_w=self._optional(nvml, "nvmlDeviceGetEnforcedPowerLimit", _milliwatts_to_watts, handle),
                mig=self._mig(nvml, index, handle, model, memory.total) if mig_mode == "enabled" else [],
            )
        except ValidationError as exc:
            raise GpuReadError(f"NVML gave values for GPU {index} that do not fit the inventory: {exc}") from exc

    def apply_mig(self, index: int, layout: str) -> None:
        """Give GPU `index` the MIG `layout` (agent.gpu.mig). Raises MigError with the reason."""
        try:
            nvml = self._started()
        except GpuReadError as exc:
            raise MigError(str(exc)) from None
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            model = as_text(nvml.nvmlDeviceGetName(handle))
            memory_mib = bytes_to_mib(int(nvml.nvmlDeviceGetMemoryInfo(handle).total))
        except nvml.NVMLError as exc:
            raise MigError(f"GPU {index}: {exc}") from None
        apply_layout(nvml, handle, layout, model, memory_mib)

    @staticmethod
    def _mig(nvml: Any, index: int, handle: Any, model: str, memory_bytes: int) -> list[MigInstance]:
        """The GPU's MIG devices; none, and a warning, where NVML will not list them (the GPU stays listed)."""
        try:
            return read_instances(nvml, handle, model, bytes_to_mib(int(memory_bytes)))
        except (nvml.NVMLError, ValidationError) as exc:
            logger.warning("GPU %d: cannot list its MIG devices: %s", index, exc)
            return []

    @staticmethod
    def _required(nvml: Any, name: str, *args: Any, gpu: int | None = None) -> Any:
        """Call an NVML function whose failure makes the inventory meaningless; raises GpuReadError."""
        try:
            return getattr(nvml, name)(*args)
        except nvml.NVMLError as exc:
            where = "" if gpu is None else f"GPU {gpu}: "
            raise GpuReadError(f"NVML read failed: {where}{name}: {exc}") from exc

    @staticmethod
    def _optional(nvml: Any, name: str, convert: Callable[[Any], T], *args: Any) -> T | None:
        """Call an NVML function for an optional field: None if the GPU, driver or library lacks it."""
        function = getattr(nvml, name, None)
        if function is None:
            # An older nvidia-ml-py without this binding: the field is simply unknown.
            return None
        try:
            return convert(function(*args))
        except nvml.NVMLError as exc:
            # NotSupported is routine (serials on consumer cards, MIG before Ampere); other errors on
            # one optional field should not hide the GPU either.
            logger.debug("%s unavailable: %s", name, exc)
            return None


def _current_mode(modes: Any) -> Mode | None:
    """(current, pending) from nvmlDeviceGetMigMode or nvmlDeviceGetEccMode -> the current mode."""
    return _MODES.get(int(modes[0]))


def _compute_capability(capability: Any) -> str:
    """(9, 0) -> "9.0"."""
    major, minor = capability
    return f"{int(major)}.{int(minor)}"


def _milliwatts_to_watts(milliwatts: Any) -> float:
    """NVML reports power in mW; the inventory speaks W."""
    return int(milliwatts) / 1000
