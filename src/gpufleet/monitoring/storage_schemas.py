"""The shared file systems' fleet view on the wire (GET /api/v1/storage, the dashboard, `gpufleet storage list`)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from gpufleet.monitoring.storage import FileSystem, NodeMount


class NodeMountOut(BaseModel):
    node: str
    mountpoint: str
    state: str = Field(description="ok, hung, stale, error or not mounted")
    latency_ms: float | None = Field(None, description="mean time per operation over the last sample interval")
    baseline_ms: float | None = Field(None, description="this mount's usual time per operation on this node")
    ops_per_s: float | None = None
    probe_ms: float | None = Field(None, description="stat and statvfs of the mount point")
    used_pct: float | None = None
    inodes_used_pct: float | None = None
    retransmissions: float | None = Field(None, description="NFS: transmissions beyond one per operation")
    required: bool = False
    slow: bool = False

    @classmethod
    def of(cls, mount: NodeMount) -> NodeMountOut:
        fields = {name: getattr(mount, name) for name in cls.model_fields}
        return cls.model_validate(fields)


class FileSystemOut(BaseModel):
    source: str = Field(description="server:/export, the Lustre name, the GPFS device")
    fstype: str
    mountpoints: list[str]
    status: str = Field(description="ok, slow, degraded (on some nodes) or down (on every node)")
    verdict: str
    nodes_total: int
    nodes_ok: int
    used_pct: float | None = None
    latency_ms_median: float | None = None
    nodes: list[NodeMountOut]

    @classmethod
    def of(cls, fs: FileSystem) -> FileSystemOut:
        latencies = sorted(n.latency_ms for n in fs.nodes if n.latency_ms is not None)
        return cls(
            source=fs.source,
            fstype=fs.fstype,
            mountpoints=fs.mountpoints,
            status=fs.status,
            verdict=fs.verdict,
            nodes_total=len(fs.nodes),
            nodes_ok=sum(1 for n in fs.nodes if n.state == "ok"),
            used_pct=fs.used_pct,
            latency_ms_median=latencies[len(latencies) // 2] if latencies else None,
            nodes=[NodeMountOut.of(n) for n in fs.nodes],
        )
