"""gpufleet's copy of the NVML numbers agrees with nvidia-ml-py's, and field values decode by their type."""

from __future__ import annotations

from types import SimpleNamespace

import pynvml
import pytest

from gpufleet.agent.gpu import nvml_api as api

# Our name -> pynvml's name, where they differ.
RENAMED = {
    "EVENT_TYPE_XID_CRITICAL_ERROR": "nvmlEventTypeXidCriticalError",
    "CLOCKS_EVENT_GPU_IDLE": "nvmlClocksEventReasonGpuIdle",
    "CLOCKS_EVENT_SW_POWER_CAP": "nvmlClocksEventReasonSwPowerCap",
    "CLOCKS_EVENT_HW_SLOWDOWN": "nvmlClocksEventReasonHwSlowdown",
    "CLOCKS_EVENT_SW_THERMAL_SLOWDOWN": "nvmlClocksEventReasonSwThermalSlowdown",
    "CLOCKS_EVENT_HW_THERMAL_SLOWDOWN": "nvmlClocksEventReasonHwThermalSlowdown",
}


def _ours() -> list[str]:
    return [n for n in dir(api) if n.isupper() and n not in ("NVLINK_PROBE_LINKS", "VALUE_MEMBERS")]


@pytest.mark.parametrize("name", _ours())
def test_constant_matches_nvidia_ml_py(name: str) -> None:
    theirs = RENAMED.get(name) or (f"NVML_{name}" if name.startswith("FI_") else name)
    theirs = theirs.replace("NVML_FI_", "NVML_FI_DEV_")

    assert getattr(api, name) == getattr(pynvml, theirs)


def test_value_members_follow_nvml_value_types() -> None:
    assert api.VALUE_MEMBERS[pynvml.NVML_VALUE_TYPE_DOUBLE] == "dVal"
    assert api.VALUE_MEMBERS[pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG] == "ullVal"
    assert api.VALUE_MEMBERS[pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT] == "usVal"
    assert [name for name, _ in pynvml.c_nvmlValue_t._fields_] == list(api.VALUE_MEMBERS)


def test_field_value_reads_the_member_its_type_names_and_none_for_a_refused_field() -> None:
    values = pynvml.c_nvmlFieldValue_t * 3
    answers = values()
    answers[0].nvmlReturn, answers[0].valueType, answers[0].value.ullVal = 0, 3, 2498786
    answers[1].nvmlReturn, answers[1].valueType, answers[1].value.dVal = 0, 0, 40.5
    answers[2].nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED

    assert [api.field_value(a) for a in answers] == [2498786.0, 40.5, None]
    with pytest.raises(ValueError, match="unknown value type 9"):
        api.field_value(SimpleNamespace(nvmlReturn=0, valueType=9, fieldId=83, value=None))


def test_errors_are_told_apart_by_their_nvml_code() -> None:
    assert api.is_gpu_lost(pynvml.NVMLError_GpuIsLost())
    assert api.is_not_supported(pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED))
    assert not api.is_gpu_lost(pynvml.NVMLError_Timeout())
    assert api.error_code(RuntimeError("no code")) is None
