"""A simulated node's shared mounts: a `StorageSource` whose NFS servers can hang, go stale or slow down.

The agent's real `StorageCollector` and `StorageChecks` read it, parsing included: mountstats comes as
the kernel writes it (an NFSv4.2 mount over TCP, statvers 1.1), its counters moving with time, so the
head sees real rates and round-trip times. Faults act on one mount (by its place in the list, the
fault command's `gpu` field; default the first):

- `mount-hang`: the server stops answering: the probe reports hung (at once: a simulated node never
  waits out the timeout), and the counters stop;
- `mount-stale`: the export is gone from the server: stat fails with ESTALE;
- `mount-slow`: every operation takes ten times as long (the latency alert's case).
"""

from __future__ import annotations

import errno
import posixpath
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpufleet.agent.checks.mounts import Mount
from gpufleet.agent.storage.probe import ProbeResult
from gpufleet.core.errors import InvalidInput

MOUNT_FAULTS = ("mount-hang", "mount-stale", "mount-slow")
SIZE_BYTES = 500 * 2**40
OPS_PER_S = 200.0  # each node's steady metadata and data traffic
RTT_S = 0.0008
SLOW_FACTOR = 10.0
# Op name, its share of the traffic, bytes sent and received per op.
_OPS = (("READ", 0.35, 120, 1_048_700), ("WRITE", 0.15, 1_048_700, 120), ("GETATTR", 0.3, 200, 260))
_OTHER_OPS = ("NULL", "COMMIT", "OPEN", "CLOSE", "SETATTR", "LOOKUP", "ACCESS", "READDIR")


@dataclass
class _Share:
    path: str
    source: str
    fault: str | None = None
    ops: float = 0.0  # operations done so far
    rtt: float = 0.0  # their round trips, s
    updated: float = 0.0


class SimulatedStorage:
    """StorageSource over `paths`, each an NFSv4.2 export of `server` (`server:/export<path>`)."""

    def __init__(
        self,
        paths: Sequence[str],
        *,
        server: str = "storage01",
        node: str = "",
        timeout_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.timeout_s = timeout_s
        self._clock = clock
        self._lock = threading.Lock()
        now = clock()
        self._shares = [
            _Share(posixpath.normpath(p), f"{server}:/export{posixpath.normpath(p)}", updated=now) for p in paths
        ]
        # Nodes differ a little, as real ones do: a node's used share and starting counters.
        self._seed = zlib.crc32(node.encode()) % 1000

    # StorageSource

    def mounts(self) -> dict[str, Mount]:
        return {s.path: Mount("nfs4", False, s.source) for s in self._shares}

    def probe(self, path: str) -> ProbeResult:
        with self._lock:
            share = next((s for s in self._shares if s.path == path), None)
            if share is None:
                return ProbeResult("error", 0.0, "No such file or directory", errno.ENOENT)
            if share.fault == "mount-hang":
                return ProbeResult("hung", self.timeout_s, f"no answer within {self.timeout_s:g} s")
            if share.fault == "mount-stale":
                return ProbeResult("stale", 0.001, "Stale file handle", errno.ESTALE)
            used = 0.6 + self._seed / 100_000
            seconds = 0.002 * (SLOW_FACTOR if share.fault == "mount-slow" else 1.0)
            return ProbeResult(
                "ok",
                seconds,
                size_bytes=float(SIZE_BYTES),
                free_bytes=SIZE_BYTES * (1 - used),
                avail_bytes=SIZE_BYTES * (1 - used) * 0.95,
                files=2.0**32,
                files_free=2.0**32 * 0.9,
            )

    def mountstats(self) -> str | None:
        with self._lock:
            now = self._clock()
            blocks = [
                "device sysfs mounted on /sys with fstype sysfs",
                "device /dev/nvme0n1p2 mounted on / with fstype ext4",
            ]
            for share in self._shares:
                self._advance(share, now)
                blocks.append(self._block(share))
            return "\n".join(blocks) + "\n"

    def lustre_params(self) -> str | None:
        return None

    def lustre_df(self, mountpoint: str) -> str | None:
        return None

    def gpfs_health(self) -> str | None:
        return None

    def gpfs_df(self, device: str) -> str | None:
        return None

    # Faults

    def inject(self, kind: str, index: int | None = None) -> str:
        """Apply a mount fault to mount number `index` (default the first). Raises InvalidInput for another
        kind or a mount the node does not have."""
        if kind not in MOUNT_FAULTS:
            raise InvalidInput(f"the simulated mounts have no fault {kind!r}")
        position = 0 if index is None else index
        with self._lock:
            if not 0 <= position < len(self._shares):
                raise InvalidInput(f"this node has no shared mount {position} (it has {len(self._shares)})")
            share = self._shares[position]
            self._advance(share, self._clock())
            share.fault = kind
        what = {"mount-hang": "does not answer", "mount-stale": "is stale", "mount-slow": "is slow"}[kind]
        return f"{share.path} ({share.source}) {what}"

    def heal(self) -> str:
        with self._lock:
            now = self._clock()
            faulty = [s for s in self._shares if s.fault]
            for share in faulty:
                self._advance(share, now)
                share.fault = None
        return f"{len(faulty)} shared mount(s) answer again"

    def _advance(self, share: _Share, now: float) -> None:
        elapsed = max(now - share.updated, 0.0)
        share.updated = now
        if share.fault in ("mount-hang", "mount-stale"):
            return  # nothing completes
        ops = OPS_PER_S * elapsed
        share.ops += ops
        share.rtt += ops * RTT_S * (SLOW_FACTOR if share.fault == "mount-slow" else 1.0)

    def _block(self, share: _Share) -> str:
        base = 1_000_000 + self._seed * 1000
        total_ops = base + share.ops
        total_rtt = base * RTT_S + share.rtt
        lines = [
            f"device {share.source} mounted on {share.path} with fstype nfs4 statvers=1.1",
            "\topts:\trw,vers=4.2,rsize=1048576,wsize=1048576,namlen=255,hard,proto=tcp,timeo=600,retrans=2,"
            "sec=sys,clientaddr=10.0.0.2,addr=10.0.0.1,local_lock=none",
            f"\tage:\t{int(share.updated)}",
            f"\tbytes:\t{int(total_ops * 0.35 * 1048576)} {int(total_ops * 0.15 * 1048576)} 0 0 "
            f"{int(total_ops * 0.35 * 1048576)} {int(total_ops * 0.15 * 1048576)} 0 0",
            "\tRPC iostats version: 1.1  p/v: 100003/4 (nfs)",
            f"\txprt:\ttcp 780 1 1 0 0 {int(total_ops)} {int(total_ops)} 0 {int(total_ops)} 0 64 0 0",
            "\tper-op statistics",
        ]
        for name, share_of, sent, received in _OPS:
            ops = int(total_ops * share_of)
            rtt_ms = int(total_rtt * share_of * 1000)
            queue_ms, execute_ms = ops // 100, rtt_ms + ops // 50
            lines.append(
                f"\t{name:>12}: {ops} {ops} 0 {ops * sent} {ops * received} {queue_ms} {rtt_ms} {execute_ms} 0"
            )
        lines += [f"\t{name:>12}: 0 0 0 0 0 0 0 0 0" for name in _OTHER_OPS]
        return "\n".join(lines) + "\n"
