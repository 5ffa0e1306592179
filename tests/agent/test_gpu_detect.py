"""Choosing the GPU backend."""

from __future__ import annotations

import logging

import pytest

from gpufleet.agent.gpu import detect
from gpufleet.agent.gpu.detect import detect_gpus
from gpufleet.agent.gpu.ports import GpuReader, GpuReadError
from gpufleet.protocol.inventory import GpuInfo, GpuSource

GPU = GpuInfo(index=0, uuid="GPU-1", model="NVIDIA H200", pci_bus_id="00000000:00:06.0", memory_total_mib=143771)


class FakeReader:
    """A backend that returns `gpus`, or raises `error`."""

    def __init__(self, source: GpuSource, gpus: list[GpuInfo] | None = None, error: Exception | None = None):
        self.source: GpuSource = source
        self.gpus = gpus or []
        self.error = error
        self.reads = 0
        self.closed = False

    def read(self) -> list[GpuInfo]:
        self.reads += 1
        if self.error is not None:
            raise self.error
        return self.gpus

    def close(self) -> None:
        self.closed = True


def test_falls_back_to_the_next_reader_and_says_why(caplog: pytest.LogCaptureFixture) -> None:
    nvml = FakeReader("nvml", error=GpuReadError("nvmlInit failed: Driver Not Loaded"))
    smi = FakeReader("nvidia-smi", gpus=[GPU])
    readers: list[GpuReader] = [nvml, smi]

    with caplog.at_level(logging.INFO, logger="gpufleet.agent.gpu.detect"):
        result = detect_gpus(readers)

    assert result == ("nvidia-smi", [GPU], ["nvml: nvmlInit failed: Driver Not Loaded"])
    assert "nvml: nvmlInit failed: Driver Not Loaded" in caplog.text


def test_the_first_working_reader_wins_and_later_ones_are_not_tried() -> None:
    nvml = FakeReader("nvml", gpus=[GPU])
    smi = FakeReader("nvidia-smi", error=AssertionError("must not be called"))

    assert detect_gpus([nvml, smi]) == ("nvml", [GPU], [])
    assert smi.reads == 0


def test_all_failing_is_a_node_without_gpus(caplog: pytest.LogCaptureFixture) -> None:
    readers = [
        FakeReader("nvml", error=GpuReadError("NVML unavailable: nvidia-ml-py is not installed")),
        FakeReader("nvidia-smi", error=GpuReadError("nvidia-smi not found on PATH")),
    ]

    with caplog.at_level(logging.INFO, logger="gpufleet.agent.gpu.detect"):
        result = detect_gpus(readers)

    assert result == (
        "none",
        [],
        ["nvml: NVML unavailable: nvidia-ml-py is not installed", "nvidia-smi: nvidia-smi not found on PATH"],
    )
    assert "nvidia-smi not found on PATH" in caplog.text


def test_a_working_backend_with_zero_gpus_is_kept() -> None:
    assert detect_gpus([FakeReader("nvml", gpus=[])]) == ("nvml", [], [])


def test_no_readers_means_no_gpus() -> None:
    assert detect_gpus([]) == ("none", [], [])


def test_a_reader_bug_is_not_mistaken_for_missing_gpus() -> None:
    with pytest.raises(KeyError):
        detect_gpus([FakeReader("nvml", error=KeyError("bug")), FakeReader("nvidia-smi", gpus=[GPU])])


def test_readers_passed_in_are_left_open() -> None:
    nvml = FakeReader("nvml", gpus=[GPU])

    detect_gpus([nvml])

    assert not nvml.closed


def test_default_readers_are_nvml_then_nvidia_smi_and_are_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[FakeReader] = []

    def nvml_reader() -> FakeReader:
        made.append(FakeReader("nvml", error=GpuReadError("no driver")))
        return made[-1]

    def smi_reader() -> FakeReader:
        made.append(FakeReader("nvidia-smi", gpus=[GPU]))
        return made[-1]

    monkeypatch.setattr(detect, "NvmlReader", nvml_reader)
    monkeypatch.setattr(detect, "NvidiaSmiReader", smi_reader)

    assert detect_gpus() == ("nvidia-smi", [GPU], ["nvml: no driver"])
    assert [reader.source for reader in made] == ["nvml", "nvidia-smi"]
    assert all(reader.closed for reader in made)
