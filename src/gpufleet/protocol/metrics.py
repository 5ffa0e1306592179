"""Metric samples, node events and simulator commands: what travels on the agent channel besides heartbeats.

A sample is one collection round on one node: a set of *entities* (the host, each GPU, each disk,
network interface and InfiniBand port, each shared file system), each with its metric values. Entities
are named `host`, `gpu:<index>`, `mig:<GPU index>/<GPU instance>` (a MIG device: its memory only),
`disk:<mount point>`, `nic:<interface>`, `ib:<device>/<port>` and `fs:<mount point>`, so the head
stores and queries every kind the same way. Metric names are gpufleet's own (listed below with their
units); the head maps them to dcgm-exporter's names (GPUs) and node_exporter's (shared file systems) for
Prometheus.

Events are what must not wait for the next sample (an Xid, a GPU falling off the bus): the agent
sends them the moment it sees them, because the head drains a node on them within seconds.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from gpufleet.protocol.bounds import MAX_INT64

MetricName = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]{0,63}$")]
EntityName = Annotated[
    str,
    StringConstraints(
        pattern=r"^(host|gpu:\d{1,3}|mig:\d{1,3}/\d{1,2}|disk:/\S{0,200}|fs:/\S{0,200}|nic:\S{1,64}|ib:\S{1,64})$"
    ),
]
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

# Shared file systems (agent.storage): one `fs:<mount point>` entity per watched mount. The probe's
# values come for every kind; the client's counters only where the kind keeps them (NFS, Lustre, GPFS).
# `fs_ops` and `fs_op_seconds` are the same two counters for every kind that has them, so the head
# computes "mean time per operation" without knowing the kind.
FS_STATES: dict[int, str] = {0: "ok", 1: "hung", 2: "stale", 3: "error", 4: "not mounted"}
FS_METRICS: dict[str, str] = {
    "fs_state": "0 ok, 1 hung (no answer within the probe timeout), 2 stale file handle, 3 other error, 4 not mounted",
    "fs_probe_seconds": "seconds stat and statvfs took in the probe's child process (hung: the time waited)",
    "fs_size_bytes": "size, bytes (statvfs f_blocks x f_frsize)",
    "fs_free_bytes": "free, bytes, reserved blocks included (f_bfree)",
    "fs_avail_bytes": "available to unprivileged users, bytes (f_bavail)",
    "fs_files": "inodes (f_files)",
    "fs_files_free": "inodes free (f_ffree)",
    "fs_ops": "operations the client sent to the servers (counter; NFS: RPCs, Lustre: llite calls)",
    "fs_op_seconds": "their cumulative time, s (counter; NFS: RPC round trips, Lustre: llite call times)",
    # NFS, from /proc/self/mountstats (the fields node_exporter's mountstats collector reads)
    "nfs_age_seconds": "seconds since the mount",
    "nfs_read_bytes": "bytes read with read(2) (counter)",
    "nfs_write_bytes": "bytes written with write(2) (counter)",
    "nfs_direct_read_bytes": "bytes read with O_DIRECT (counter)",
    "nfs_direct_write_bytes": "bytes written with O_DIRECT (counter)",
    "nfs_total_read_bytes": "bytes read from the server, READ RPCs (counter)",
    "nfs_total_write_bytes": "bytes written to the server, WRITE RPCs (counter)",
    "nfs_transmissions": "RPC transmissions, all operations (counter; above fs_ops: retransmissions)",
    "nfs_major_timeouts": "RPC major timeouts, all operations (counter)",
    "nfs_xprt_connects": "transport connects (counter; the first xprt line: tcp, udp or rdma)",
    "nfs_xprt_idle_seconds": "seconds the transport has been idle",
    "nfs_xprt_sends": "RPC requests sent (counter)",
    "nfs_xprt_receives": "RPC replies received (counter)",
    "nfs_xprt_bad_xids": "replies whose transaction id matched no request (counter)",
    "nfs_xprt_backlog_queue": "cumulative backlog queue length (counter)",
    # Per operation OP (lower case: read, write, getattr ...; the busiest operations only, see agent.storage.nfs):
    "nfs_op_<OP>_requests": "operations (counter)",
    "nfs_op_<OP>_transmissions": "transmissions (counter)",
    "nfs_op_<OP>_major_timeouts": "major timeouts (counter)",
    "nfs_op_<OP>_sent_bytes": "bytes sent, headers included (counter)",
    "nfs_op_<OP>_received_bytes": "bytes received, headers included (counter)",
    "nfs_op_<OP>_queue_seconds": "cumulative time queued before sending, s (counter)",
    "nfs_op_<OP>_rtt_seconds": "cumulative round-trip time, s (counter)",
    "nfs_op_<OP>_execute_seconds": "cumulative time from queueing to completion, s (counter)",
    # Lustre, from `lctl get_param` and `lfs df`
    "lustre_targets": "OSTs and MDTs the client imports",
    "lustre_targets_unhealthy": "imports whose state is not FULL (DISCONN, CONNECTING, ...)",
    "lustre_ost_fill_max_pct": "the fullest OST, percent used",
    "lustre_mdt_fill_max_pct": "the fullest MDT, percent used",
    "lustre_targets_inactive": "targets `lfs df` lists as inactive or unavailable",
    "lustre_read_bytes": "bytes read through llite (counter)",
    "lustre_write_bytes": "bytes written through llite (counter)",
    # GPFS (IBM Storage Scale), from `mmhealth node show -Y` and `mmdf -Y`
    "gpfs_health": "mmhealth's FILESYSTEM state of this file system: 0 HEALTHY, 1 TIPS or DEGRADED, 2 FAILED, 3 other",
    "gpfs_node_health": "mmhealth's NODE state: 0 HEALTHY, 1 TIPS or DEGRADED, 2 FAILED, 3 other",
    "gpfs_metadata_size_bytes": "metadata space, bytes (mmdf)",
    "gpfs_metadata_free_bytes": "metadata space free, bytes (mmdf)",
    "gpfs_inodes_max": "inodes the file system may allocate (mmdf)",
    "gpfs_inodes_used": "inodes used (mmdf)",
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


MAX_MOUNTS_PER_SAMPLE = 32
MountPoint = Annotated[str, StringConstraints(pattern=r"^/\S{0,200}$")]
# One line of printable text: these become Prometheus label values and the dashboard's text.
_MOUNT_TEXT = r"^[^\x00-\x1f\x7f]*$"


class MountInfo(BaseModel):
    """What labels a shared file system's `fs:<mount point>` entity: its kind and where it comes from
    (mountinfo's source: `server:/export`, a Lustre `MGS@o2ib:/fsname`, a GPFS device name)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    mountpoint: MountPoint
    fstype: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,31}$")]
    source: Annotated[str, StringConstraints(max_length=256, pattern=_MOUNT_TEXT)] = ""
    # NFS: the transport (tcp, udp, rdma) and the server's address, as node_exporter labels them.
    protocol: Annotated[str, StringConstraints(max_length=16, pattern=_MOUNT_TEXT)] = ""
    server: Annotated[str, StringConstraints(max_length=64, pattern=_MOUNT_TEXT)] = ""
    required: bool = False  # one of the node's required_mounts: hung or gone, the node fails its check


class Sample(BaseModel):
    """One collection round on one node."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    ts: float = Field(description="Unix time the round started")
    entities: list[EntityValues] = Field(max_length=MAX_ENTITIES_PER_SAMPLE)
    checks: list[CheckResult] = Field(default_factory=list, max_length=256)
    # Empty on a node without Slurm, and from agents older than the field.
    gpu_jobs: list[GpuJob] = Field(default_factory=list, max_length=MAX_GPU_JOBS_PER_SAMPLE)
    # The shared file systems its `fs:` entities are (agent.storage). Empty on a node that watches none,
    # and from agents older than the field.
    mounts: list[MountInfo] = Field(default_factory=list, max_length=MAX_MOUNTS_PER_SAMPLE)


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
# The weak-* kinds show only in burn-in steps' figures (sim.burnin), never in the node's telemetry.
# The mount-* kinds act on a simulated node's shared mounts (sim.storage): its server stops answering,
# its file handles go stale, or its round trips take ten times as long.
FaultKind = Literal[
    "xid79",
    "ecc-dbe",
    "thermal",
    "nvlink-down",
    "ib-down",
    "gpu-missing",
    "gpu-slow",
    "node-crash",
    "agent-hang",
    "weak-gpu-slow",
    "weak-gpu-wrong",
    "weak-link",
    "mount-hang",
    "mount-stale",
    "mount-slow",
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
