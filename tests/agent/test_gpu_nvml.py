"""NvmlReader against the real H200's recorded NVML answers."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import pytest

from gpufleet.agent.gpu.nvml import NvmlReader, cuda_version_text
from gpufleet.agent.gpu.ports import GpuReadError, normalise_pci_bus_id
from gpufleet.protocol.inventory import GpuInfo

H200 = GpuInfo(
    index=0,
    uuid="GPU-aabfc81a-ba71-cf6e-8540-cec21d30d711",
    model="NVIDIA H200",
    serial="1653724049708",
    pci_bus_id="00000000:00:06.0",
    memory_total_mib=143771,
    driver_version="580.159.04",
    cuda_version="13.0",
    vbios_version="96.00.A5.00.1A",
    mig_mode="disabled",
    ecc_mode="enabled",
    compute_capability="9.0",
    power_limit_w=700.0,
)

Recorded = Callable[..., Any]


def test_reads_the_recorded_h200_exactly(recorded_nvml: Recorded) -> None:
    assert NvmlReader(recorded_nvml()).read() == [H200]


def test_strings_returned_as_bytes_read_the_same(recorded_nvml: Recorded) -> None:
    assert NvmlReader(recorded_nvml(as_bytes=True)).read() == [H200]


def test_not_supported_field_gives_none_and_the_read_succeeds(
    recorded_nvml: Recorded, nvml_probe: dict[str, Any]
) -> None:
    # Recorded the way the probe records a call that raised.
    nvml_probe["gpus"][0]["nvmlDeviceGetSerial"] = "ERR:NVMLError_NotSupported:Not Supported"
    nvml_probe["gpus"][0]["nvmlDeviceGetMigMode"] = "ERR:NVMLError_NotSupported:Not Supported"

    [gpu] = NvmlReader(recorded_nvml(nvml_probe)).read()

    assert gpu.serial is None
    assert gpu.mig_mode is None
    assert gpu == H200.model_copy(update={"serial": None, "mig_mode": None})


@pytest.mark.parametrize(
    ("call", "field"),
    [
        ("nvmlDeviceGetVbiosVersion", "vbios_version"),
        ("nvmlDeviceGetEccMode", "ecc_mode"),
        ("nvmlDeviceGetCudaComputeCapability", "compute_capability"),
        ("nvmlDeviceGetEnforcedPowerLimit", "power_limit_w"),
        ("nvmlSystemGetDriverVersion", "driver_version"),
        ("nvmlSystemGetCudaDriverVersion", "cuda_version"),
    ],
)
def test_any_error_on_an_optional_field_gives_none(recorded_nvml: Recorded, call: str, field: str) -> None:
    [gpu] = NvmlReader(recorded_nvml(fail={call: "Unknown Error"})).read()

    assert getattr(gpu, field) is None
    assert gpu == H200.model_copy(update={field: None})


def test_a_binding_missing_from_the_library_gives_none(recorded_nvml: Recorded, nvml_probe: dict[str, Any]) -> None:
    del nvml_probe["gpus"][0]["nvmlDeviceGetCudaComputeCapability"]

    [gpu] = NvmlReader(recorded_nvml(nvml_probe)).read()

    assert gpu.compute_capability is None
    assert gpu.uuid == H200.uuid


def test_init_failure_raises_gpu_read_error(recorded_nvml: Recorded) -> None:
    reader = NvmlReader(recorded_nvml(fail={"nvmlInit": "Driver Not Loaded"}))

    with pytest.raises(GpuReadError, match="nvmlInit failed: Driver Not Loaded"):
        reader.read()


@pytest.mark.parametrize(
    "call",
    [
        "nvmlDeviceGetCount",
        "nvmlDeviceGetHandleByIndex",
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetName",
        "nvmlDeviceGetPciInfo",
        "nvmlDeviceGetMemoryInfo",
    ],
)
def test_failure_of_a_call_every_gpu_needs_raises(recorded_nvml: Recorded, call: str) -> None:
    with pytest.raises(GpuReadError, match=f"{call}: GPU is lost"):
        NvmlReader(recorded_nvml(fail={call: "GPU is lost"})).read()


def test_values_outside_the_inventory_limits_raise(recorded_nvml: Recorded, nvml_probe: dict[str, Any]) -> None:
    nvml_probe["gpus"][0]["nvmlDeviceGetUUID"] = ""

    with pytest.raises(GpuReadError, match="do not fit the inventory"):
        NvmlReader(recorded_nvml(nvml_probe)).read()


def test_missing_nvidia_ml_py_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    # A None entry in sys.modules makes `import pynvml` raise ImportError.
    monkeypatch.setitem(sys.modules, "pynvml", None)

    with pytest.raises(GpuReadError, match="nvidia-ml-py is not installed"):
        NvmlReader().read()


def test_initialises_once_and_shuts_down_once(recorded_nvml: Recorded) -> None:
    nvml = recorded_nvml()
    reader = NvmlReader(nvml)

    reader.read()
    reader.read()
    reader.close()
    reader.close()

    assert nvml.calls.count("nvmlInit") == 1
    assert nvml.calls.count("nvmlShutdown") == 1


def test_close_before_any_read_does_nothing(recorded_nvml: Recorded) -> None:
    nvml = recorded_nvml()

    NvmlReader(nvml).close()

    assert nvml.calls == []


def test_a_failed_init_is_retried_on_the_next_read(recorded_nvml: Recorded) -> None:
    nvml = recorded_nvml(fail={"nvmlInit": "Driver Not Loaded"})
    reader = NvmlReader(nvml)
    with pytest.raises(GpuReadError):
        reader.read()

    nvml.fail.clear()  # the driver came up

    assert reader.read() == [H200]


def test_zero_gpus_is_an_empty_list(recorded_nvml: Recorded, nvml_probe: dict[str, Any]) -> None:
    nvml_probe["count"] = 0

    assert NvmlReader(recorded_nvml(nvml_probe)).read() == []


def test_nvml_version(recorded_nvml: Recorded) -> None:
    assert NvmlReader(recorded_nvml()).nvml_version() == "13.580.159.04"


def test_source_defaults_to_nvml_and_can_say_simulated(recorded_nvml: Recorded) -> None:
    assert NvmlReader(recorded_nvml()).source == "nvml"
    assert NvmlReader(recorded_nvml(), source="simulated").source == "simulated"


@pytest.mark.parametrize(
    ("version", "text"), [(13000, "13.0"), (12040, "12.4"), (12020, "12.2"), (11080, "11.8"), (10010, "10.1")]
)
def test_cuda_version_text(version: int, text: str) -> None:
    assert cuda_version_text(version) == text


@pytest.mark.parametrize(
    ("raw", "normal"),
    [
        ("00000000:00:06.0", "00000000:00:06.0"),
        ("0000:00:06.0", "00000000:00:06.0"),
        (b"00000000:2A:00.0", "00000000:2a:00.0"),
        ("00000000:C1:00.0\x00", "00000000:c1:00.0"),
        ("2a:00.0", "00000000:2a:00.0"),
        ("00000001:DB:00.0", "00000001:db:00.0"),
        (" weird ", "weird"),
    ],
)
def test_normalise_pci_bus_id(raw: str | bytes, normal: str) -> None:
    assert normalise_pci_bus_id(raw) == normal
