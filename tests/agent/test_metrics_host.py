"""Host metrics: the real psutil on this machine, and which disks and NICs are kept."""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

from gpufleet.agent.metrics.host import HostCollector, disk_values
from gpufleet.protocol.metrics import DISK_METRICS, HOST_METRICS, NIC_METRICS


def test_this_machine_through_the_real_psutil() -> None:
    out = HostCollector().collect()

    host = out.entities["host"]
    assert set(host) == set(HOST_METRICS) - {"metrics_collect_s"}  # the sampler adds that one
    assert host["mem_total_bytes"] > host["mem_available_bytes"] > 0
    assert 0 <= host["cpu_util"] <= 100
    disks = [v for k, v in out.entities.items() if k.startswith("disk:")]
    nics = [v for k, v in out.entities.items() if k.startswith("nic:")]
    assert all(set(d) <= set(DISK_METRICS) and d["disk_total_bytes"] > 0 for d in disks)
    assert all(set(n) <= set(NIC_METRICS) for n in nics)
    assert "nic:lo" not in out.entities


def _fake_psutil(partitions: list[tuple[str, str, str]], nics: list[str]) -> Any:
    counters = {n: SimpleNamespace(bytes_recv=10, bytes_sent=20, errin=1, errout=2) for n in nics}
    return SimpleNamespace(
        cpu_percent=lambda interval: 12.5,
        getloadavg=lambda: (1.0, 2.0, 3.0),
        virtual_memory=lambda: SimpleNamespace(total=100, available=40, percent=60.0),
        swap_memory=lambda: SimpleNamespace(used=5),
        disk_partitions=lambda all: [SimpleNamespace(device=d, mountpoint=m, fstype=t) for d, m, t in partitions],
        net_io_counters=lambda pernic: counters,
        net_if_stats=lambda: {n: SimpleNamespace(isup=n != "eth1") for n in nics},
    )


def test_only_real_filesystems_and_physical_nics_are_kept() -> None:
    psutil = _fake_psutil(
        [
            ("/dev/nvme0n1p2", "/", "ext4"),
            ("/dev/loop3", "/snap/core22/1380", "squashfs"),  # a snap
            ("/dev/nvme0n1p2", "/var/lib/docker", "ext4"),  # the same device bound again
            ("/dev/sdb1", "/mnt/with space", "xfs"),  # no name the protocol can carry
            ("/dev/sdc1", "/does/not/exist", "xfs"),
        ],
        ["lo", "eth0", "eth1", "ib0", "veth1a2b3c", "docker0", "cali0123", "bad name"],
    )

    out = HostCollector(psutil).collect()

    assert out.entities["host"] == {
        "cpu_util": 12.5,
        "load1": 1.0,
        "load5": 2.0,
        "load15": 3.0,
        "mem_total_bytes": 100.0,
        "mem_available_bytes": 40.0,
        "mem_used_pct": 60.0,
        "swap_used_bytes": 5.0,
    }
    assert sorted(k for k in out.entities if k.startswith("disk:")) == ["disk:/"]
    assert sorted(k for k in out.entities if k.startswith("nic:")) == ["nic:eth0", "nic:eth1", "nic:ib0"]
    assert out.entities["nic:eth1"]["net_up"] == 0.0
    assert out.problems == ["disk /does/not/exist: No such file or directory"]


def test_disk_values_count_reserved_blocks_as_used_like_df() -> None:
    # 1000 blocks of 4 KiB: 300 free, of which 50 reserved for root; 100 of 1000 inodes free.
    stat = os.statvfs_result((4096, 4096, 1000, 300, 250, 1000, 100, 100, 0, 255))

    assert disk_values(stat) == {
        "disk_total_bytes": 4096000.0,
        "disk_used_pct": round(100 * 700 / 950, 2),
        "disk_inodes_used_pct": 90.0,
    }
