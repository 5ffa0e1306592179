"""MIG on a simulated GPU: NVML's MIG calls, answered the way the driver answers them.

`SimulatedMig` is mixed into `SimulatedNvml`, so the agent's real MIG code (agent.gpu.mig_inventory,
agent.gpu.mig_apply) runs unchanged against a simulated node. What it models, because the agent and the
head must cope with it on real GPUs:

- Only the models in protocol.mig's tables (A100, H100, H200) have MIG; other GPUs answer NotSupported.
- Turning MIG on or off resets the GPU: refused with InUse while any process runs on the GPU or on one
  of its instances, or while GPU instances still exist when turning it off. `block_reset()` models a
  GPU that cannot be reset in place (passed through to a VM): the change then stays pending and the
  activation status says NVML_ERROR_RESET_REQUIRED, as NVML does.
- GPU instances take the placements of NVIDIA's tables; one that overlaps another is refused with
  InsufficientResources. A GPU instance with compute instances, or a compute instance a process runs
  on, cannot be destroyed (InUse).
- A MIG device (a compute instance) has its own UUID, new each time it is created, as on real GPUs.

Processes are the simulator's own notion (`attach`, `detach`): the simulated job executor attaches a
rank to the UUIDs in its CUDA_VISIBLE_DEVICES, and a UUID the node does not have is refused there.
"""

from __future__ import annotations

import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpufleet.agent.gpu import nvml_api as api
from gpufleet.protocol.mig import COMPUTE_PROFILE_OF_SLICES, MAX_INSTANCES_PER_GPU, MEMORY_SLOTS, Profile, profiles_of
from gpufleet.sim.nvml_types import (
    MemoryInfo,
    NVMLError_InsufficientResources,
    NVMLError_InUse,
    NVMLError_InvalidArgument,
    NVMLError_NotFound,
    NVMLError_NotSupported,
)

if TYPE_CHECKING:
    from gpufleet.sim.nvml import GpuModel, SimulatedGpu

BYTES_PER_MIB = 1024 * 1024
SMS_PER_SLICE = {"A100": 14, "H100": 16, "H200": 16}  # streaming multiprocessors per compute slice
_MIG_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_DNS, "mig.sim.gpufleet")


@dataclass(slots=True)
class Placement:
    """pynvml's c_nvmlGpuInstancePlacement_t."""

    start: int = 0
    size: int = 0


@dataclass(frozen=True, slots=True)
class GpuInstanceProfileInfo:
    """The fields of pynvml's c_nvmlGpuInstanceProfileInfo_v2_t that matter here (pynvml's names)."""

    id: int
    sliceCount: int
    instanceCount: int
    multiprocessorCount: int
    memorySizeMB: int
    name: bytes


@dataclass(frozen=True, slots=True)
class GpuInstanceInfo:
    """pynvml's c_nvmlGpuInstanceInfo_t."""

    device: Any
    id: int
    profileId: int
    placement: Placement


@dataclass(frozen=True, slots=True)
class DeviceAttributes:
    """The fields of pynvml's c_nvmlDeviceAttributes that matter here."""

    multiprocessorCount: int
    gpuInstanceSliceCount: int
    computeInstanceSliceCount: int
    memorySizeMB: int


@dataclass(eq=False, slots=True)
class ComputeInstance:
    """A compute instance; also the MIG device handle (nvmlDeviceGetMigDeviceHandleByIndex) it backs."""

    gpu_instance: GpuInstance
    id: int
    uuid: str


@dataclass(eq=False, slots=True)
class GpuInstance:
    gpu: SimulatedGpu
    id: int
    profile: Profile
    start: int
    computes: dict[int, ComputeInstance] = field(default_factory=dict)


@dataclass(slots=True)
class MigState:
    """One GPU's MIG mode and instances."""

    current: int = api.NVML_DEVICE_MIG_DISABLE
    pending: int = api.NVML_DEVICE_MIG_DISABLE
    instances: dict[int, GpuInstance] = field(default_factory=dict)  # by GPU instance id
    created: int = 0  # compute instances ever made: new UUIDs each time


class SimulatedMig:
    """NVML's MIG calls for SimulatedNvml (which provides `_live`, `model` and `gpus`)."""

    c_nvmlGpuInstancePlacement_t = Placement  # what the agent builds a placement with

    model: GpuModel
    _processes: Counter[str]
    _reset_blocked: bool

    def _live(self, gpu: SimulatedGpu) -> SimulatedGpu:  # pragma: no cover - SimulatedNvml's
        raise NotImplementedError

    # -- control, for the simulator: not part of pynvml ----------------------------------------------

    def attach(self, uuids: list[str]) -> None:
        """A process starts on these GPUs or MIG devices (its CUDA_VISIBLE_DEVICES). Raises ValueError,
        attaching none, for a UUID the node does not have ("" stands for no UUID and is skipped)."""
        uuids = [u for u in uuids if u]
        known = self.device_uuids()
        unknown = [u for u in uuids if u not in known]
        if unknown:
            raise ValueError(f"no GPU or MIG device {', '.join(unknown)} on this node")
        self._processes.update(uuids)

    def detach(self, uuids: list[str]) -> None:
        """The process on these UUIDs ended."""
        self._processes.subtract(u for u in uuids if u)
        self._processes += Counter()  # drop the zeros

    def device_uuids(self) -> set[str]:
        """Every UUID a process may name: whole GPUs without MIG, and MIG devices."""
        out: set[str] = set()
        for gpu in self._all_gpus():
            if gpu.mig.current == api.NVML_DEVICE_MIG_ENABLE:
                out.update(ci.uuid for gi in gpu.mig.instances.values() for ci in gi.computes.values())
            else:
                out.add(gpu.uuid)
        return out

    def block_reset(self, blocked: bool = True) -> None:
        """Make MIG mode changes wait for a reset that cannot happen in place (a GPU in a VM)."""
        self._reset_blocked = blocked

    def _all_gpus(self) -> tuple[SimulatedGpu, ...]:
        raise NotImplementedError  # pragma: no cover - SimulatedNvml's

    # -- mode ------------------------------------------------------------------------------------------

    def nvmlDeviceGetMigMode(self, handle: SimulatedGpu) -> list[int]:
        """[current, pending]; NotSupported on a GPU without MIG."""
        self._mig_gpu(handle)
        return [handle.mig.current, handle.mig.pending]

    def nvmlDeviceSetMigMode(self, handle: SimulatedGpu, mode: int) -> int:
        """Ask for MIG on (1) or off (0); the GPU is reset to apply it. Returns the activation status:
        NVML_SUCCESS, or NVML_ERROR_RESET_REQUIRED while the reset is blocked (the change stays pending)."""
        self._mig_gpu(handle)
        if mode not in (api.NVML_DEVICE_MIG_DISABLE, api.NVML_DEVICE_MIG_ENABLE):
            raise NVMLError_InvalidArgument(f"no MIG mode {mode}")
        busy = self._busy_on(handle)
        if busy:
            raise NVMLError_InUse(f"In use by another client: {', '.join(sorted(busy))}")
        if mode == api.NVML_DEVICE_MIG_DISABLE and handle.mig.instances:
            raise NVMLError_InUse("In use by another client: GPU instances exist")
        handle.mig.pending = mode
        if self._reset_blocked:
            return api.NVML_ERROR_RESET_REQUIRED if mode != handle.mig.current else api.NVML_SUCCESS
        handle.mig.current = mode
        return api.NVML_SUCCESS

    # -- GPU instances ---------------------------------------------------------------------------------

    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: SimulatedGpu, profile: int, version: int = 2) -> Any:
        """The profile behind NVML_GPU_INSTANCE_PROFILE_* `profile`; NotSupported where this GPU has none."""
        found = self._profile_by(handle, lambda p: p.nvml_profile == profile)
        sms = SMS_PER_SLICE.get(_family_word(self.model.name), 16) * found.slices
        return GpuInstanceProfileInfo(
            found.profile_id, found.slices, found.max_count, sms, found.memory_mib, f"MIG {found.name}".encode()
        )

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, handle: SimulatedGpu, profile_id: int, placement: Any) -> Any:
        """A GPU instance of profile id `profile_id` at `placement.start`. InsufficientResources when the
        placement is not one the profile allows or overlaps an instance."""
        found = self._profile_by(handle, lambda p: p.profile_id == profile_id)
        start = int(placement.start)
        taken = {slot for gi in handle.mig.instances.values() for slot in range(gi.start, gi.start + gi.profile.size)}
        slots = set(range(start, start + found.size))
        if start not in found.starts or start + found.size > MEMORY_SLOTS or slots & taken:
            raise NVMLError_InsufficientResources("Insufficient Resources")
        if len(handle.mig.instances) >= MAX_INSTANCES_PER_GPU:
            raise NVMLError_InsufficientResources("Insufficient Resources")
        gi_id = next(i for i in range(1, 64) if i not in handle.mig.instances)
        instance = GpuInstance(handle, gi_id, found, start)
        handle.mig.instances[gi_id] = instance
        return instance

    def nvmlDeviceGetGpuInstanceById(self, handle: SimulatedGpu, gpu_instance_id: int) -> Any:
        """The GPU instance `gpu_instance_id`; NotFound when there is none."""
        self._enabled(handle)
        found = handle.mig.instances.get(gpu_instance_id)
        if found is None:
            raise NVMLError_NotFound("Not Found")
        return found

    def nvmlGpuInstanceGetInfo(self, instance: GpuInstance) -> Any:
        self._live(instance.gpu)
        return GpuInstanceInfo(
            instance.gpu, instance.id, instance.profile.profile_id, Placement(instance.start, instance.profile.size)
        )

    def nvmlGpuInstanceDestroy(self, instance: GpuInstance) -> None:
        """InUse while it has compute instances."""
        self._live(instance.gpu)
        if instance.computes:
            raise NVMLError_InUse("In use by another client: compute instances exist")
        instance.gpu.mig.instances.pop(instance.id, None)

    # -- compute instances -----------------------------------------------------------------------------

    def nvmlGpuInstanceCreateComputeInstance(self, instance: GpuInstance, profile: int) -> Any:
        """The one compute instance spanning the GPU instance (gpufleet makes no smaller ones)."""
        self._live(instance.gpu)
        if COMPUTE_PROFILE_OF_SLICES.get(instance.profile.slices) != profile:
            raise NVMLError_NotSupported("Not Supported")
        if instance.computes:
            raise NVMLError_InsufficientResources("Insufficient Resources")
        gpu = instance.gpu
        gpu.mig.created += 1
        mig_uuid = uuid.uuid5(_MIG_NAMESPACE, f"{gpu.uuid}/{instance.id}/0/{gpu.mig.created}")
        compute = ComputeInstance(instance, 0, f"MIG-{mig_uuid}")
        instance.computes[0] = compute
        return compute

    def nvmlGpuInstanceGetComputeInstanceById(self, instance: GpuInstance, compute_instance_id: int) -> Any:
        self._live(instance.gpu)
        found = instance.computes.get(compute_instance_id)
        if found is None:
            raise NVMLError_NotFound("Not Found")
        return found

    def nvmlComputeInstanceDestroy(self, compute: ComputeInstance) -> None:
        """InUse while a process runs on it."""
        self._live(compute.gpu_instance.gpu)
        if self._processes[compute.uuid]:
            raise NVMLError_InUse("In use by another client")
        compute.gpu_instance.computes.pop(compute.id, None)

    # -- MIG devices -----------------------------------------------------------------------------------

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: SimulatedGpu) -> int:
        self._mig_gpu(handle)
        return MAX_INSTANCES_PER_GPU if handle.mig.current == api.NVML_DEVICE_MIG_ENABLE else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: SimulatedGpu, index: int) -> Any:
        """The MIG device at `index`, in GPU instance then compute instance order; NotFound past the last."""
        self._enabled(handle)
        devices = [
            ci for _, gi in sorted(handle.mig.instances.items()) for _, ci in sorted(gi.computes.items())
        ]  # fmt: skip
        if not 0 <= index < len(devices):
            raise NVMLError_NotFound("Not Found")
        return devices[index]

    def nvmlDeviceIsMigDeviceHandle(self, handle: Any) -> int:
        return int(isinstance(handle, ComputeInstance))

    def nvmlDeviceGetGpuInstanceId(self, device: ComputeInstance) -> int:
        return self._mig_device(device).gpu_instance.id

    def nvmlDeviceGetComputeInstanceId(self, device: ComputeInstance) -> int:
        return self._mig_device(device).id

    def nvmlDeviceGetAttributes(self, device: ComputeInstance) -> Any:
        profile = self._mig_device(device).gpu_instance.profile
        sms = SMS_PER_SLICE.get(_family_word(self.model.name), 16) * profile.slices
        return DeviceAttributes(sms, profile.slices, profile.slices, profile.memory_mib)

    def mig_memory(self, device: ComputeInstance) -> MemoryInfo:
        """nvmlDeviceGetMemoryInfo of a MIG device: its own share of the memory."""
        total = self._mig_device(device).gpu_instance.profile.memory_mib * BYTES_PER_MIB
        used = total // 4 if self._processes[device.uuid] else 12 * BYTES_PER_MIB  # a job's use, or a bare context
        return MemoryInfo(total=total, free=total - used, used=used)

    # -- inside ------------------------------------------------------------------------------------------

    def _mig_gpu(self, handle: SimulatedGpu) -> SimulatedGpu:
        self._live(handle)
        if not profiles_of(self.model.name, self.model.memory_total_bytes // BYTES_PER_MIB):
            raise NVMLError_NotSupported("Not Supported")
        return handle

    def _enabled(self, handle: SimulatedGpu) -> SimulatedGpu:
        """MIG calls on instances need MIG on: NotSupported otherwise, as NVML answers."""
        self._mig_gpu(handle)
        if handle.mig.current != api.NVML_DEVICE_MIG_ENABLE:
            raise NVMLError_NotSupported("Not Supported: MIG mode is disabled")
        return handle

    def _profile_by(self, handle: SimulatedGpu, match: Any) -> Profile:
        self._enabled(handle)
        offered = profiles_of(self.model.name, self.model.memory_total_bytes // BYTES_PER_MIB)
        found = next((p for p in offered.values() if match(p)), None)
        if found is None:
            raise NVMLError_NotSupported("Not Supported")
        return found

    def _mig_device(self, device: Any) -> ComputeInstance:
        if not isinstance(device, ComputeInstance):
            raise NVMLError_InvalidArgument("not a MIG device handle")
        self._live(device.gpu_instance.gpu)
        return device

    def _busy_on(self, gpu: SimulatedGpu) -> set[str]:
        """The UUIDs of this GPU and its MIG devices that processes run on."""
        mine = {gpu.uuid} | {ci.uuid for gi in gpu.mig.instances.values() for ci in gi.computes.values()}
        return {u for u in mine if self._processes[u]}


def _family_word(model_name: str) -> str:
    return next((w for w in SMS_PER_SLICE if w in model_name.upper()), "")
