"""gpufleet's metrics under dcgm-exporter's names, types and labels, checked against dcgm-exporter's
own default-counters.csv (tests/fixtures/gpu-reference), and the exposition text parsed back."""

import re

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.prometheus.exposition import Families, GpuFacts, NodeMetrics, render
from gpufleet.prometheus.names import (
    DISK_SERIES,
    GPU_LABELS,
    GPU_SERIES,
    HOST_SERIES,
    IB_SERIES,
    NIC_SERIES,
)
from gpufleet.protocol.metrics import DISK_METRICS, GPU_METRICS, HOST_METRICS, IB_METRICS, NIC_METRICS
from tests.conftest import FIXTURES

CSV = FIXTURES / "gpu-reference" / "dcgm-exporter-default-counters.csv"
# Default counters gpufleet has no source for: the encoder/decoder, the reserved framebuffer, NVLink
# bandwidth and vGPU licenses are not read from NVML yet, and the DCP (DCGM_FI_PROF_*) metrics
# exist only in DCGM's profiling module. docs/prometheus.md lists them.
KNOWN_GAPS = {
    "DCGM_FI_DEV_ENC_UTIL",
    "DCGM_FI_DEV_DEC_UTIL",
    "DCGM_FI_DEV_FB_RESERVED",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE",
    "DCGM_FI_PROF_PCIE_TX_BYTES",
    "DCGM_FI_PROF_PCIE_RX_BYTES",
}
# DCGM fields gpufleet exports that the CSV does not list, not even commented out (DCGM's field
# names, as in dcgm_fields.h).
BEYOND_THE_CSV = {
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
    "DCGM_FI_DEV_ROW_REMAP_PENDING",
    "DCGM_FI_DEV_PCIE_LINK_GEN",
    "DCGM_FI_DEV_PCIE_MAX_LINK_GEN",
    "DCGM_FI_DEV_PCIE_LINK_WIDTH",
    "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH",
}


def _csv() -> tuple[dict[str, str], dict[str, str]]:
    """(field -> type) of the default counters, and of every field the file names, commented or not."""
    default: dict[str, str] = {}
    every: dict[str, str] = {}
    for line in CSV.read_text().splitlines():
        match = re.match(r"^(#\s*)?(DCGM_\w+)\s*,\s*(\w+)\s*,", line)
        if match:
            every[match.group(2)] = match.group(3)
            if not match.group(1):
                default[match.group(2)] = match.group(3)
    return default, every


def _node() -> NodeMetrics:
    return NodeMetrics(
        node="gpu-a01",
        hostname="gpu-a01.cluster",
        entities={
            "gpu:0": dict.fromkeys(GPU_METRICS, 1.0),
            "gpu:1": {"gpu_util": 97.0, "energy_mj": 1.5e12, "metric_from_the_future": 1.0},
            "host": {"load1": 2.5, "mem_used_pct": 40.0},
            "disk:/scratch": {"disk_used_pct": 91.0},
            "nic:eth0": {"net_rx_bytes": 1e9},
            "ib:mlx5_0/1": {"ib_state": 4.0, "ib_rate_gbps": 400.0},
            "tape:0": {"gpu_util": 1.0},
        },
        gpus={0: GpuFacts("GPU-aaaa", 'NVIDIA "H200" \\ NVL', "00000000:18:00.0", "580.95.05")},
    )


def _exposition() -> str:
    families = Families()
    families.add_node(_node())
    return render(families.collect()).decode()


def test_every_metric_the_agents_send_has_a_series() -> None:
    for protocol, series in (
        (GPU_METRICS, GPU_SERIES),
        (HOST_METRICS, HOST_SERIES),
        (DISK_METRICS, DISK_SERIES),
        (NIC_METRICS, NIC_SERIES),
        (IB_METRICS, IB_SERIES),
    ):
        assert set(protocol) == set(series)


def test_gpu_series_carry_dcgm_exporters_names_and_types() -> None:
    default, every = _csv()
    assert len([k for k in default.values() if k != "label"]) == 25  # the file its provenance row describes
    for series in GPU_SERIES.values():
        if series.name.startswith("DCGM_"):
            assert series.name in every or series.name in BEYOND_THE_CSV, series.name
            if series.name in every:
                assert series.type == every[series.name], series.name
        else:
            assert series.name.startswith("gpufleet_gpu_"), series.name


def test_only_the_known_gaps_of_the_default_counters_are_missing() -> None:
    default, _ = _csv()
    exported = {s.name for s in GPU_SERIES.values()}
    labels = {name for name, kind in default.items() if kind == "label"}
    assert labels == {"DCGM_FI_DRIVER_VERSION"}
    assert set(default) - exported - labels == KNOWN_GAPS


def test_the_exposition_parses_back_with_dcgm_exporters_labels() -> None:
    text = _exposition()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    util = families["DCGM_FI_DEV_GPU_UTIL"]
    assert util.type == "gauge"
    by_gpu = {s.labels["gpu"]: s for s in util.samples}
    assert set(by_gpu) == {"0", "1"}
    assert tuple(by_gpu["0"].labels) == GPU_LABELS
    assert by_gpu["0"].labels == {
        "gpu": "0",
        "UUID": "GPU-aaaa",
        "pci_bus_id": "00000000:18:00.0",
        "device": "nvidia0",
        "modelName": 'NVIDIA "H200" \\ NVL',  # quotes and backslashes survive the escaping
        "Hostname": "gpu-a01.cluster",
        "DCGM_FI_DRIVER_VERSION": "580.95.05",
        "node": "gpu-a01",
    }
    assert by_gpu["1"].value == 97.0
    assert by_gpu["1"].labels["UUID"] == ""  # no inventory yet: the values still go out
    assert families["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"].type == "counter"
    assert families["gpufleet_load1"].samples[0].labels == {"node": "gpu-a01"}
    assert families["gpufleet_filesystem_used_percent"].samples[0].labels == {
        "node": "gpu-a01",
        "mountpoint": "/scratch",
    }
    ib = families["gpufleet_infiniband_rate_bytes_per_second"].samples[0]
    assert ib.labels == {"node": "gpu-a01", "device": "mlx5_0", "port": "1"}
    assert ib.value == 400e9 / 8


def test_counters_keep_dcgms_exact_names() -> None:
    """prometheus-client's own writer would append _total; dashboards query DCGM's exact names."""
    names = {line.split("{")[0] for line in _exposition().splitlines() if not line.startswith("#")}
    assert "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION" in names
    assert "DCGM_FI_DEV_PCIE_REPLAY_COUNTER" in names
    assert not any(n.startswith("DCGM_") and n.endswith("_total") for n in names)
    assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter" in _exposition()


@pytest.mark.parametrize("left_out", ["metric_from_the_future", "tape"])
def test_unmapped_metrics_and_entities_are_left_out(left_out: str) -> None:
    assert left_out not in _exposition()


def test_a_mig_devices_memory_carries_its_gpus_labels_and_dcgm_exporters_gpu_i_id() -> None:
    families = Families()
    node = _node()
    families.add_node(
        NodeMetrics(
            node.node, node.hostname, {"mig:0/3": {"fb_used_mib": 512.0}, "mig:x/3": {"fb_used_mib": 1.0}}, node.gpus
        )
    )
    samples = [s for f in text_string_to_metric_families(render(families.collect()).decode()) for s in f.samples]

    [used] = samples
    assert used.name == "DCGM_FI_DEV_FB_USED"
    assert used.value == 512.0
    assert used.labels["GPU_I_ID"] == "3"
    assert used.labels["gpu"] == "0"
    assert used.labels["UUID"] == "GPU-aaaa"
