"""The storage parsers on real recorded outputs (tests/fixtures/storage, provenance in SOURCES.md)."""

from pathlib import Path

import pytest

from gpufleet.agent.storage import gpfs, lustre
from gpufleet.agent.storage.nfs import KEY_OPS, nfs_values, parse_mountstats
from gpufleet.agent.storage.probe import ProbeResult, parse_child_output
from gpufleet.protocol.metrics import MAX_METRICS_PER_ENTITY, EntityValues

FIXTURES = Path(__file__).parents[2] / "fixtures" / "storage"


def text(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_mountstats_rdma_nconnect_counts_every_transport_and_op() -> None:
    mounts = parse_mountstats(text("mountstats-el8.7-nfs3-rdma-nconnect.txt"))
    assert list(mounts) == ["/storage/group"]  # the tmpfs, xfs and proc blocks are not NFS
    group = mounts["/storage/group"]
    assert (group.device, group.fstype, group.statvers) == ("example.com:/group", "nfs", "1.1")
    assert group.protocol == "rdma"
    assert group.server == "10.6.159.1"
    assert len(group.transports) == 8
    assert {t.kind for t in group.transports} == {"rdma"}
    read = group.ops["READ"]
    assert (read.requests, read.transmissions, read.major_timeouts) == (36019499, 36019499, 0)
    assert read.received_bytes == 1735446589952
    assert read.rtt_seconds == pytest.approx(26116.356)
    assert read.execute_seconds == pytest.approx(27160.896)
    assert group.ops["LOOKUP"].errors == 90189  # the ninth field of statvers 1.1
    values = nfs_values(group)
    assert values["nfs_xprt_sends"] == sum([5001450, 5000369, 5001230, 5000643, 5001675, 5001928, 5000620, 5001170])
    assert values["nfs_xprt_idle_seconds"] == 12  # the least idle of the eight
    assert values["nfs_total_read_bytes"] == 1730835995062
    assert values["fs_ops"] == sum(o.requests for o in group.ops.values())
    assert values["nfs_op_read_rtt_seconds"] == pytest.approx(26116.356)
    assert "nfs_op_commit_requests" not in values  # never used: no series
    assert len(values) + 8 <= MAX_METRICS_PER_ENTITY  # room for the probe's values
    EntityValues(entity="fs:/storage/group", values=values)


def test_mountstats_nfs3_tcp_statvers_1_1() -> None:
    mount = parse_mountstats(text("mountstats-el8-nfs3-tcp.txt"))["/mnt/nfsv3"]
    (xprt,) = mount.transports
    assert (xprt.kind, xprt.port, xprt.connect, xprt.idle_seconds, xprt.sends, xprt.receives) == (
        "tcp",
        782,
        1,
        21,
        23,
        23,
    )
    write = mount.ops["WRITE"]
    assert (write.requests, write.sent_bytes, write.queue_seconds, write.errors) == (16, 2099456, 0.101, 8)
    assert mount.bytes[:2] == (0, 1048576)
    values = nfs_values(mount)
    assert values["nfs_op_write_execute_seconds"] == pytest.approx(0.183)
    assert values["nfs_age_seconds"] == 88


def test_mountstats_procfs_nfs4_tcp_keeps_a_wrapped_counter() -> None:
    mount = parse_mountstats(text("mountstats-procfs-nfs4-tcp.txt"))["/mnt/nfs/test"]
    assert mount.fstype == "nfs4"
    assert mount.protocol == "tcp"
    assert mount.server == "192.168.1.1"
    access = mount.ops["ACCESS"]
    assert access.errors is None  # RPC iostats 1.0: eight fields
    assert access.queue_seconds == pytest.approx(18446743919241604546 / 1000)
    assert mount.transports[0].bad_xids == 0
    assert mount.transports[0].requests_total == 12154
    assert set(KEY_OPS) >= {"READ", "WRITE", "ACCESS"}


def test_mountstats_ignores_broken_lines() -> None:
    broken = (
        "device a:/b mounted on /m with fstype nfs4 statvers=1.1\n\txprt:\ttcp x\n\tper-op statistics\n\tREAD: 1 2\n"
    )
    mount = parse_mountstats(broken)["/m"]
    assert mount.transports == []
    assert mount.ops == {}


def test_lfs_df_nersc() -> None:
    blocks = lustre.parse_lfs_df(text("lfs-df-nersc-scratch2.txt"))
    scratch = blocks["/scratch2"]
    assert [t.kind for t in scratch.targets].count("OST") == 24
    assert [t.kind for t in scratch.targets].count("MDT") == 1
    assert scratch.unavailable == []
    values = lustre.lustre_values("snx11035", [], {}, scratch)
    assert values["lustre_ost_fill_max_pct"] == pytest.approx(100 * 74730308892 / (74730308892 + 15098973004), 0.01)
    assert round(values["lustre_ost_fill_max_pct"]) == 83  # what lfs df printed for OST0006
    assert round(values["lustre_mdt_fill_max_pct"]) == 5


def test_lfs_df_unavailable_targets() -> None:
    df = "UUID 1K-blocks Used Available Use% Mounted on\nfs-OST0002_UUID : inactive device\n" + (
        "fs-OST0001_UUID 100 50 50 50% /mnt/fs[OST:1]\n"
    )
    assert lustre.parse_lfs_df(df)["/mnt/fs"].unavailable == ["fs-OST0002: inactive device"]


def test_lctl_import_states() -> None:
    imports = lustre.parse_import_states(text("lctl-osc-state.txt"))
    assert len(imports) == 8
    assert imports[0] == lustre.Import("tesfs", "OST0000", "DISCONN")
    assert {i.state for i in imports[1:]} == {"FULL"}
    values = lustre.lustre_values("tesfs", imports, {}, None)
    assert (values["lustre_targets"], values["lustre_targets_unhealthy"]) == (8, 1)
    assert lustre.lustre_values("otherfs", imports, {}, None) == {}


def test_lctl_llite_stats() -> None:
    stats = lustre.parse_llite_stats(text("lctl-llite-stats-2.14.txt"))
    lines = stats["a361000-ffff8b524be17800"]
    assert lines["read"] == lustre.StatLine(16, "usecs", 219695.0)
    assert lines["ioctl"] == lustre.StatLine(2, "reqs", None)
    values = lustre.lustre_values("a361000", [], stats, None)
    usecs = [line for line in lines.values() if line.unit == "usecs"]
    assert values["fs_ops"] == sum(line.count for line in usecs)
    assert values["fs_op_seconds"] == pytest.approx(sum(line.total or 0 for line in usecs) / 1e6)
    assert values["lustre_read_bytes"] == 44179456
    assert lustre.fsname_of("10.0.0.1@o2ib:10.0.0.2@o2ib:/a361000") == "a361000"


def test_mmhealth_and_mmdf() -> None:
    health = gpfs.parse_mmhealth(text("mmhealth-node-show-Y.txt"))
    assert gpfs.HealthState("FILESYSTEM", "project", "FILESYSTEM", "HEALTHY") in health
    usage = gpfs.parse_mmdf(text("mmdf-Y.txt"))
    assert usage["fsTotal"]["fsSize"] == "3661677723648"
    values = gpfs.gpfs_values("project", health, usage)
    assert values == {
        "gpfs_node_health": 1.0,  # TIPS
        "gpfs_health": 0.0,
        "gpfs_metadata_size_bytes": 13891534848 * 1024,
        "gpfs_metadata_free_bytes": 6011299328 * 1024,
        "gpfs_inodes_max": 1332164000.0,
        "gpfs_inodes_used": 430741822.0,
    }
    assert "gpfs_health" not in gpfs.gpfs_values("other", health, {})


def test_probe_child_output() -> None:
    ok = parse_child_output("ok 0.0012 4096 100 40 30 1000 900\n")
    assert ok == ProbeResult("ok", 0.0012, "", None, 409600, 163840, 122880, 1000, 900)
    assert ok.values()["fs_state"] == 0
    stale = parse_child_output("err 116 0.01 Stale file handle\n")
    assert (stale.state, stale.errno, stale.message) == ("stale", 116, "Stale file handle")
    assert parse_child_output("err 5 0.5 Input/output error").state == "error"
    with pytest.raises(ValueError, match="unexpected probe output"):
        parse_child_output("Traceback (most recent call last):")
