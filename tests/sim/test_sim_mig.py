"""MIG on a simulated node through the agent's own NVML code (agent.gpu.mig over sim.mig): layouts applied
and read back, and the refusals real GPUs give (in use, a reset that cannot happen, overlapping placements)."""

from __future__ import annotations

import pytest

from gpufleet.agent.gpu import nvml_api as api
from gpufleet.agent.gpu.mig import MigError
from gpufleet.agent.gpu.nvml import NvmlReader
from gpufleet.agent.metrics.gpu import MIG_LOOK_ROUNDS, GpuCollector
from gpufleet.sim.mig import Placement
from gpufleet.sim.nvml import SimulatedNvml
from gpufleet.sim.nvml_types import NVMLError_InsufficientResources, NVMLError_InUse, NVMLError_NotSupported


@pytest.fixture
def node() -> tuple[SimulatedNvml, NvmlReader]:
    nvml = SimulatedNvml("mig-node", gpu_count=2)
    return nvml, NvmlReader(nvml, source="simulated")


def test_a_layout_applied_is_what_the_inventory_reads_back(node: tuple[SimulatedNvml, NvmlReader]) -> None:
    nvml, reader = node

    reader.apply_mig(0, "all-1g.18gb")
    reader.apply_mig(1, "3g.71gb+4g.71gb")
    gpu0, gpu1 = reader.read()

    assert gpu0.mig_mode == gpu1.mig_mode == "enabled"
    assert [(m.profile, m.start, m.slices, m.memory_mib) for m in gpu0.mig] == [
        ("1g.18gb", s, 1, 16384) for s in range(7)
    ]
    assert sorted((m.profile, m.start) for m in gpu1.mig) == [("3g.71gb", 4), ("4g.71gb", 0)]
    uuids = [m.uuid for m in gpu0.mig + gpu1.mig]
    assert all(u.startswith("MIG-") for u in uuids)
    assert len(set(uuids)) == 9
    assert nvml.device_uuids() == set(uuids)  # sliced GPUs are no longer whole devices


def test_a_new_layout_makes_new_devices_and_none_turns_mig_off(node: tuple[SimulatedNvml, NvmlReader]) -> None:
    nvml, reader = node
    reader.apply_mig(0, "all-1g.18gb")
    before = {m.uuid for m in reader.read()[0].mig}

    reader.apply_mig(0, "all-1g.18gb")
    again = {m.uuid for m in reader.read()[0].mig}
    reader.apply_mig(0, "none")
    gpu0 = reader.read()[0]

    assert before.isdisjoint(again)  # as on real GPUs: recreated instances get new UUIDs
    assert gpu0.mig_mode == "disabled"
    assert gpu0.mig == []
    assert gpu0.uuid in nvml.device_uuids()


def test_a_gpu_in_use_is_not_changed(node: tuple[SimulatedNvml, NvmlReader]) -> None:
    nvml, reader = node
    whole = reader.read()[0].uuid
    nvml.attach([whole])

    with pytest.raises(MigError, match="in use"):
        reader.apply_mig(0, "all-1g.18gb")
    assert reader.read()[0].mig_mode == "disabled"

    nvml.detach([whole])
    reader.apply_mig(0, "all-1g.18gb")
    busy = reader.read()[0].mig[3].uuid
    nvml.attach([busy])
    with pytest.raises(MigError, match="in use"):
        reader.apply_mig(0, "none")
    assert busy in {m.uuid for m in reader.read()[0].mig}


def test_a_reset_that_cannot_happen_leaves_the_change_pending(node: tuple[SimulatedNvml, NvmlReader]) -> None:
    nvml, reader = node
    nvml.block_reset()

    with pytest.raises(MigError, match="pending a GPU reset"):
        reader.apply_mig(0, "all-1g.18gb")

    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetMigMode(handle) == [api.NVML_DEVICE_MIG_DISABLE, api.NVML_DEVICE_MIG_ENABLE]
    assert reader.read()[0].mig_mode == "disabled"


def test_a_layout_the_gpu_cannot_take_is_refused_before_any_change(node: tuple[SimulatedNvml, NvmlReader]) -> None:
    _, reader = node
    reader.apply_mig(0, "all-1g.18gb")
    before = reader.read()[0].mig

    with pytest.raises(MigError, match="placements overlap"):
        reader.apply_mig(0, "3g.71gb+3g.71gb+1g.18gb")
    assert reader.read()[0].mig == before


def test_nvml_refuses_overlaps_and_busy_instances_like_the_driver() -> None:
    nvml = SimulatedNvml("raw", gpu_count=1)
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(NVMLError_NotSupported):  # MIG calls need MIG on
        nvml.nvmlDeviceGetGpuInstanceById(handle, 1)
    nvml.nvmlDeviceSetMigMode(handle, api.NVML_DEVICE_MIG_ENABLE)
    info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, 0x2)  # 3_SLICE
    assert (info.id, info.sliceCount, info.name) == (9, 3, b"MIG 3g.71gb")

    first = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(handle, info.id, Placement(0, 4))
    with pytest.raises(NVMLError_InsufficientResources):
        nvml.nvmlDeviceCreateGpuInstanceWithPlacement(handle, info.id, Placement(0, 4))
    with pytest.raises(NVMLError_InsufficientResources):  # 3g starts at 0 or 4 only
        nvml.nvmlDeviceCreateGpuInstanceWithPlacement(handle, info.id, Placement(2, 4))
    compute = nvml.nvmlGpuInstanceCreateComputeInstance(first, 0x2)
    with pytest.raises(NVMLError_InUse):  # its compute instance first
        nvml.nvmlGpuInstanceDestroy(first)
    nvml.attach([compute.uuid])
    with pytest.raises(NVMLError_InUse):
        nvml.nvmlComputeInstanceDestroy(compute)
    with pytest.raises(ValueError, match="no GPU or MIG device"):
        nvml.attach(["MIG-not-here"])


def test_each_mig_device_reports_its_own_memory(node: tuple[SimulatedNvml, NvmlReader]) -> None:
    nvml, reader = node
    collector = GpuCollector(nvml)
    before = collector.collect().entities

    reader.apply_mig(0, "3g.71gb+4g.71gb")
    busy = next(m for m in reader.read()[0].mig if m.profile == "3g.71gb")
    nvml.attach([busy.uuid])
    for _ in range(MIG_LOOK_ROUNDS):  # a GPU turned to MIG is looked at again within that many rounds
        after = collector.collect().entities
        if any(name.startswith("mig:") for name in after):
            break

    assert not any(name.startswith("mig:") for name in before)
    migs = {name: values for name, values in after.items() if name.startswith("mig:")}
    assert sorted(migs) == ["mig:0/1", "mig:0/2"]
    used = {m.gpu_instance: migs[f"mig:0/{m.gpu_instance}"]["fb_used_mib"] for m in reader.read()[0].mig}
    assert used[busy.gpu_instance] > used[next(i for i in used if i != busy.gpu_instance)]
    assert "gpu:0" in after
    assert "gpu:1" in after
