"""What the simulated NVML hands back, shaped like pynvml's: its error classes and its structures.

Errors carry their nvmlReturn_t in `value`, as pynvml's do, so the agent tells "not supported" from
"GPU is lost" the same way for both. Structures keep pynvml's field names (camelCase included).
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from gpufleet.agent.gpu import nvml_api as api


class NVMLError(Exception):
    """An NVML call failed: the simulator's counterpart of pynvml.NVMLError."""

    value = 999  # NVML_ERROR_UNKNOWN


class NVMLError_Uninitialized(NVMLError):  # named as pynvml names it
    """A query before nvmlInit or after the matching nvmlShutdown, as real NVML refuses it."""

    value = 1


class NVMLError_InvalidArgument(NVMLError):  # named as pynvml names it
    """A bad device index, sensor, clock or link."""

    value = api.NVML_ERROR_INVALID_ARGUMENT


class NVMLError_NotSupported(NVMLError):  # named as pynvml names it
    """The simulated GPU does not support this query."""

    value = api.NVML_ERROR_NOT_SUPPORTED


class NVMLError_NotFound(NVMLError):  # named as pynvml names it
    """No MIG device, GPU instance or compute instance by that index or id."""

    value = api.NVML_ERROR_NOT_FOUND


class NVMLError_InUse(NVMLError):  # named as pynvml names it
    """A MIG change on a GPU or instance that a process runs on."""

    value = api.NVML_ERROR_IN_USE


class NVMLError_InsufficientResources(NVMLError):  # named as pynvml names it
    """A GPU instance that does not fit where asked (its placement overlaps another's)."""

    value = api.NVML_ERROR_INSUFFICIENT_RESOURCES


class NVMLError_Timeout(NVMLError):  # named as pynvml names it
    """nvmlEventSetWait found no event within its timeout."""

    value = api.NVML_ERROR_TIMEOUT


class NVMLError_GpuIsLost(NVMLError):  # named as pynvml names it
    """The GPU fell off the bus (Xid 79): every query on it fails until it is healed."""

    value = api.NVML_ERROR_GPU_IS_LOST


@dataclass(frozen=True, slots=True)
class PciInfo:
    """The fields of pynvml's nvmlPciInfo_t that matter here; bus ids are bytes as pynvml's are."""

    busId: bytes  # pynvml's field name
    busIdLegacy: bytes  # pynvml's field name
    domain: int
    bus: int
    device: int


@dataclass(frozen=True, slots=True)
class MemoryInfo:
    """pynvml's nvmlMemory_t: bytes."""

    total: int
    free: int
    used: int


@dataclass(frozen=True, slots=True)
class Utilization:
    """pynvml's nvmlUtilization_t: percent busy over the last sample period."""

    gpu: int
    memory: int


class FieldValueUnion:
    """pynvml's c_nvmlValue_t: one member holds the value, the field's valueType says which."""

    __slots__ = api.VALUE_MEMBERS

    def __init__(self, member: str, value: float) -> None:
        setattr(self, member, value)


@dataclass(frozen=True, slots=True)
class FieldValue:
    """pynvml's c_nvmlFieldValue_t."""

    fieldId: int  # pynvml's field names
    scopeId: int
    timestamp: int
    latencyUsec: int
    valueType: int
    nvmlReturn: int
    value: FieldValueUnion | None


@dataclass(frozen=True, slots=True)
class EventData:
    """pynvml's c_nvmlEventData_t: for an Xid, eventData is the Xid number."""

    device: Any
    eventType: int
    eventData: int
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


@dataclass
class EventSet:
    """An nvmlEventSet_t: events queue here until nvmlEventSetWait takes them; a wait may block."""

    queue: deque[EventData] = field(default_factory=deque)
    ready: threading.Condition = field(default_factory=threading.Condition)

    def push(self, event: EventData) -> None:
        with self.ready:
            self.queue.append(event)
            self.ready.notify()

    def take(self, timeout_ms: int) -> EventData | None:
        """The oldest event, waiting up to `timeout_ms` for one; None if none came."""
        with self.ready:
            if not self.queue and timeout_ms > 0:
                self.ready.wait(timeout_ms / 1000)
            return self.queue.popleft() if self.queue else None
