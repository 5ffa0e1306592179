"""MIG through NVML: read a GPU's MIG devices, and give a GPU a layout (protocol.mig).

Both work on anything shaped like the `pynvml` module: the real one on a node, `SimulatedNvml` in the
simulator and the tests. Only NVML's documented calls are used, and instances are found by id
(nvmlDeviceGetGpuInstanceById for ids 1..MAX_GPU_INSTANCE_ID) rather than through the calls that fill
ctypes arrays, so the simulator needs no ctypes and the code reads the same for both.

Applying a layout is destructive and the agent does it only when the head asks (MigApply), for GPUs the
head found idle. NVML is the last word on "idle": a GPU or instance a process runs on refuses to change
(NVML_ERROR_IN_USE), and the GPU is then left as it was found, with the reason sent back.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Iterator
from typing import Any, Protocol

from gpufleet.agent.gpu import nvml_api as api
from gpufleet.agent.gpu.ports import as_text
from gpufleet.protocol.mig import (
    COMPUTE_PROFILE_OF_SLICES,
    MAX_INSTANCES_PER_GPU,
    LayoutError,
    MigInstance,
    PlacedInstance,
    plan,
    profiles_of,
)

logger = logging.getLogger(__name__)

MAX_GPU_INSTANCE_ID = 14  # NVML numbers GPU instances 1..14 on every MIG GPU so far
MAX_COMPUTE_INSTANCE_ID = 7


class MigError(Exception):
    """A layout could not be applied to a GPU; the message says why (in use, reset needed, refused)."""


class MigControl(Protocol):
    """What the agent applies the head's MIG layouts with (NvmlReader, over real or simulated NVML)."""

    def apply_mig(self, index: int, layout: str) -> None:
        """Give GPU `index` the layout; raises MigError with the reason."""
        ...


def read_instances(nvml: Any, handle: Any, model: str, memory_total_mib: int) -> list[MigInstance]:
    """The GPU's MIG devices (none while MIG is off). Raises nvml.NVMLError where NVML fails."""
    count = int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))
    names = _profile_names(nvml, handle)
    out = []
    for index in range(min(count, MAX_INSTANCES_PER_GPU)):
        try:
            device = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, index)
        except nvml.NVMLError as exc:
            if api.error_code(exc) == api.NVML_ERROR_NOT_FOUND:
                continue  # a slot without a MIG device
            raise
        gi_id = int(nvml.nvmlDeviceGetGpuInstanceId(device))
        info = nvml.nvmlGpuInstanceGetInfo(nvml.nvmlDeviceGetGpuInstanceById(handle, gi_id))
        attributes = nvml.nvmlDeviceGetAttributes(device)
        profile = names.get(int(info.profileId)) or _name_from_table(
            model, memory_total_mib, int(attributes.gpuInstanceSliceCount), int(attributes.memorySizeMB)
        )
        compute = int(attributes.computeInstanceSliceCount)
        if profile and 0 < compute < int(attributes.gpuInstanceSliceCount):
            profile = f"{compute}c.{profile}"  # a part of its GPU instance, as NVIDIA names it: not scheduled
        out.append(
            MigInstance(
                uuid=as_text(nvml.nvmlDeviceGetUUID(device)),
                profile=profile,
                gpu_instance=gi_id,
                compute_instance=int(nvml.nvmlDeviceGetComputeInstanceId(device)),
                start=int(info.placement.start),
                slices=max(1, int(attributes.gpuInstanceSliceCount)),
                memory_mib=int(attributes.memorySizeMB),  # the figure Slurm names the device by
            )
        )
    return out


def apply_layout(nvml: Any, handle: Any, layout: str, model: str, memory_total_mib: int) -> None:
    """Make the GPU's MIG match `layout` ("none": MIG off). Raises MigError (the GPU as found, or with
    its old instances gone where NVML refused half-way: the head reads the inventory that follows)."""
    try:
        wanted = plan(layout, model, memory_total_mib)
    except LayoutError as exc:
        raise MigError(str(exc)) from None
    try:
        if not wanted:
            if _mode(nvml, handle) == api.NVML_DEVICE_MIG_ENABLE:
                _destroy_all(nvml, handle)
                _set_mode(nvml, handle, api.NVML_DEVICE_MIG_DISABLE)
            return
        if _mode(nvml, handle) != api.NVML_DEVICE_MIG_ENABLE:
            _set_mode(nvml, handle, api.NVML_DEVICE_MIG_ENABLE)
        else:
            _destroy_all(nvml, handle)
        for instance in wanted:
            _create(nvml, handle, instance)
    except nvml.NVMLError as exc:
        raise MigError(_reason(exc)) from None


def _mode(nvml: Any, handle: Any) -> int:
    return int(nvml.nvmlDeviceGetMigMode(handle)[0])


def _set_mode(nvml: Any, handle: Any, mode: int) -> None:
    """Change the MIG mode; NVML resets the GPU to apply it, which it cannot do everywhere (a VM)."""
    status = int(nvml.nvmlDeviceSetMigMode(handle, mode))
    if status != api.NVML_SUCCESS or _mode(nvml, handle) != mode:
        state = "on" if mode == api.NVML_DEVICE_MIG_ENABLE else "off"
        raise MigError(f"MIG {state} is pending a GPU reset the driver could not do in place (reboot the node)")


def _destroy_all(nvml: Any, handle: Any) -> None:
    """Every compute and GPU instance, compute instances first (NVML refuses the other order)."""
    for instance in _existing(nvml, nvml.nvmlDeviceGetGpuInstanceById, handle, range(1, MAX_GPU_INSTANCE_ID + 1)):
        for compute in _existing(
            nvml, nvml.nvmlGpuInstanceGetComputeInstanceById, instance, range(MAX_COMPUTE_INSTANCE_ID + 1)
        ):
            nvml.nvmlComputeInstanceDestroy(compute)
        nvml.nvmlGpuInstanceDestroy(instance)


def _existing(nvml: Any, get: Any, parent: Any, ids: range) -> Iterator[Any]:
    """The instances `get(parent, id)` finds among `ids`; an id without one is skipped (NVML says not found,
    or invalid for an id past what this GPU numbers)."""
    for instance_id in ids:
        try:
            yield get(parent, instance_id)
        except nvml.NVMLError as exc:
            if api.error_code(exc) not in (api.NVML_ERROR_NOT_FOUND, api.NVML_ERROR_INVALID_ARGUMENT):
                raise


def _create(nvml: Any, handle: Any, instance: PlacedInstance) -> None:
    """One GPU instance at its placement, and the compute instance spanning it."""
    profile = instance.profile
    info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, profile.nvml_profile)
    placement = nvml.c_nvmlGpuInstancePlacement_t()
    placement.start = instance.start
    placement.size = profile.size
    # pynvml hands the placement to the C function as given, and the C side takes a pointer.
    by_reference = ctypes.byref(placement) if isinstance(placement, ctypes.Structure) else placement
    created = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(handle, int(info.id), by_reference)
    nvml.nvmlGpuInstanceCreateComputeInstance(created, COMPUTE_PROFILE_OF_SLICES[profile.slices])


def _profile_names(nvml: Any, handle: Any) -> dict[int, str]:
    """NVML's profile id -> name ("1g.18gb") for the profiles this GPU offers, from the driver itself."""
    out = {}
    for constant in range(0x12):  # NVML_GPU_INSTANCE_PROFILE_COUNT in nvml.h 12.x and 13.x
        try:
            info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, constant)
        except nvml.NVMLError:
            continue  # a profile this GPU or driver lacks
        name = as_text(getattr(info, "name", b"")).removeprefix("MIG ").strip()
        if name:
            out[int(info.id)] = name
    return out


def _name_from_table(model: str, memory_total_mib: int, slices: int, memory_mib: int) -> str:
    """A profile's name from protocol.mig's tables where the driver gives none (an older driver): the
    profile with these compute slices whose memory is nearest; "" when the model is not in the tables."""
    fits = [p for p in profiles_of(model, memory_total_mib).values() if p.slices == slices]
    if not fits:
        return ""
    return min(fits, key=lambda p: abs(p.memory_mib - memory_mib)).name


def _reason(exc: BaseException) -> str:
    code = api.error_code(exc)
    if code == api.NVML_ERROR_IN_USE:
        return f"the GPU is in use (a process runs on it or one of its instances): {exc}"
    if code == api.NVML_ERROR_INSUFFICIENT_RESOURCES:
        return f"NVML refused an instance where gpufleet placed it: {exc}"
    return f"NVML refused the change: {exc}"
