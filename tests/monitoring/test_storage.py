"""The storage alerts at the head (monitoring.storage.StorageWatch) and the fleet verdict, on hand-made
`fs:` samples: a stale mount is a hung one for StorageMountHung, space or inodes over the fill threshold
fire StorageAlmostFull until 2 points under it, and the verdict adds how full the fullest node sees it."""

from __future__ import annotations

from gpufleet.monitoring.checks import Values
from gpufleet.monitoring.storage import StorageWatch, fleet_view
from gpufleet.protocol.metrics import MountInfo

INFO = MountInfo(mountpoint="/shared", fstype="nfs4", source="storage01:/export/shared", required=True)
ENTITY = "fs:/shared"


def sample(used: float = 50.0, inodes_used: float = 10.0, state: int = 0) -> Values:
    """One mount's values: `used` % of its space and `inodes_used` % of its inodes, no reserved blocks."""
    if state != 0:
        return {"fs_state": float(state), "fs_probe_seconds": 0.001}
    free = 1000.0 * (100 - used) / 100
    return {
        "fs_state": 0.0,
        "fs_probe_seconds": 0.002,
        "fs_size_bytes": 1000.0,
        "fs_free_bytes": free,
        "fs_avail_bytes": free,
        "fs_files": 1000.0,
        "fs_files_free": 1000.0 * (100 - inodes_used) / 100,
    }


def observe(watch: StorageWatch, values: Values, node_id: int = 1) -> list[tuple[str, bool, str]]:
    return [(t.rule.name, t.firing, t.summary) for t in watch.observe(node_id, [(0.0, {ENTITY: values})], [INFO])]


def test_a_stale_mount_fires_storage_mount_hung_naming_it() -> None:
    watch = StorageWatch()
    assert observe(watch, sample()) == []
    assert observe(watch, sample(state=2)) == [
        ("StorageMountHung", True, "/shared (nfs4 from storage01:/export/shared) is stale on this node")
    ]
    assert observe(watch, sample(state=2)) == []  # once
    assert observe(watch, sample()) == [("StorageMountHung", False, "")]


def test_space_over_the_threshold_fires_and_resolves_two_points_under_it() -> None:
    watch = StorageWatch(fill_pct=90.0)
    assert observe(watch, sample(used=89.9)) == []
    assert observe(watch, sample(used=90.0)) == [
        ("StorageAlmostFull", True, "/shared (nfs4 from storage01:/export/shared) is 90 % full")
    ]
    assert observe(watch, sample(used=88.5)) == []  # under 90, not under 88: still firing
    assert observe(watch, sample(used=87.9)) == [("StorageAlmostFull", False, "")]
    assert observe(watch, sample(used=89.0)) == []  # not firing: 90 again to fire


def test_inodes_over_the_threshold_fire_too() -> None:
    watch = StorageWatch(fill_pct=90.0)
    assert observe(watch, sample(used=10.0, inodes_used=95.0)) == [
        ("StorageAlmostFull", True, "/shared (nfs4 from storage01:/export/shared) is 95 % full")
    ]
    assert observe(watch, sample(used=10.0, inodes_used=10.0)) == [("StorageAlmostFull", False, "")]


def test_a_hung_mount_keeps_its_fill_alert_quiet_and_its_own_firing() -> None:
    watch = StorageWatch(fill_pct=90.0)
    assert [r for r, _f, _s in observe(watch, sample(used=95.0))] == ["StorageAlmostFull"]
    # Hung: no sizes to judge, so no longer known full; the hung alert fires.
    assert sorted((r, f) for r, f, _s in observe(watch, sample(state=1))) == [
        ("StorageAlmostFull", False),
        ("StorageMountHung", True),
    ]


def test_the_verdict_says_how_full_the_fullest_node_sees_it() -> None:
    nodes = {1: "n1", 2: "n2"}
    mounts = {1: [INFO], 2: [INFO]}

    def verdict(used1: float, used2: float, fill_pct: float = 90.0) -> tuple[str, str]:
        samples = {1: [(5.0, {ENTITY: sample(used=used1)})], 2: [(5.0, {ENTITY: sample(used=used2)})]}
        (fs,) = fleet_view(nodes, samples, mounts, fill_pct=fill_pct)
        return fs.status, fs.verdict

    assert verdict(50.0, 60.0) == ("ok", "ok on all 2 node(s)")
    assert verdict(50.0, 93.0) == ("ok", "ok on all 2 node(s); 93 % full")
    assert verdict(50.0, 60.0, fill_pct=55.0) == ("ok", "ok on all 2 node(s); 60 % full")
