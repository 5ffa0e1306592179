"""The line forms the classifier must understand, one at a time, and the Xid policy.

Lines are the driver's and the kernel's own formats (printk format strings filled in as they print):
see tests/fixtures/kernel-logs for whole real logs.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from gpufleet.logs.catalog import REMOVING, XidPolicy, xid_table
from gpufleet.logs.classify import EVENT_KINDS, LogEvent, classify_text, normalize_pci
from gpufleet.logs.framing import frame


def one(line: str, policy: XidPolicy | None = None) -> LogEvent:
    events = classify_text(line + "\n", policy or XidPolicy(), year=2025)
    assert len(events) == 1, events
    return events[0]


@pytest.mark.parametrize(
    ("line", "code", "bus"),
    [
        ("NVRM: Xid (PCI:0000:2b:00): 79, pid=123, name=python, GPU has fallen off the bus.", 79, "0000:2b:00"),
        ("NVRM: Xid (PCI:0019:01:00): 149, NETIR Fatal XC0 i0 Link -1 (0x000fe406 0x0)", 149, "0019:01:00"),
        ("NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9).", 94, "0000:01:00"),
        ("NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics Exception", 13, "0000:cb:00"),
        ("NVRM: Xid (PCI:0000:3b:00): 62, 12a4(2c74) 00000000 00000000", 62, "0000:3b:00"),  # no pid, no name
        ("NVRM: Xid (0000:01:00): 31, Ch 00000010, engmask 00000101", 31, "0000:01:00"),  # the pre-R460 form
        ("NVRM: Xid (PCI:00000008:01:00): 48, pid=1, DBE", 48, "0008:01:00"),  # an 8-digit PCI domain
        ("XID 48 An uncorrectable double bit error (DBE) has been detected on GPU (0)", 48, None),
    ],
)
def test_every_form_of_xid_line(line: str, code: int, bus: str | None) -> None:
    event = one(line)
    assert (event.kind, event.code, event.pci_bus) == ("xid", code, bus)
    assert event.line == line
    assert event.category == xid_table()[code].category


def _utc(year: int, month: int, day: int, hour: int, minute: int, second: float) -> float:
    return datetime(year, month, day, hour, minute, tzinfo=UTC).timestamp() + second


@pytest.mark.parametrize(
    ("prefix", "epoch", "uptime"),
    [
        ("[ 1843.308145] ", None, 1843.308145),  # dmesg
        ("6,3964,206764307,-;", None, 206.764307),  # /dev/kmsg
        ("[Fri Aug 30 11:43:09 2024] ", _utc(2024, 8, 30, 11, 43, 9), None),  # dmesg -T
        ("kern  :warn  : 2025-01-21T04:41:44,283302+00:00 ", 1737434504.283302, None),  # dmesg --time-format iso
        (
            "Dec  2 10:43:35 worker4 kernel: [240314.528856] ",
            datetime(2025, 12, 2, 10, 43, 35, tzinfo=UTC).timestamp(),
            240314.528856,
        ),
        (
            "2025-03-01T08:00:01.500000+01:00 gpu01 kernel: ",
            datetime(2025, 3, 1, 7, 0, 1, 500000, tzinfo=UTC).timestamp(),
            None,
        ),
    ],
)
def test_times_come_from_every_prefix(prefix: str, epoch: float | None, uptime: float | None) -> None:
    event = one(prefix + "NVRM: Xid (PCI:0000:07:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable DBE")
    assert (event.code, event.time, event.uptime_s) == (48, pytest.approx(epoch) if epoch else None, uptime)


def test_journal_json_lines_are_read_by_their_message() -> None:
    record = {
        "__REALTIME_TIMESTAMP": "1740327858123456",
        "__MONOTONIC_TIMESTAMP": "5000000",
        "MESSAGE": "NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, name=nvidia-smi, Timeout after 6s",
    }
    event = one(json.dumps(record))
    assert (event.code, event.pci_bus, event.time, event.uptime_s) == (119, "0000:9b:00", 1740327858.123456, 5.0)
    as_bytes = dict(record, MESSAGE=list(b"NVRM: Xid (PCI:0000:9b:00): 79, GPU has fallen off the bus."))
    assert one(json.dumps(as_bytes)).code == 79  # journald writes non-UTF-8 messages as byte arrays


def test_a_year_less_syslog_date_in_the_future_is_last_year() -> None:
    tomorrow_next_year = datetime.now(UTC).replace(year=datetime.now(UTC).year + 1)
    t = tomorrow_next_year  # syslog pads the day with a space ("Dec  1"), never the hour
    stamp = f"{t:%b} {t.day:2d} {t:%H:%M:%S}"
    epoch, _, _ = frame(f"{stamp} host kernel: hello")
    assert epoch is not None
    assert datetime.fromtimestamp(epoch, UTC).year == datetime.now(UTC).year  # never in the future


@pytest.mark.parametrize(
    ("line", "kind", "action", "where"),
    [
        (
            "[  61.0] Out of memory: Killed process 4242 (python3) total-vm:81234kB, anon-rss:7000kB",
            "oom",
            "warn",
            "python3:4242",
        ),
        ("[  61.0] Memory cgroup out of memory: Killed process 77 (train) total-vm:1kB", "oom", "warn", "train:77"),
        ("[ 243.1] INFO: task python3:5120 blocked for more than 120 seconds.", "hung_task", "warn", "python3:5120"),
        ("[  90.2] mce: [Hardware Error]: Machine check events logged", "mce", "warn", None),
        ("[  90.3] EDAC MC0: 1 CE memory read error on CPU_SrcID#0_Ha#0_Chan#1_DIMM#0", "mce", "warn", None),
        ("[  90.4] EDAC MC1: 1 UE memory read error on CPU_SrcID#1_Ha#0_Chan#0_DIMM#0", "mce", "drain", None),
        ("[  12.0] NVRM: GPU 0000:3b:00.0: GPU reset requested by nvidia-smi", "gpu_reset", "warn", "0000:3b:00"),
        ("[  13.0] ib0: Lost carrier", "ib_link", "warn", "ib0"),
        ("[  14.0] ibp12s0: Gained carrier", "ib_link", "ignore", "ibp12s0"),
        ("[  15.0] mlx5_core 0000:5c:00.0 ibp92s0: Link down", "ib_link", "warn", "0000:5c:00"),
        (
            "nvidia-nvswitch3: SXid (PCI:0000:86:00.0): 12028, Non-fatal, Link 61 egress non-posted PRIV error",
            "sxid",
            "warn",
            "0000:86:00",
        ),
    ],
)
def test_host_network_and_switch_events(line: str, kind: str, action: str, where: str | None) -> None:
    event = one(line)
    assert (event.kind, event.action, event.pci_bus or event.device) == (kind, action, where)
    assert event.kind in EVENT_KINDS  # the list the dashboard offers as filters


@pytest.mark.parametrize(
    "line",
    [
        "[    0.000000] Linux version 6.1.0-18-amd64 (debian-kernel@lists.debian.org)",
        "[    5.1] nvidia-nvswitch2: open (major=510)",
        "[    5.2] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.90.07",
        "[    5.3] NVRM: GPU at PCI:0000:2b:00: GPU-0b11d014-1685-04bd-26ed-5fc0bc1c44ae",
        "[    7.0] mlx5_core 0000:01:00.0: firmware version: 28.39.1002",
        "[    8.0] IPv6: ADDRCONF(NETDEV_CHANGE): ib0: link becomes ready",
        "[    9.0] eth0: Lost carrier",
        "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Data {0x10000000, 0x10000000}",
        "[   10.0] e1000: eth0: e1000_watchdog: NIC Link is Up 1000 Mbps Full Duplex",
    ],
)
def test_ordinary_lines_raise_nothing(line: str) -> None:
    assert classify_text(line + "\n") == []


def test_the_policy_overrides_the_table_and_the_line() -> None:
    line = "NVRM: Xid (PCI:0009:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"
    assert one(line).action == "reboot"  # what the line says beats the table's `warn` for 154
    assert one(line, XidPolicy.from_setting({"154": "ignore"})).action == "ignore"  # the admin beats both
    xid13 = "NVRM: Xid (PCI:0000:cb:00): 13, pid=1, Graphics Exception"
    drained = one(xid13, XidPolicy.from_setting({13: "drain"}))
    assert (drained.action, drained.severity) == ("drain", "critical")
    assert one(xid13).severity == "warning"
    assert one("NVRM: Xid (PCI:0000:cb:00): 999, something new").action == "warn"  # unknown: a look, not a drain


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"x13": "drain"}, "'x13' is not an Xid number"),
        ({"-1": "drain"}, "'-1' is not an Xid number"),
        ({"13": "explode"}, "Xid 13: 'explode' is not one of ignore, warn, drain, reset_gpu, reboot"),
    ],
)
def test_a_bad_policy_names_what_is_wrong(setting: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        XidPolicy.from_setting(setting)


def test_pci_ids_are_normalised_as_nvml_and_the_driver_write_them() -> None:
    assert normalize_pci("00000000:2B:00.0") == "0000:2b:00"  # NVML
    assert normalize_pci("0000:2b:00") == "0000:2b:00"  # the driver's Xid lines
    assert normalize_pci("2b:00") == "0000:2b:00"
    assert normalize_pci("00000019:01:00.0") == "0019:01:00"


def test_the_shipped_table_removes_the_gpu_for_the_well_known_fatal_xids() -> None:
    removing = {code for code, info in xid_table().items() if info.action in REMOVING}
    assert removing >= {48, 62, 64, 74, 79, 95, 119, 120, 140}
    assert removing.isdisjoint({13, 31, 43, 45, 63, 94})  # application errors and recorded events
