"""A pynvml look-alike answering the metrics collector's calls with the real H200's readout.

Values come from tests/fixtures/h200/nvml-probe.json (what nvidia-ml-py returned, or the error it
raised), plus the three the probe did not record, taken from the same machine's nvidia-smi-q.xml:
PCIe replay counter 0, memory temperature 40 C, and field values for the counters the probe read
with plain calls. Errors carry NVML's return codes in `.value`, as pynvml's do.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from gpufleet.agent.gpu import nvml_api as api

UNKNOWN_ERROR = 999


class ProbeError(Exception):
    """pynvml.NVMLError: `value` is the nvmlReturn_t."""

    def __init__(self, value: int, text: str = "") -> None:
        super().__init__(text or f"NVML error {value}")
        self.value = value


_ERROR_CODES = {"NVMLError_NotSupported": api.NVML_ERROR_NOT_SUPPORTED, "NVMLError_GpuIsLost": 15}


@dataclass
class FieldAnswer:
    fieldId: int
    scopeId: int
    nvmlReturn: int
    valueType: int
    value: Any


class ProbeNvml:
    """The probed H200, `gpus` times over.

    `fields`: whether nvmlDeviceGetFieldValues exists (it answers the counters the probe knows and
    NOT_SUPPORTED for the rest, as a GPU without NVLink or page retirement does). `fail` maps a call
    name to the error code it raises instead; `lost` is a set of GPU indexes that fell off the bus.
    `calls` lists the device calls made, by name.
    """

    NVMLError = ProbeError

    def __init__(
        self,
        probe: dict[str, Any],
        *,
        gpus: int = 1,
        fields: bool = False,
        fail: dict[str, int] | None = None,
    ) -> None:
        self.gpu = probe["gpus"][0]
        self.count = gpus
        self.fields = fields
        self.fail = dict(fail or {})
        self.lost: set[int] = set()
        self.calls: list[str] = []
        self.initialised = 0
        if fields:
            self.nvmlDeviceGetFieldValues = self._field_values

    # library

    def nvmlInit(self) -> None:
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self.initialised -= 1

    def nvmlDeviceGetCount(self) -> int:
        return int(self._answer("nvmlDeviceGetCount", None, self.count))

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if not 0 <= index < self.count:
            raise ProbeError(api.NVML_ERROR_INVALID_ARGUMENT)
        return int(self._answer("nvmlDeviceGetHandleByIndex", index, index))

    # device calls, as the probe recorded them

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return f"{self.gpu['nvmlDeviceGetUUID']}-{handle}"

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:
        return SimpleNamespace(**self._answer("nvmlDeviceGetUtilizationRates", handle))

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        return SimpleNamespace(**self._answer("nvmlDeviceGetMemoryInfo", handle))

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:
        assert sensor == api.NVML_TEMPERATURE_GPU
        return int(self._answer("nvmlDeviceGetTemperature", handle, self.gpu["temp_gpu"]))

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        return int(self._answer("nvmlDeviceGetPowerUsage", handle))

    def nvmlDeviceGetClockInfo(self, handle: int, clock: int) -> int:
        key = {api.NVML_CLOCK_SM: "clock_sm", api.NVML_CLOCK_MEM: "clock_mem"}[clock]
        return int(self._answer("nvmlDeviceGetClockInfo", handle, self.gpu[key]))

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: int) -> int:
        return int(self._answer("nvmlDeviceGetCurrentClocksEventReasons", handle))

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: int) -> int:
        return int(self._answer("nvmlDeviceGetCurrPcieLinkGeneration", handle))

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: int) -> int:
        return int(self._answer("nvmlDeviceGetCurrPcieLinkWidth", handle))

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: int) -> int:
        return int(self._answer("nvmlDeviceGetMaxPcieLinkGeneration", handle))

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: int) -> int:
        return int(self._answer("nvmlDeviceGetMaxPcieLinkWidth", handle))

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: int) -> int:
        return int(self._answer("nvmlDeviceGetTotalEnergyConsumption", handle))

    def nvmlDeviceGetPcieReplayCounter(self, handle: int) -> int:
        return int(self._answer("nvmlDeviceGetPcieReplayCounter", handle, 0))  # nvidia-smi-q.xml

    def nvmlDeviceGetTotalEccErrors(self, handle: int, error_type: int, counter: int) -> int:
        kind = "corrected" if error_type == api.NVML_MEMORY_ERROR_TYPE_CORRECTED else "uncorrected"
        scope = "volatile" if counter == api.NVML_VOLATILE_ECC else "aggregate"
        return int(self._answer("nvmlDeviceGetTotalEccErrors", handle, self.gpu[f"ecc_{kind}_{scope}"]))

    def nvmlDeviceGetRemappedRows(self, handle: int) -> tuple[int, int, int, int]:
        return tuple(self._answer("nvmlDeviceGetRemappedRows", handle))  # type: ignore[return-value]

    def nvmlDeviceGetRetiredPages(self, handle: int, cause: int) -> list[int]:
        # The probe's pending-status call was refused; the list calls are refused alike on this GPU.
        refused = self.gpu["nvmlDeviceGetRetiredPagesPendingStatus"]
        return list(self._answer("nvmlDeviceGetRetiredPages", handle, refused))

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: int) -> int:
        return int(self._answer("nvmlDeviceGetRetiredPagesPendingStatus", handle))

    def nvmlDeviceGetNvLinkState(self, handle: int, link: int) -> int:
        return int(self._answer("nvmlDeviceGetNvLinkState", handle, self.gpu["nvlink"]["0"]))

    def _field_values(self, handle: int, requests: list[Any]) -> list[FieldAnswer]:
        self._answer("nvmlDeviceGetFieldValues", handle, 0)
        known = {
            api.FI_ECC_SBE_VOL_TOTAL: self.gpu["ecc_corrected_volatile"],
            api.FI_ECC_DBE_VOL_TOTAL: self.gpu["ecc_uncorrected_volatile"],
            api.FI_ECC_SBE_AGG_TOTAL: self.gpu["ecc_corrected_aggregate"],
            api.FI_ECC_DBE_AGG_TOTAL: self.gpu["ecc_uncorrected_aggregate"],
            api.FI_REMAPPED_COR: self.gpu["nvmlDeviceGetRemappedRows"][0],
            api.FI_REMAPPED_UNC: self.gpu["nvmlDeviceGetRemappedRows"][1],
            api.FI_REMAPPED_PENDING: self.gpu["nvmlDeviceGetRemappedRows"][2],
            api.FI_REMAPPED_FAILURE: self.gpu["nvmlDeviceGetRemappedRows"][3],
            api.FI_TOTAL_ENERGY_CONSUMPTION: self.gpu["nvmlDeviceGetTotalEnergyConsumption"],
            api.FI_PCIE_REPLAY_COUNTER: 0,  # nvidia-smi-q.xml <replay_counter>
            api.FI_MEMORY_TEMP: 40,  # nvidia-smi-q.xml <memory_temp>
        }
        answers = []
        for request in requests:
            field_id, scope = request if isinstance(request, tuple) else (request, 0)
            if field_id in known:
                value = SimpleNamespace(ullVal=known[field_id], uiVal=known[field_id])
                answers.append(FieldAnswer(field_id, scope, api.NVML_SUCCESS, 3, value))
            else:
                answers.append(FieldAnswer(field_id, scope, api.NVML_ERROR_NOT_SUPPORTED, 0, None))
        return answers

    def _answer(self, name: str, handle: int | None, recorded: Any = None) -> Any:
        self.calls.append(name)
        if self.initialised <= 0:
            raise ProbeError(1, "Uninitialized")
        if handle is not None and handle in self.lost:
            raise ProbeError(15, "GPU is lost")
        if name in self.fail:
            raise ProbeError(self.fail[name])
        value = self.gpu[name] if recorded is None else recorded
        if isinstance(value, str) and value.startswith("ERR:"):
            # "ERR:NVMLError_NotSupported:Not Supported": the real call raised this.
            _, cls, text = value.split(":", 2)
            raise ProbeError(_ERROR_CODES.get(cls, UNKNOWN_ERROR), text)
        return value
