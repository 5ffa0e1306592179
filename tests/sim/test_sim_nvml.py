"""The simulated NVML, read through the agent's real NVML reader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufleet.agent.gpu.nvml import NvmlReader
from gpufleet.sim.nvml import HGX_PCI_BUSES, SimulatedNvml

PROBE = Path(__file__).resolve().parent.parent / "fixtures" / "h200" / "nvml-probe.json"


class FakeClock:
    """Monotonic seconds that move only when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_eight_h200s_shaped_like_the_real_one() -> None:
    gpus = NvmlReader(SimulatedNvml("node-001")).read()

    assert len(gpus) == 8
    assert [gpu.index for gpu in gpus] == list(range(8))
    assert len({gpu.uuid for gpu in gpus}) == 8
    assert len({gpu.serial for gpu in gpus}) == 8
    assert [gpu.pci_bus_id for gpu in gpus] == [f"00000000:{bus.lower()}:00.0" for bus in HGX_PCI_BUSES]
    for gpu in gpus:
        assert gpu.model == "NVIDIA H200"
        assert gpu.memory_total_mib == 143771
        assert gpu.uuid.startswith("GPU-")
        assert [len(part) for part in gpu.uuid[4:].split("-")] == [8, 4, 4, 4, 12]
        assert gpu.serial is not None
        assert gpu.serial.isdigit()
        assert len(gpu.serial) == 13
        assert (gpu.driver_version, gpu.cuda_version, gpu.vbios_version) == (
            "580.159.04",
            "13.0",
            "96.00.A5.00.1A",
        )
        assert (gpu.ecc_mode, gpu.mig_mode, gpu.compute_capability, gpu.power_limit_w) == (
            "enabled",
            "disabled",
            "9.0",
            700.0,
        )


def test_h200_constants_match_the_real_readout() -> None:
    probe = json.loads(PROBE.read_text())
    real = probe["gpus"][0]
    sim = SimulatedNvml("node-001", gpu_count=1)
    sim.nvmlInit()
    handle = sim.nvmlDeviceGetHandleByIndex(0)

    assert sim.nvmlSystemGetDriverVersion() == probe["driver"]
    assert sim.nvmlSystemGetNVMLVersion() == probe["nvml"]
    assert sim.nvmlSystemGetCudaDriverVersion() == probe["cuda_driver"]
    assert sim.nvmlDeviceGetName(handle) == real["nvmlDeviceGetName"]
    assert sim.nvmlDeviceGetMemoryInfo(handle).total == real["nvmlDeviceGetMemoryInfo"]["total"]
    assert sim.nvmlDeviceGetVbiosVersion(handle) == real["nvmlDeviceGetVbiosVersion"]
    assert sim.nvmlDeviceGetEnforcedPowerLimit(handle) == real["nvmlDeviceGetEnforcedPowerLimit"]
    assert list(sim.nvmlDeviceGetCudaComputeCapability(handle)) == real["nvmlDeviceGetCudaComputeCapability"]
    assert sim.nvmlDeviceGetMigMode(handle) == real["nvmlDeviceGetMigMode"]
    assert sim.nvmlDeviceGetEccMode(handle) == real["ecc_mode"]


def test_identity_is_stable_for_a_node_name_and_differs_between_nodes() -> None:
    first = NvmlReader(SimulatedNvml("node-001")).read()
    again = NvmlReader(SimulatedNvml("node-001", seed=7)).read()
    other = NvmlReader(SimulatedNvml("node-002")).read()

    assert [gpu.uuid for gpu in again] == [gpu.uuid for gpu in first]
    assert [gpu.serial for gpu in again] == [gpu.serial for gpu in first]
    assert not {gpu.uuid for gpu in other} & {gpu.uuid for gpu in first}


def test_reports_simulated_when_asked() -> None:
    assert NvmlReader(SimulatedNvml("n"), source="simulated").source == "simulated"


@pytest.mark.parametrize(
    ("model", "name", "memory_mib", "capability", "power_w"),
    [
        ("H100", "NVIDIA H100 80GB HBM3", 81559, "9.0", 700.0),
        ("A100", "NVIDIA A100-SXM4-80GB", 81920, "8.0", 500.0),
    ],
)
def test_other_models(model: str, name: str, memory_mib: int, capability: str, power_w: float) -> None:
    gpus = NvmlReader(SimulatedNvml("n", gpu_count=4, gpu_model=model)).read()

    assert len(gpus) == 4
    assert {(g.model, g.memory_total_mib, g.compute_capability, g.power_limit_w) for g in gpus} == {
        (name, memory_mib, capability, power_w)
    }


def test_unknown_model_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown GPU model 'B300'; known: A100, H100, H200"):
        SimulatedNvml("n", gpu_model="B300")


@pytest.mark.parametrize("count", [-1, 65])
def test_gpu_count_outside_the_protocol_limit_is_refused(count: int) -> None:
    with pytest.raises(ValueError, match="gpu_count"):
        SimulatedNvml("n", gpu_count=count)


def test_zero_gpus() -> None:
    assert NvmlReader(SimulatedNvml("cpu-only", gpu_count=0)).read() == []


def test_more_than_eight_gpus_get_distinct_bus_ids() -> None:
    gpus = NvmlReader(SimulatedNvml("big", gpu_count=12)).read()

    assert len({gpu.pci_bus_id for gpu in gpus}) == 12
    assert gpus[8].pci_bus_id == "00000001:18:00.0"


def test_queries_need_nvml_init_like_the_real_library() -> None:
    sim = SimulatedNvml("n")

    with pytest.raises(sim.NVMLError):
        sim.nvmlDeviceGetCount()
    sim.nvmlInit()
    assert sim.nvmlDeviceGetCount() == 8
    sim.nvmlShutdown()
    with pytest.raises(sim.NVMLError):
        sim.nvmlDeviceGetCount()


def test_bad_index_and_sensor_raise_nvml_errors() -> None:
    sim = SimulatedNvml("n", gpu_count=2)
    sim.nvmlInit()

    with pytest.raises(sim.NVMLError):
        sim.nvmlDeviceGetHandleByIndex(2)
    with pytest.raises(sim.NVMLError):
        sim.nvmlDeviceGetTemperature(sim.nvmlDeviceGetHandleByIndex(0), 1)


def test_telemetry_follows_load_like_the_probe() -> None:
    sim = SimulatedNvml("n", gpu_count=2, seed=1)
    sim.nvmlInit()
    idle, busy = sim.nvmlDeviceGetHandleByIndex(0), sim.nvmlDeviceGetHandleByIndex(1)

    sim.set_load(1, 1.0)

    assert sim.nvmlDeviceGetUtilizationRates(idle).gpu == 0
    assert sim.nvmlDeviceGetUtilizationRates(busy).gpu >= 99
    assert sim.nvmlDeviceGetUtilizationRates(busy).memory == 25
    assert 39 <= sim.nvmlDeviceGetTemperature(idle, sim.NVML_TEMPERATURE_GPU) <= 41
    assert 64 <= sim.nvmlDeviceGetTemperature(busy, sim.NVML_TEMPERATURE_GPU) <= 66
    assert 78_000 <= sim.nvmlDeviceGetPowerUsage(idle) <= 81_000
    assert 685_000 <= sim.nvmlDeviceGetPowerUsage(busy) <= 700_000
    assert sim.nvmlDeviceGetMemoryInfo(busy).used > sim.nvmlDeviceGetMemoryInfo(idle).used


def test_energy_integrates_power_over_time() -> None:
    clock = FakeClock()
    sim = SimulatedNvml("n", gpu_count=1, clock=clock)
    sim.nvmlInit()
    gpu = sim.nvmlDeviceGetHandleByIndex(0)
    start = sim.nvmlDeviceGetTotalEnergyConsumption(gpu)

    clock.now += 10  # 10 s idle at 79.3 W
    idle_energy = sim.nvmlDeviceGetTotalEnergyConsumption(gpu) - start
    sim.set_load(0, 1.0)
    clock.now += 10  # 10 s under load at 692 W
    load_energy = sim.nvmlDeviceGetTotalEnergyConsumption(gpu) - start - idle_energy

    assert idle_energy == pytest.approx(793_000, rel=0.01)
    assert load_energy == pytest.approx(6_920_000, rel=0.01)


def test_the_same_seed_replays_the_same_noise() -> None:
    def readings(seed: int) -> list[int]:
        sim = SimulatedNvml("n", seed=seed)
        sim.nvmlInit()
        return [sim.nvmlDeviceGetPowerUsage(sim.nvmlDeviceGetHandleByIndex(i)) for i in range(8)]

    assert readings(3) == readings(3)
    assert readings(3) != readings(4)
