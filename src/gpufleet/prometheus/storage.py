"""Which Prometheus series a shared file system's `fs:` metrics become: node_exporter's names.

Capacity and inodes take node_exporter's filesystem collector's names and labels (`device`, `fstype`,
`mountpoint`), so its dashboards and the usual disk-full rules work on shared mounts; NFS counters take
its mountstats collector's (`node_mountstats_nfs_*`, labels `export`, `mountaddr`, `protocol`, plus
`mountpoint`; per operation also `operation`, upper case as the kernel writes it). gpufleet's own
(the probe's state and time, the generic operation counters, Lustre's and GPFS's figures) are
`gpufleet_storage_*`. Every series carries gpufleet's `node` label too.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpufleet.prometheus.names import NODE_LABEL, Series
from gpufleet.protocol.metrics import MountInfo

FILESYSTEM_SERIES: dict[str, Series] = {
    "fs_size_bytes": Series("node_filesystem_size_bytes", "gauge", "Filesystem size in bytes."),
    "fs_free_bytes": Series("node_filesystem_free_bytes", "gauge", "Filesystem free space in bytes."),
    "fs_avail_bytes": Series(
        "node_filesystem_avail_bytes", "gauge", "Filesystem space available to non-root users in bytes."
    ),
    "fs_files": Series("node_filesystem_files", "gauge", "Filesystem total file nodes."),
    "fs_files_free": Series("node_filesystem_files_free", "gauge", "Filesystem total free file nodes."),
    "fs_state": Series(
        "gpufleet_storage_mount_state",
        "gauge",
        "Shared mount state: 0 ok, 1 hung, 2 stale file handle, 3 other error, 4 not mounted.",
    ),
    "fs_probe_seconds": Series(
        "gpufleet_storage_probe_seconds", "gauge", "Seconds stat and statvfs of the mount point took (hung: waited)."
    ),
    "fs_ops": Series("gpufleet_storage_operations_total", "counter", "Operations the client sent to the servers."),
    "fs_op_seconds": Series(
        "gpufleet_storage_operation_seconds_total", "counter", "Cumulative time of those operations, seconds."
    ),
    "lustre_targets": Series("gpufleet_storage_lustre_targets", "gauge", "Lustre OSTs and MDTs the client imports."),
    "lustre_targets_unhealthy": Series(
        "gpufleet_storage_lustre_targets_unhealthy", "gauge", "Lustre imports not FULL or IDLE."
    ),
    "lustre_targets_inactive": Series(
        "gpufleet_storage_lustre_targets_inactive", "gauge", "Lustre targets lfs df lists as inactive or unavailable."
    ),
    "lustre_ost_fill_max_pct": Series(
        "gpufleet_storage_lustre_ost_fill_max_percent", "gauge", "The fullest OST, percent used."
    ),
    "lustre_mdt_fill_max_pct": Series(
        "gpufleet_storage_lustre_mdt_fill_max_percent", "gauge", "The fullest MDT, percent used."
    ),
    "lustre_read_bytes": Series("gpufleet_storage_lustre_read_bytes_total", "counter", "Bytes read through llite."),
    "lustre_write_bytes": Series(
        "gpufleet_storage_lustre_write_bytes_total", "counter", "Bytes written through llite."
    ),
    "gpfs_health": Series(
        "gpufleet_storage_gpfs_health", "gauge", "mmhealth FILESYSTEM state: 0 healthy, 1 tips/degraded, 2 failed."
    ),
    "gpfs_node_health": Series(
        "gpufleet_storage_gpfs_node_health", "gauge", "mmhealth NODE state: 0 healthy, 1 tips/degraded, 2 failed."
    ),
    "gpfs_metadata_size_bytes": Series("gpufleet_storage_gpfs_metadata_size_bytes", "gauge", "GPFS metadata space."),
    "gpfs_metadata_free_bytes": Series(
        "gpufleet_storage_gpfs_metadata_free_bytes", "gauge", "GPFS metadata space free."
    ),
    "gpfs_inodes_max": Series("gpufleet_storage_gpfs_inodes_max", "gauge", "GPFS inodes it may allocate."),
    "gpfs_inodes_used": Series("gpufleet_storage_gpfs_inodes_used", "gauge", "GPFS inodes used."),
}
NFS_SERIES: dict[str, Series] = {
    "nfs_age_seconds": Series(
        "node_mountstats_nfs_age_seconds_total", "counter", "The age of the NFS mount in seconds."
    ),
    "nfs_read_bytes": Series(
        "node_mountstats_nfs_read_bytes_total", "counter", "Number of bytes read using the read() syscall."
    ),
    "nfs_write_bytes": Series(
        "node_mountstats_nfs_write_bytes_total", "counter", "Number of bytes written using the write() syscall."
    ),
    "nfs_direct_read_bytes": Series(
        "node_mountstats_nfs_direct_read_bytes_total", "counter", "Number of bytes read using O_DIRECT."
    ),
    "nfs_direct_write_bytes": Series(
        "node_mountstats_nfs_direct_write_bytes_total", "counter", "Number of bytes written using O_DIRECT."
    ),
    "nfs_total_read_bytes": Series(
        "node_mountstats_nfs_total_read_bytes_total", "counter", "Number of bytes read from the NFS server, in total."
    ),
    "nfs_total_write_bytes": Series(
        "node_mountstats_nfs_total_write_bytes_total", "counter", "Number of bytes written to the NFS server, in total."
    ),
    "nfs_xprt_connects": Series(
        "node_mountstats_nfs_transport_connect_total", "counter", "Number of times the client has connected."
    ),
    "nfs_xprt_idle_seconds": Series(
        "node_mountstats_nfs_transport_idle_time_seconds", "gauge", "Duration since the NFS mount last saw traffic."
    ),
    "nfs_xprt_sends": Series("node_mountstats_nfs_transport_sends_total", "counter", "Number of RPC requests sent."),
    "nfs_xprt_receives": Series(
        "node_mountstats_nfs_transport_receives_total", "counter", "Number of RPC responses received."
    ),
    "nfs_xprt_bad_xids": Series(
        "node_mountstats_nfs_transport_bad_transaction_ids_total",
        "counter",
        "Number of times the NFS server sent a response with a transaction ID unknown to this client.",
    ),
    "nfs_xprt_backlog_queue": Series(
        "node_mountstats_nfs_transport_backlog_queue_total",
        "counter",
        "Total number of items added to the RPC backlog queue.",
    ),
}
# nfs_op_<op>_<field>: node_exporter's per-operation series, the operation as a label.
NFS_OP_SERIES: dict[str, Series] = {
    "requests": Series(
        "node_mountstats_nfs_operations_requests_total",
        "counter",
        "Number of requests performed for a given operation.",
    ),
    "transmissions": Series(
        "node_mountstats_nfs_operations_transmissions_total",
        "counter",
        "Number of times an actual RPC request has been transmitted for a given operation.",
    ),
    "major_timeouts": Series(
        "node_mountstats_nfs_operations_major_timeouts_total",
        "counter",
        "Number of times a request has had a major timeout for a given operation.",
    ),
    "sent_bytes": Series(
        "node_mountstats_nfs_operations_sent_bytes_total",
        "counter",
        "Number of bytes sent for a given operation, including RPC headers and payload.",
    ),
    "received_bytes": Series(
        "node_mountstats_nfs_operations_received_bytes_total",
        "counter",
        "Number of bytes received for a given operation, including RPC headers and payload.",
    ),
    "queue_seconds": Series(
        "node_mountstats_nfs_operations_queue_time_seconds_total",
        "counter",
        "Duration all requests spent queued for transmission for a given operation before they were sent, in seconds.",
    ),
    "rtt_seconds": Series(
        "node_mountstats_nfs_operations_response_time_seconds_total",
        "counter",
        "Duration all requests took to get a reply back after a request for a given operation was transmitted, "
        "in seconds.",
    ),
    "execute_seconds": Series(
        "node_mountstats_nfs_operations_request_time_seconds_total",
        "counter",
        "Duration all requests took from when a request was enqueued to when it was completely handled for a "
        "given operation, in seconds.",
    ),
}
_OP_FIELDS = sorted(NFS_OP_SERIES, key=len, reverse=True)  # "received_bytes" before "bytes"-like suffixes


def split_op_metric(metric: str) -> tuple[str, str] | None:
    """`nfs_op_read_rtt_seconds` -> ("READ", "rtt_seconds"); None for any other metric."""
    if not metric.startswith("nfs_op_"):
        return None
    rest = metric.removeprefix("nfs_op_")
    for name in _OP_FIELDS:
        if rest.endswith("_" + name):
            return rest[: -len(name) - 1].upper(), name
    return None


def fs_samples(
    node: str, mountpoint: str, info: MountInfo | None, values: Mapping[str, float]
) -> list[tuple[Series, dict[str, str], float]]:
    """Every exposed series of one `fs:` entity, with its labels."""
    fstype = info.fstype if info is not None else ""
    source = info.source if info is not None else ""
    filesystem = {"device": source, "fstype": fstype, "mountpoint": mountpoint, NODE_LABEL: node}
    nfs = {
        "export": source,
        "mountaddr": info.server if info is not None else "",
        "protocol": info.protocol if info is not None else "",
        "mountpoint": mountpoint,
        NODE_LABEL: node,
    }
    out: list[tuple[Series, dict[str, str], float]] = []
    for metric, value in values.items():
        series = FILESYSTEM_SERIES.get(metric)
        if series is not None:
            out.append((series, filesystem, value))
            continue
        series = NFS_SERIES.get(metric)
        if series is not None:
            out.append((series, nfs, value))
            continue
        op = split_op_metric(metric)
        if op is not None:
            out.append((NFS_OP_SERIES[op[1]], {**nfs, "operation": op[0]}, value))
    return out
