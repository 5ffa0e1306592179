"""Host metrics through psutil: CPU, load, memory and swap; each real mounted filesystem; each network
interface that is not a container's or a bridge's."""

from __future__ import annotations

import os
import re
from typing import Any

from gpufleet.agent.metrics.ports import Collected, CollectorError

# Filesystems that hold no data of the node's own: psutil's physical-only listing still has these.
PSEUDO_FS = frozenset(
    {"squashfs", "iso9660", "overlay", "tmpfs", "devtmpfs", "ramfs", "efivarfs", "autofs", "fuse.lxcfs", "nsfs"}
)
# Interfaces of containers, bridges and tunnels: a Kubernetes node has hundreds and none says much.
VIRTUAL_NIC = re.compile(r"^(lo|veth|docker|br-|virbr|cali|flannel|cni|vxlan|tunl|kube-|lxc|tap|vnet|genev|weave)")
MAX_DISKS = 64
MAX_NICS = 64
_ENTITY_TEXT = re.compile(r"^\S{1,64}$")
_MOUNT_TEXT = re.compile(r"^/\S{0,200}$")


class HostCollector:
    """Reads host metrics with psutil (imported on first use; the agent's extra installs it)."""

    name = "host"

    def __init__(self, psutil_module: Any | None = None) -> None:
        """`psutil_module` is the psutil module or a stand-in (tests)."""
        self._psutil = psutil_module
        self._primed = False

    def collect(self) -> Collected:
        """CPU, memory, disks and NICs. Raises CollectorError without psutil; a disk that cannot be read
        is a problem for that disk only."""
        psutil = self._module()
        out = Collected()
        if not self._primed:
            # cpu_percent measures since its previous call; the first call has nothing to compare with.
            psutil.cpu_percent(interval=None)
            self._primed = True
        memory = psutil.virtual_memory()
        load1, load5, load15 = psutil.getloadavg()
        out.entities["host"] = {
            "cpu_util": float(psutil.cpu_percent(interval=None)),
            "load1": float(load1),
            "load5": float(load5),
            "load15": float(load15),
            "mem_total_bytes": float(memory.total),
            "mem_available_bytes": float(memory.available),
            "mem_used_pct": float(memory.percent),
            "swap_used_bytes": float(psutil.swap_memory().used),
        }
        self._disks(psutil, out)
        self._nics(psutil, out)
        return out

    def _module(self) -> Any:
        if self._psutil is None:
            try:
                import psutil
            except ImportError as exc:
                raise CollectorError("host metrics unavailable: psutil is not installed") from exc
            self._psutil = psutil
        return self._psutil

    def _disks(self, psutil: Any, out: Collected) -> None:
        """One entity per mounted block-device filesystem; a second mount of the same device is skipped.

        psutil's physical-only listing leaves out network filesystems, so a hung NFS server cannot
        block the round in statvfs.
        """
        seen: set[str] = set()
        for part in psutil.disk_partitions(all=False):
            if len(seen) >= MAX_DISKS:
                break
            if part.fstype in PSEUDO_FS or part.device in seen or not _MOUNT_TEXT.match(part.mountpoint):
                continue
            seen.add(part.device)
            try:
                stat = os.statvfs(part.mountpoint)
            except OSError as exc:
                out.problems.append(f"disk {part.mountpoint}: {exc.strerror or exc}")
                continue
            out.entities[f"disk:{part.mountpoint}"] = disk_values(stat)

    def _nics(self, psutil: Any, out: Collected) -> None:
        counters = psutil.net_io_counters(pernic=True)
        stats = psutil.net_if_stats()
        names = [name for name in sorted(counters) if not VIRTUAL_NIC.match(name) and _ENTITY_TEXT.match(name)]
        for name in names[:MAX_NICS]:
            io = counters[name]
            values = {
                "net_rx_bytes": float(io.bytes_recv),
                "net_tx_bytes": float(io.bytes_sent),
                "net_rx_errors": float(io.errin),
                "net_tx_errors": float(io.errout),
            }
            if name in stats:
                values["net_up"] = float(bool(stats[name].isup))
            out.entities[f"nic:{name}"] = values


def disk_values(stat: os.statvfs_result) -> dict[str, float]:
    """Size, use and inode use from statvfs, as df computes them (reserved blocks count as used)."""
    total = stat.f_blocks * stat.f_frsize
    used = (stat.f_blocks - stat.f_bfree) * stat.f_frsize
    available = stat.f_bavail * stat.f_frsize
    values = {
        "disk_total_bytes": float(total),
        "disk_used_pct": round(100.0 * used / (used + available), 2) if used + available else 0.0,
    }
    if stat.f_files:  # some filesystems (btrfs, vfat) have no fixed inode table
        values["disk_inodes_used_pct"] = round(100.0 * (stat.f_files - stat.f_ffree) / stat.f_files, 2)
    return values
