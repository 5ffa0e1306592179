"""Metric samples, node events and simulator commands: what travels on the agent channel besides heartbeats.

A sample is one collection round on one node: a set of *entities* (the host, each GPU, each disk,
network interface and InfiniBand port), each with its metric values. Entities are named
`host`, `gpu:<index>`, `disk:<mount point>`, `nic:<interface>` and `ib:<device>/<port>`, so the head
stores and queries every kind the same way. Metric names are gpufleet's own (listed below with their
units); the head maps them to dcgm-exporter's names for Prometheus.

Events are what must not wait for the next sample (an Xid, a GPU falling off the bus): the agent
sends them the moment it sees them, because the head drains a node on them within seconds.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from gpufleet.protocol.bounds import MAX_INT64

MetricName = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]{0,63}$")]
EntityName = Annotated[str, StringConstraints(pattern=r"^(host|gpu:\d{1,3}|disk:/\S{0,200}|nic:\S{1,64}|ib:\S{1,64})$")]
MAX_ENTITIES_PER_SAMPLE = 512
MAX_METRICS_PER_ENTITY = 128

# Metric names and units. GPU metrics come from NVML; a value NVML does not offer on a GPU is left
# out of the sample, never sent as zero.
GPU_METRICS: dict[str, str] = {
    "gpu_util": "percent of time a kernel ran",
    "mem_copy_util": "percent of time memory was read or written",
    "fb_used_mib": "framebuffer memory used, MiB",
    "fb_free_mib": "framebuffer memory free, MiB",
    "gpu_temp_c": "GPU temperature, C",
    "mem_temp_c": "HBM temperature, C",
    "power_w": "power draw, W",
    "energy_mj": "energy since driver load, mJ (counter)",
    "sm_clock_mhz": "SM clock, MHz",
    "mem_clock_mhz": "memory clock, MHz",
    "clocks_event_reasons": "bitmask of NVML clocks-event (throttle) reasons",
    "ecc_sbe_volatile": "corrected ECC errors since driver load",
    "ecc_dbe_volatile": "uncorrected ECC errors since driver load",
    "ecc_sbe_aggregate": "corrected ECC errors, lifetime",
    "ecc_dbe_aggregate": "uncorrected ECC errors, lifetime",
    "retired_pages_sbe": "pages retired for corrected errors",
    "retired_pages_dbe": "pages retired for uncorrected errors",
    "retired_pages_pending": "1 if a page retirement waits for a reset",
    "remapped_rows_correctable": "rows remapped for corrected errors",
    "remapped_rows_uncorrectable": "rows remapped for uncorrected errors",
    "remapped_rows_pending": "1 if a row remap waits for a reset",
    "remapped_rows_failure": "1 if a row remap failed",
    "pcie_link_gen": "current PCIe generation",
    "pcie_link_gen_max": "maximum PCIe generation of the GPU and slot",
    "pcie_link_width": "current PCIe lanes",
    "pcie_link_width_max": "maximum PCIe lanes",
    "pcie_replay_counter": "PCIe replays (counter)",
    "nvlink_links_up": "NVLink links active",
    "nvlink_links_total": "NVLink links the GPU has",
    "nvlink_crc_errors": "NVLink CRC errors, all links (counter)",
    "nvlink_replay_errors": "NVLink replay errors, all links (counter)",
    "nvlink_recovery_errors": "NVLink recovery errors, all links (counter)",
    "xid_last": "the last Xid seen on this GPU (0: none)",
}
HOST_METRICS: dict[str, str] = {
    "cpu_util": "percent of all CPUs busy",
    "load1": "1-minute load average",
    "load5": "5-minute load average",
    "load15": "15-minute load average",
    "mem_total_bytes": "memory, bytes",
    "mem_available_bytes": "memory available, bytes",
    "mem_used_pct": "memory used, percent",
    "swap_used_bytes": "swap used, bytes",
    "metrics_collect_s": "seconds the agent took to collect this sample",
}
DISK_METRICS: dict[str, str] = {
    "disk_total_bytes": "size, bytes",
    "disk_used_pct": "used, percent",
    "disk_inodes_used_pct": "inodes used, percent",
}
NIC_METRICS: dict[str, str] = {
    "net_rx_bytes": "bytes received (counter)",
    "net_tx_bytes": "bytes sent (counter)",
    "net_rx_errors": "receive errors (counter)",
    "net_tx_errors": "send errors (counter)",
    "net_up": "1 if the interface is up",
}
IB_METRICS: dict[str, str] = {
    "ib_state": "port state: 1 down, 2 init, 3 armed, 4 active",
    "ib_phys_state": "physical state: 5 link up, 3 disabled, 2 polling",
    "ib_rate_gbps": "link rate, Gb/s",
    "ib_link_downed": "times the link went down (counter)",
    "ib_symbol_errors": "symbol errors (counter)",
    "ib_link_error_recovery": "link error recoveries (counter)",
    "ib_rcv_errors": "receive errors (counter)",
    "ib_xmit_discards": "transmit discards (counter)",
}


class EntityValues(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    entity: EntityName
    values: dict[MetricName, float] = Field(max_length=MAX_METRICS_PER_ENTITY)


CheckName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$")]


class CheckResult(BaseModel):
    """The outcome of one node-side check: a custom check in the NHC style (an executable whose exit
    code and first output line are the verdict) or a required service (`service:<unit>`).

    `status`: 0 pass, 1 fail (the node is `failed` and drained), 2 warn (`degraded`); a check that
    cannot run or times out reports 2 with the reason, so a broken script never drains a fleet."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: CheckName
    status: Literal[0, 1, 2]
    message: Annotated[str, StringConstraints(max_length=256)] = ""


# A workload manager's job id (Slurm's are numbers; dcgm-exporter's mapping files take any word) and the
# names that label it. Prometheus takes any label value, but the head stores and shows these: keep them
# to what Slurm and POSIX allow, short, and never a newline or a quote.
JobId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,31}$")]
JobOwner = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.@$-]{0,64}$")]
# 64 GPUs (protocol.inventory.MAX_GPUS_PER_NODE) shared by two jobs each. At about 200 bytes an entry
# at most, they fit in a channel message next to the node's checks (kept to half of one).
MAX_GPU_JOBS_PER_SAMPLE = 128


class GpuJob(BaseModel):
    """A job of the node's workload manager (Slurm) holding one of its GPUs, as the job's prolog wrote
    it down (agent.slurm.mapping). A GPU shared by several jobs appears once per job."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    gpu: int = Field(ge=0, le=255, description="the GPU's index, as in `gpu:<index>`")
    job: JobId
    user: JobOwner = ""  # empty: not known (a mapping file written without the job's details)
    account: JobOwner = ""


class Sample(BaseModel):
    """One collection round on one node."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    ts: float = Field(description="Unix time the round started")
    entities: list[EntityValues] = Field(max_length=MAX_ENTITIES_PER_SAMPLE)
    checks: list[CheckResult] = Field(default_factory=list, max_length=256)
    # Empty on a node without Slurm, and from agents older than the field.
    gpu_jobs: list[GpuJob] = Field(default_factory=list, max_length=MAX_GPU_JOBS_PER_SAMPLE)


# host_fault: the host's kernel log says the node cannot run work (a driver whose user-space libraries are
# another version, an oops, a panic); `suggested` carries the classifier's action for it.
EventKind = Literal["xid", "gpu_lost", "collector_failed", "host_fault"]
# What to do about an Xid (gpufleet.logs.catalog explains each); here because events carry a line's own.
XidAction = Literal["ignore", "warn", "drain", "reset_gpu", "reboot"]


class NodeEvent(BaseModel):
    """Something that happened on a node, sent at once rather than with the next sample."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    ts: float
    kind: EventKind
    gpu: int | None = Field(default=None, ge=0, le=255)
    code: int | None = Field(default=None, ge=0, le=2**31 - 1)  # the Xid for kind xid
    message: Annotated[str, StringConstraints(max_length=512)] = ""
    # What the kernel log line itself says to do (Xid 154 names its recovery; an NVLink Xid says
    # Nonfatal); the head's policy may still override it. None from NVML, and from older agents.
    suggested: XidAction | None = None


# Faults the simulator can inject (`gpufleet sim fault`); real agents refuse every one of them.
FaultKind = Literal[
    "xid79", "ecc-dbe", "thermal", "nvlink-down", "ib-down", "gpu-missing", "gpu-slow", "node-crash", "agent-hang"
]
FAULT_KINDS: tuple[str, ...] = FaultKind.__args__  # type: ignore[attr-defined]


class FaultCommand(BaseModel):
    """Head to agent: inject a fault (`heal`: undo every injected fault on the node)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    type: Literal["fault"] = "fault"
    id: int = Field(ge=0, le=MAX_INT64)
    action: Literal["inject", "heal"]
    kind: FaultKind | None = None
    gpu: int | None = Field(default=None, ge=0, le=255)
