"""The shared file systems as metrics: one `fs:<mount point>` entity per watched mount, and its MountInfo.

Watched: every mount point in `shared_mounts` (mounted or not: a configured mount that is gone is
reported as not mounted), and every mounted file system whose type is in `shared_types` (NFS, Lustre,
GPFS, BeeGFS, WekaFS, CephFS, CIFS by default). Each is probed (`probe.MountProber`, all at once: a
round waits at most one probe timeout however many servers hang); NFS mounts add their mountstats
counters; Lustre's and GPFS's programs run once every `detail_interval_s` (they ask the servers
themselves), and never for a mount whose probe did not answer.
"""

from __future__ import annotations

import logging
import posixpath
import re
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from gpufleet.agent.checks.mounts import Mount
from gpufleet.agent.metrics.ports import Collected, CollectorError
from gpufleet.agent.storage import gpfs, lustre
from gpufleet.agent.storage.nfs import NfsMount, nfs_values, parse_mountstats
from gpufleet.agent.storage.probe import STATE_CODES, ProbeResult
from gpufleet.agent.storage.source import SHARED_TYPES, StorageSource
from gpufleet.protocol.metrics import MAX_MOUNTS_PER_SAMPLE, MountInfo

log = logging.getLogger(__name__)

_ENTITY_PATH = re.compile(r"^/\S{0,200}$")
_FSTYPE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,31}$")
_TEXT_BAD = re.compile(r"[\x00-\x1f\x7f]")
MAX_PROBES_AT_ONCE = 16


def shared(path: str, mount: Mount | None, shared_mounts: Sequence[str], shared_types: Sequence[str]) -> bool:
    """Whether a mount point is one of the watched shared file systems."""
    return path in shared_mounts or (mount is not None and mount.fstype in shared_types)


def watched_paths(table: dict[str, Mount], shared_mounts: Sequence[str], shared_types: Sequence[str]) -> list[str]:
    """The configured mounts, then the mounted ones of a shared type, each once, at most MAX_MOUNTS."""
    paths = [posixpath.normpath(p) for p in shared_mounts]
    paths += sorted(point for point, mount in table.items() if mount.fstype in shared_types)
    return list(dict.fromkeys(paths))[:MAX_MOUNTS_PER_SAMPLE]


def mount_info(path: str, mount: Mount | None, nfs: NfsMount | None, required: bool) -> MountInfo:
    """What labels the entity; text the protocol would refuse is cleaned, never a reason to drop it."""
    fstype = mount.fstype if mount is not None else "none"
    return MountInfo(
        mountpoint=path,
        fstype=fstype if _FSTYPE.match(fstype) else "other",
        source=_TEXT_BAD.sub("?", mount.source if mount is not None else "")[:256],
        protocol=_TEXT_BAD.sub("?", nfs.protocol if nfs is not None else "")[:16],
        server=_TEXT_BAD.sub("?", nfs.server if nfs is not None else "")[:64],
        required=required,
    )


class StorageCollector:
    """A metrics Collector over a StorageSource (the real node's, or a simulated one)."""

    name = "storage"

    def __init__(
        self,
        source: StorageSource,
        *,
        shared_mounts: Sequence[str] = (),
        shared_types: Sequence[str] = SHARED_TYPES,
        required: Sequence[str] = (),
        detail_interval_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.source = source
        self.shared_mounts = [posixpath.normpath(p) for p in shared_mounts]
        self.shared_types = tuple(shared_types)
        self.required = {posixpath.normpath(p) for p in required}
        self.detail_interval_s = detail_interval_s
        self._clock = clock
        self._details_at: float | None = None
        self._details: dict[str, dict[str, float]] = {}  # kept between detail rounds

    def collect(self) -> Collected:
        """One entity per watched mount. Raises CollectorError when the mount table cannot be read."""
        try:
            table = self.source.mounts()
        except OSError as exc:
            raise CollectorError(f"cannot read the mount table: {exc.strerror or exc}") from exc
        out = Collected()
        paths = [p for p in watched_paths(table, self.shared_mounts, self.shared_types) if _ENTITY_PATH.match(p)]
        if not paths:
            return out
        probes = self._probe([p for p in paths if p in table])
        nfs = parse_mountstats(self.source.mountstats() or "") if any(_is_nfs(table.get(p)) for p in paths) else {}
        details = self._lustre_and_gpfs(paths, table, probes)
        for path in paths:
            mount = table.get(path)
            if mount is None:
                values = {"fs_state": float(STATE_CODES["not mounted"])}
            else:
                values = probes[path].values()
                if path in nfs:
                    values.update(nfs_values(nfs[path]))
                values.update(details.get(path, {}))
            out.entities[f"fs:{path}"] = values
            out.mounts.append(mount_info(path, mount, nfs.get(path), path in self.required))
        return out

    def _probe(self, paths: list[str]) -> dict[str, ProbeResult]:
        if not paths:
            return {}
        workers = min(len(paths), MAX_PROBES_AT_ONCE)
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="gpufleet-probe") as pool:
            results = list(pool.map(self.source.probe, paths))
        return dict(zip(paths, results, strict=True))

    def _lustre_and_gpfs(
        self, paths: list[str], table: dict[str, Mount], probes: dict[str, ProbeResult]
    ) -> dict[str, dict[str, float]]:
        """Lustre's and GPFS's own figures, read again every detail interval; a mount not answering its
        probe keeps its last ones (its programs would hang on it too)."""
        now = self._clock()
        if self._details_at is not None and now - self._details_at < self.detail_interval_s:
            return self._details
        answering = [p for p in paths if p in probes and probes[p].state == "ok"]
        lustre_paths = [p for p in answering if table[p].fstype == "lustre"]
        gpfs_paths = [p for p in answering if table[p].fstype == "gpfs"]
        if not lustre_paths and not gpfs_paths:
            return self._details
        self._details_at = now
        if lustre_paths:
            params = self.source.lustre_params() or ""
            imports = lustre.parse_import_states(params)
            stats = lustre.parse_llite_stats(params)
            for path in lustre_paths:
                df = lustre.parse_lfs_df(self.source.lustre_df(path) or "").get(path)
                fsname = lustre.fsname_of(table[path].source)
                self._details[path] = lustre.lustre_values(fsname, imports, stats, df)
        if gpfs_paths:
            health = gpfs.parse_mmhealth(self.source.gpfs_health() or "")
            for path in gpfs_paths:
                device = table[path].source
                usage = gpfs.parse_mmdf(self.source.gpfs_df(device) or "")
                self._details[path] = gpfs.gpfs_values(device, health, usage)
        return self._details


def _is_nfs(mount: Mount | None) -> bool:
    return mount is not None and mount.fstype.startswith("nfs")
