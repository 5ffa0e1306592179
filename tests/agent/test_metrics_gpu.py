"""The NVML metrics collector: the real H200's readout in the right units, what a GPU refuses left out,
fields batched where NVML offers them, lost GPUs reported once."""

from __future__ import annotations

from typing import Any

import pytest

from gpufleet.agent.gpu import nvml_api as api
from gpufleet.agent.metrics.gpu import GpuCollector
from gpufleet.agent.metrics.ports import CollectorError
from gpufleet.agent.metrics.xid import XidBook
from gpufleet.protocol.metrics import GPU_METRICS
from gpufleet.sim.nvml import SimulatedNvml
from tests.agent.probe_nvml import UNKNOWN_ERROR, ProbeNvml

# nvml-probe.json, converted: bytes -> MiB (rounded down), mW -> W; counters and clocks as read.
H200_VALUES = {
    "gpu_util": 0.0,
    "mem_copy_util": 0.0,
    "fb_used_mib": 615.0,  # 644939776 B
    "fb_free_mib": 143155.0,  # 150109880320 B
    "gpu_temp_c": 40.0,
    "power_w": 79.391,  # 79391 mW
    "energy_mj": 2498786.0,
    "sm_clock_mhz": 345.0,
    "mem_clock_mhz": 3201.0,
    "clocks_event_reasons": 1.0,  # GPU idle
    "pcie_link_gen": 5.0,
    "pcie_link_gen_max": 5.0,
    "pcie_link_width": 16.0,
    "pcie_link_width_max": 16.0,
    "pcie_replay_counter": 0.0,
    "ecc_sbe_volatile": 0.0,
    "ecc_dbe_volatile": 0.0,
    "ecc_sbe_aggregate": 0.0,
    "ecc_dbe_aggregate": 0.0,
    "remapped_rows_correctable": 0.0,
    "remapped_rows_uncorrectable": 0.0,
    "remapped_rows_pending": 0.0,
    "remapped_rows_failure": 0.0,
}
# What the probed H200 (one GPU passed through to a VM) refuses: NVLink, and page retirement
# (it remaps rows instead).
H200_REFUSED = {
    "retired_pages_sbe",
    "retired_pages_dbe",
    "retired_pages_pending",
    *[m for m in GPU_METRICS if "nvlink" in m],
}


def _round(collector: GpuCollector) -> dict[str, dict[str, float]]:
    out = collector.collect()
    assert out.problems == []
    return out.entities


def test_h200_readout_through_plain_calls_has_the_right_units(nvml_probe: dict[str, Any]) -> None:
    nvml = ProbeNvml(nvml_probe)  # no nvmlDeviceGetFieldValues: every counter by its plain call

    collector = GpuCollector(nvml)

    values = _round(collector)["gpu:0"]

    assert values == H200_VALUES
    assert set(collector.unsupported(0)) == H200_REFUSED | {"mem_temp_c"}  # HBM temperature is a field only


def test_h200_readout_with_field_values_batches_the_counters(nvml_probe: dict[str, Any]) -> None:
    nvml = ProbeNvml(nvml_probe, fields=True)
    collector = GpuCollector(nvml)
    _round(collector)  # discovery
    nvml.calls.clear()
    before = collector.calls

    values = _round(collector)["gpu:0"]

    assert values == H200_VALUES | {"mem_temp_c": 40.0}
    assert set(collector.unsupported(0)) == H200_REFUSED
    # One batch replaces the ECC, remapped-row, energy and replay calls; refused calls are not repeated.
    assert nvml.calls.count("nvmlDeviceGetFieldValues") == 1
    for plain in ("nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetRemappedRows", "nvmlDeviceGetRetiredPages"):
        assert plain not in nvml.calls
    assert "nvmlDeviceGetNvLinkState" not in nvml.calls
    assert collector.calls - before == len(nvml.calls) == 11  # the count, the batch, 9 plain calls


def test_a_refused_call_is_left_out_and_not_asked_again(nvml_probe: dict[str, Any]) -> None:
    nvml = ProbeNvml(nvml_probe, fail={"nvmlDeviceGetPowerUsage": api.NVML_ERROR_NOT_SUPPORTED})
    collector = GpuCollector(nvml)

    first = _round(collector)["gpu:0"]
    nvml.calls.clear()
    second = _round(collector)["gpu:0"]

    assert "power_w" not in first
    assert "power_w" not in second
    assert "nvmlDeviceGetPowerUsage" not in nvml.calls
    assert second["gpu_temp_c"] == 40.0
    assert collector.unsupported(0)["power_w"].startswith("power:")


def test_a_failing_call_is_a_problem_for_this_round_only(nvml_probe: dict[str, Any]) -> None:
    nvml = ProbeNvml(nvml_probe, fail={"nvmlDeviceGetClockInfo": UNKNOWN_ERROR})
    collector = GpuCollector(nvml)

    out = collector.collect()
    assert "sm_clock_mhz" not in out.entities["gpu:0"]
    assert out.problems == ["GPU 0: sm_clock: NVML error 999", "GPU 0: mem_clock: NVML error 999"]
    assert out.entities["gpu:0"]["power_w"] == 79.391

    del nvml.fail["nvmlDeviceGetClockInfo"]
    assert _round(collector)["gpu:0"]["sm_clock_mhz"] == 345.0


def test_a_lost_gpu_is_left_out_reported_once_and_taken_back(nvml_probe: dict[str, Any]) -> None:
    nvml = ProbeNvml(nvml_probe, gpus=3, fields=True)
    collector = GpuCollector(nvml)
    assert sorted(_round(collector)) == ["gpu:0", "gpu:1", "gpu:2"]

    nvml.lost.add(1)
    first, second = collector.collect(), collector.collect()

    assert sorted(first.entities) == sorted(second.entities) == ["gpu:0", "gpu:2"]
    assert [(e.kind, e.gpu) for e in first.events] == [("gpu_lost", 1)]
    assert "GPU is lost" in first.events[0].message
    assert second.events == []

    nvml.lost.clear()
    assert sorted(_round(collector)) == ["gpu:0", "gpu:1", "gpu:2"]


def test_no_nvml_is_a_collector_error(nvml_probe: dict[str, Any]) -> None:
    class NoDriver(ProbeNvml):
        def nvmlInit(self) -> None:
            raise self.NVMLError(9, "Driver Not Loaded")

    with pytest.raises(CollectorError, match="nvmlInit failed: Driver Not Loaded"):
        GpuCollector(NoDriver(nvml_probe)).collect()


def test_every_gpu_metric_from_eight_simulated_h200s() -> None:
    xids = XidBook(active=True)
    collector = GpuCollector(SimulatedNvml("n1"), xids=xids)

    entities = _round(collector)

    # Everything but retired pages, which a GPU that remaps rows refuses (as the real H200 does).
    retired = {"retired_pages_sbe", "retired_pages_dbe", "retired_pages_pending"}
    assert sorted(entities) == [f"gpu:{i}" for i in range(8)]
    for index, values in enumerate(entities.values()):
        assert set(values) == set(GPU_METRICS) - retired
        assert set(collector.unsupported(index)) == retired
        assert values["nvlink_links_up"] == values["nvlink_links_total"] == 18
        assert values["xid_last"] == 0


def test_simulated_steady_state_costs_ten_calls_per_gpu() -> None:
    collector = GpuCollector(SimulatedNvml("n1"))
    _round(collector)
    before = collector.calls

    _round(collector)

    assert collector.calls - before == 1 + 8 * 10  # the count, then batch + 9 plain calls per GPU


def test_link_states_fall_back_to_one_call_per_link_where_the_field_is_refused() -> None:
    class OldDriver(SimulatedNvml):
        """A driver that predates the per-link state field."""

        def nvmlDeviceGetFieldValues(self, handle: Any, field_ids: list[Any]) -> list[Any]:
            answers = super().nvmlDeviceGetFieldValues(handle, field_ids)
            return [
                type(a)(a.fieldId, a.scopeId, 0, 0, 3, api.NVML_ERROR_NOT_SUPPORTED, None)
                if a.fieldId == api.FI_NVLINK_GET_STATE
                else a
                for a in answers
            ]

    nvml = OldDriver("n1", gpu_count=1)
    collector = GpuCollector(nvml)
    _round(collector)
    nvml.inject("nvlink-down", 0)

    values = _round(collector)["gpu:0"]

    assert (values["nvlink_links_up"], values["nvlink_links_total"]) == (16, 18)


def test_older_library_names_the_clocks_event_reasons_throttle_reasons(nvml_probe: dict[str, Any]) -> None:
    class OldLibrary(ProbeNvml):
        def __getattribute__(self, name: str) -> Any:
            if name == "nvmlDeviceGetCurrentClocksEventReasons":
                raise AttributeError(name)
            return super().__getattribute__(name)

        def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: int) -> int:
            return int(self._answer("nvmlDeviceGetCurrentClocksThrottleReasons", handle))

    values = _round(GpuCollector(OldLibrary(nvml_probe)))["gpu:0"]

    assert values["clocks_event_reasons"] == 1.0
