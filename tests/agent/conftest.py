"""Shared fixtures for the GPU backend tests: the real H200 NVML readout, replayed."""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"

# Probe keys that are not named after the NVML call that produced them.
_DEVICE_KEYS = {"nvmlDeviceGetEccMode": "ecc_mode", "nvmlDeviceGetTemperature": "temp_gpu"}
_SYSTEM_KEYS = {
    "nvmlSystemGetDriverVersion": "driver",
    "nvmlSystemGetNVMLVersion": "nvml",
    "nvmlSystemGetCudaDriverVersion": "cuda_driver",
    "nvmlDeviceGetCount": "count",
}


class RecordedNvmlError(Exception):
    """What RecordedNvml raises where the real library raised pynvml.NVMLError."""


class RecordedNvml:
    """A pynvml look-alike that answers every call with what the real H200 answered.

    `fail` maps call names to error messages to raise instead; `as_bytes` returns strings as bytes,
    as older nvidia-ml-py releases did. `calls` lists the calls made, in order.
    """

    NVMLError = RecordedNvmlError

    def __init__(self, probe: dict[str, Any], *, fail: dict[str, str] | None = None, as_bytes: bool = False):
        self._probe = probe
        self.fail = fail or {}
        self._as_bytes = as_bytes
        self._sessions = 0
        self.calls: list[str] = []

    def nvmlInit(self) -> None:
        self.calls.append("nvmlInit")
        self._maybe_fail("nvmlInit")
        self._sessions += 1

    def nvmlShutdown(self) -> None:
        self.calls.append("nvmlShutdown")
        self._maybe_fail("nvmlShutdown")
        self._sessions -= 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        self._answer("nvmlDeviceGetHandleByIndex", None)
        if not 0 <= index < len(self._probe["gpus"]):
            raise RecordedNvmlError("Invalid Argument")
        return index

    def __getattr__(self, name: str) -> Callable[..., Any]:
        # Only calls the probe recorded exist, as functions missing from an old library would not.
        if name in _SYSTEM_KEYS and _SYSTEM_KEYS[name] in self._probe:
            return lambda: self._answer(name, self._probe[_SYSTEM_KEYS[name]])
        key = _DEVICE_KEYS.get(name, name)
        if name.startswith("nvmlDevice") and key in self._probe["gpus"][0]:
            return lambda handle, *_: self._answer(name, self._probe["gpus"][handle][key])
        raise AttributeError(name)

    def _maybe_fail(self, name: str) -> None:
        if name in self.fail:
            raise RecordedNvmlError(self.fail[name])

    def _answer(self, name: str, recorded: Any) -> Any:
        self.calls.append(name)
        self._maybe_fail(name)
        if self._sessions <= 0:
            raise RecordedNvmlError("Uninitialized")
        if isinstance(recorded, str) and recorded.startswith("ERR:"):
            # "ERR:NVMLError_NotSupported:Not Supported" - the probe's call raised.
            raise RecordedNvmlError(recorded.split(":", 2)[2])
        if isinstance(recorded, dict):
            # Structures: pynvml's char-array fields (the bus ids) are bytes.
            fields = {k: v.encode() if isinstance(v, str) else v for k, v in recorded.items()}
            return SimpleNamespace(**fields)
        if isinstance(recorded, str) and self._as_bytes:
            return recorded.encode()
        return recorded


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    """tests/fixtures."""
    return FIXTURES


@pytest.fixture
def nvml_probe() -> dict[str, Any]:
    """A fresh copy of the real H200 NVML readout, free to edit."""
    return copy.deepcopy(_load_probe())


@pytest.fixture
def recorded_nvml(nvml_probe: dict[str, Any]) -> Callable[..., RecordedNvml]:
    """Build a RecordedNvml over the probe: recorded_nvml(probe=None, fail=..., as_bytes=...)."""

    def build(probe: dict[str, Any] | None = None, **options: Any) -> RecordedNvml:
        return RecordedNvml(nvml_probe if probe is None else probe, **options)

    return build


@functools.cache
def _load_probe() -> dict[str, Any]:
    probe: dict[str, Any] = json.loads((FIXTURES / "h200" / "nvml-probe.json").read_text())
    return probe
