"""The NVML numbers gpufleet uses, and how to read NVML's errors and field values.

The numbers are nvml.h's (error codes, field ids, event types). They are part of the driver's ABI,
so they are written out here rather than taken from the `pynvml` module: an older nvidia-ml-py may
lack a constant that the installed driver understands, and the simulator needs the same numbers
without importing pynvml at all. A test checks them against nvidia-ml-py.
"""

from __future__ import annotations

import logging
from typing import Any

# Return codes (nvmlReturn_t).
NVML_SUCCESS = 0
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_IN_USE = 19
NVML_ERROR_INSUFFICIENT_RESOURCES = 23

# MIG modes (nvmlDeviceGetMigMode / nvmlDeviceSetMigMode).
NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1

# Sensors, clocks, ECC counters, page retirement causes.
NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0
NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1
NVML_FEATURE_ENABLED = 1

# Events.
EVENT_TYPE_XID_CRITICAL_ERROR = 0x8  # nvmlEventTypeXidCriticalError

# Clocks-event (formerly throttle) reasons, a bitmask.
CLOCKS_EVENT_GPU_IDLE = 0x1
CLOCKS_EVENT_SW_POWER_CAP = 0x4
CLOCKS_EVENT_HW_SLOWDOWN = 0x8
CLOCKS_EVENT_SW_THERMAL_SLOWDOWN = 0x20
CLOCKS_EVENT_HW_THERMAL_SLOWDOWN = 0x40

# Field ids for nvmlDeviceGetFieldValues (NVML_FI_DEV_*).
FI_ECC_SBE_VOL_TOTAL = 3
FI_ECC_DBE_VOL_TOTAL = 4
FI_ECC_SBE_AGG_TOTAL = 5
FI_ECC_DBE_AGG_TOTAL = 6
FI_RETIRED_SBE = 29
FI_RETIRED_DBE = 30
FI_RETIRED_PENDING = 31
FI_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL = 38
FI_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL = 45
FI_NVLINK_REPLAY_ERROR_COUNT_TOTAL = 52
FI_NVLINK_RECOVERY_ERROR_COUNT_TOTAL = 59
FI_MEMORY_TEMP = 82
FI_TOTAL_ENERGY_CONSUMPTION = 83
FI_NVLINK_LINK_COUNT = 91
FI_PCIE_REPLAY_COUNTER = 94
FI_REMAPPED_COR = 142
FI_REMAPPED_UNC = 143
FI_REMAPPED_PENDING = 144
FI_REMAPPED_FAILURE = 145
FI_NVLINK_GET_STATE = 165  # per link: the link number goes in the request's scope id

# Hopper and Blackwell have 18 NVLinks per GPU; probing stops at the first link NVML refuses anyway.
NVLINK_PROBE_LINKS = 18

# c_nvmlValue_t's members, indexed by nvmlValueType_t (NVML_VALUE_TYPE_DOUBLE = 0 ... UNSIGNED_SHORT = 6).
VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")


def error_code(exc: BaseException) -> int | None:
    """The nvmlReturn_t an NVMLError carries (pynvml keeps it in `.value`), or None if it carries none."""
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def is_gpu_lost(exc: BaseException) -> bool:
    """True for NVML_ERROR_GPU_IS_LOST: the GPU fell off the bus or stopped answering."""
    return error_code(exc) == NVML_ERROR_GPU_IS_LOST


def is_not_supported(exc: BaseException) -> bool:
    """True for NVML_ERROR_NOT_SUPPORTED: this GPU, driver or VM will never answer this query."""
    return error_code(exc) == NVML_ERROR_NOT_SUPPORTED


def field_value(result: Any) -> float | None:
    """The number in one nvmlFieldValue_t, or None where NVML refused that field (see its nvmlReturn).

    Raises ValueError for a value type NVML did not define.
    """
    if int(result.nvmlReturn) != NVML_SUCCESS:
        return None
    value_type = int(result.valueType)
    if not 0 <= value_type < len(VALUE_MEMBERS):
        raise ValueError(f"NVML field {result.fieldId} has unknown value type {value_type}")
    return float(getattr(result.value, VALUE_MEMBERS[value_type]))


class NvmlUnavailable(Exception):
    """NVML cannot be used here: nvidia-ml-py is missing, or nvmlInit failed (no driver, driver not loaded)."""


class NvmlLibrary:
    """The NVML module (pynvml, or the simulator's stand-in), imported and initialised on first use and
    shut down at most once. The inventory reader and the metrics collector each hold one."""

    def __init__(self, module: Any | None = None) -> None:
        self.module: Any = module  # None until the first use imports pynvml
        self.initialised = False

    def open(self) -> Any:
        """The initialised NVML module. Raises NvmlUnavailable with the reason."""
        if self.module is None:
            try:
                import pynvml
            except ImportError as exc:
                raise NvmlUnavailable("NVML unavailable: nvidia-ml-py is not installed") from exc
            self.module = pynvml
        if not self.initialised:
            try:
                self.module.nvmlInit()
            except self.module.NVMLError as exc:
                # Typically "NVML Shared Library Not Found" (no driver) or "Driver Not Loaded".
                raise NvmlUnavailable(f"NVML unavailable: nvmlInit failed: {exc}") from exc
            self.initialised = True
        return self.module

    def close(self) -> None:
        """Shut NVML down if this object started it; safe to call twice. A failing shutdown is only logged:
        at shutdown there is nothing useful left to do with the error."""
        if not self.initialised:
            return
        self.initialised = False
        try:
            self.module.nvmlShutdown()
        except self.module.NVMLError as exc:
            logging.getLogger(__name__).debug("nvmlShutdown failed: %s", exc)
