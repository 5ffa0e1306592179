"""Which Prometheus series each gpufleet metric becomes, and the labels they carry.

GPU metrics take the names, types and labels dcgm-exporter gives them (its `etc/default-counters.csv`
and the DCGM field names for the rest), so DCGM dashboards and alert rules work on gpufleet's data.
A GPU metric DCGM has no field for (NVLink links up, CRC errors summed over FLIT and data) gets a
`gpufleet_gpu_*` name with the same GPU labels, so PromQL can still compare it with the DCGM series.
Host, disk, network and InfiniBand metrics get `gpufleet_*` names in node-exporter's style.

Labels: a GPU series has dcgm-exporter's `gpu`, `UUID`, `pci_bus_id`, `device` (`nvidia<N>`),
`modelName`, `Hostname` and `DCGM_FI_DRIVER_VERSION`, plus gpufleet's `node`; every other series
has `node`, and a disk `mountpoint`, a network interface `device`, an InfiniBand port `device` and `port`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

SeriesType = Literal["gauge", "counter"]


@dataclass(frozen=True)
class Series:
    """One exposed metric: its name, Prometheus type and help text; `scale` converts gpufleet's unit."""

    name: str
    type: SeriesType
    help: str
    scale: float = 1.0


NODE_LABEL = "node"
# dcgm-exporter's GPU labels, in its order, then gpufleet's own.
# dcgm-exporter's HPC job mapping label: on a GPU's series while a job holds the GPU.
JOB_LABEL = "hpc_job"
GPU_LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION", NODE_LABEL)

GPU_SERIES: dict[str, Series] = {
    "gpu_util": Series("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    "mem_copy_util": Series("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %)."),
    "fb_used_mib": Series("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    "fb_free_mib": Series("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
    "gpu_temp_c": Series("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    "mem_temp_c": Series("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C)."),
    "power_w": Series("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    "energy_mj": Series(
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Total energy consumption since boot (in mJ)."
    ),
    "sm_clock_mhz": Series("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
    "mem_clock_mhz": Series("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz)."),
    # DCGM passes NVML's clocks-event (throttle) reason bits through unchanged.
    "clocks_event_reasons": Series(
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "gauge", "Current clock throttle reasons (bitmask)."
    ),
    "ecc_sbe_volatile": Series(
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter", "Total number of single-bit volatile ECC errors."
    ),
    "ecc_dbe_volatile": Series(
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Total number of double-bit volatile ECC errors."
    ),
    "ecc_sbe_aggregate": Series(
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "counter", "Total number of single-bit persistent ECC errors."
    ),
    "ecc_dbe_aggregate": Series(
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "counter", "Total number of double-bit persistent ECC errors."
    ),
    "retired_pages_sbe": Series(
        "DCGM_FI_DEV_RETIRED_SBE", "counter", "Total number of retired pages due to single-bit errors."
    ),
    "retired_pages_dbe": Series(
        "DCGM_FI_DEV_RETIRED_DBE", "counter", "Total number of retired pages due to double-bit errors."
    ),
    "retired_pages_pending": Series(
        "DCGM_FI_DEV_RETIRED_PENDING", "counter", "Total number of pages pending retirement."
    ),
    "remapped_rows_correctable": Series(
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for correctable errors"
    ),
    "remapped_rows_uncorrectable": Series(
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for uncorrectable errors"
    ),
    "remapped_rows_pending": Series("DCGM_FI_DEV_ROW_REMAP_PENDING", "gauge", "Whether remapping of rows is pending"),
    "remapped_rows_failure": Series("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed"),
    "pcie_link_gen": Series("DCGM_FI_DEV_PCIE_LINK_GEN", "gauge", "PCIe link generation."),
    "pcie_link_gen_max": Series("DCGM_FI_DEV_PCIE_MAX_LINK_GEN", "gauge", "Maximum PCIe link generation."),
    "pcie_link_width": Series("DCGM_FI_DEV_PCIE_LINK_WIDTH", "gauge", "PCIe link width (lanes)."),
    "pcie_link_width_max": Series("DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH", "gauge", "Maximum PCIe link width (lanes)."),
    "pcie_replay_counter": Series("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries."),
    "nvlink_replay_errors": Series(
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "counter", "Total number of NVLink retries."
    ),
    "nvlink_recovery_errors": Series(
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "counter", "Total number of NVLink recovery errors."
    ),
    "xid_last": Series("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
    # No DCGM field: DCGM splits CRC errors into FLIT and data counters, gpufleet sums them.
    "nvlink_crc_errors": Series(
        "gpufleet_gpu_nvlink_crc_errors_total", "counter", "NVLink CRC errors (flow-control and data), all links."
    ),
    "nvlink_links_up": Series("gpufleet_gpu_nvlink_links_up", "gauge", "NVLink links active."),
    "nvlink_links_total": Series("gpufleet_gpu_nvlink_links", "gauge", "NVLink links the GPU has."),
}

HOST_SERIES: dict[str, Series] = {
    "cpu_util": Series("gpufleet_cpu_utilization_percent", "gauge", "Percent of all CPUs busy."),
    "load1": Series("gpufleet_load1", "gauge", "1-minute load average."),
    "load5": Series("gpufleet_load5", "gauge", "5-minute load average."),
    "load15": Series("gpufleet_load15", "gauge", "15-minute load average."),
    "mem_total_bytes": Series("gpufleet_memory_total_bytes", "gauge", "Memory, bytes."),
    "mem_available_bytes": Series("gpufleet_memory_available_bytes", "gauge", "Memory available, bytes."),
    "mem_used_pct": Series("gpufleet_memory_used_percent", "gauge", "Memory used, percent."),
    "swap_used_bytes": Series("gpufleet_swap_used_bytes", "gauge", "Swap used, bytes."),
    "metrics_collect_s": Series(
        "gpufleet_agent_collect_seconds", "gauge", "Seconds the agent took to collect its latest sample."
    ),
}
DISK_SERIES: dict[str, Series] = {
    "disk_total_bytes": Series("gpufleet_filesystem_size_bytes", "gauge", "Filesystem size, bytes."),
    "disk_used_pct": Series("gpufleet_filesystem_used_percent", "gauge", "Filesystem space used, percent."),
    "disk_inodes_used_pct": Series(
        "gpufleet_filesystem_inodes_used_percent", "gauge", "Filesystem inodes used, percent."
    ),
}
NIC_SERIES: dict[str, Series] = {
    "net_rx_bytes": Series("gpufleet_network_receive_bytes_total", "counter", "Bytes received."),
    "net_tx_bytes": Series("gpufleet_network_transmit_bytes_total", "counter", "Bytes sent."),
    "net_rx_errors": Series("gpufleet_network_receive_errors_total", "counter", "Receive errors."),
    "net_tx_errors": Series("gpufleet_network_transmit_errors_total", "counter", "Send errors."),
    "net_up": Series("gpufleet_network_up", "gauge", "1 if the interface is up."),
}
IB_SERIES: dict[str, Series] = {
    "ib_state": Series("gpufleet_infiniband_state", "gauge", "Port state: 1 down, 2 init, 3 armed, 4 active."),
    "ib_phys_state": Series(
        "gpufleet_infiniband_physical_state", "gauge", "Physical state: 5 link up, 3 disabled, 2 polling."
    ),
    # Base units, as Prometheus names them: Gb/s becomes bytes per second.
    "ib_rate_gbps": Series(
        "gpufleet_infiniband_rate_bytes_per_second", "gauge", "Link rate, bytes per second.", scale=1e9 / 8
    ),
    "ib_link_downed": Series("gpufleet_infiniband_link_downed_total", "counter", "Times the link went down."),
    "ib_symbol_errors": Series("gpufleet_infiniband_symbol_errors_total", "counter", "Symbol errors."),
    "ib_link_error_recovery": Series(
        "gpufleet_infiniband_link_error_recovery_total", "counter", "Link error recoveries."
    ),
    "ib_rcv_errors": Series("gpufleet_infiniband_receive_errors_total", "counter", "Receive errors."),
    "ib_xmit_discards": Series("gpufleet_infiniband_transmit_discards_total", "counter", "Transmit discards."),
}

# Per node, from the head's database (the agent's own /metrics has none of these).
NODE_UP = Series(
    "gpufleet_node_up", "gauge", "1 if the node's heartbeats arrive, 0 if it is down (absent: never heard from)."
)
NODE_HEALTH = Series(
    "gpufleet_node_health",
    "gauge",
    "The node's health verdict: 0 healthy, 1 degraded, 2 failed (absent: not judged yet).",
)
NODE_DRAINED = Series("gpufleet_node_drained", "gauge", "1 if the node is drained: no new work lands on it.")
NODE_EXPECTED_GPUS = Series("gpufleet_node_gpus_expected", "gauge", "The most GPUs the node ever reported.")
JOB_INFO = Series(
    "gpufleet_job_info",
    "gauge",
    "1 for each running job, labelled with its user and project: join GPU series on hpc_job to group by them.",
)
ALERTS_FIRING = Series("gpufleet_alerts_firing", "gauge", "gpufleet's own alerts now firing, by rule and severity.")
HEALTH_VALUES: dict[str, float] = {"healthy": 0.0, "degraded": 1.0, "failed": 2.0}
