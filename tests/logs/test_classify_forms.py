"""The line forms the classifier must understand, one at a time, and the Xid policy.

Lines are the driver's and the kernel's own formats (printk format strings filled in as they print):
see tests/fixtures/kernel-logs for whole real logs.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from gpufleet.logs.catalog import REMOVING, XidPolicy, severity_of, xid_table
from gpufleet.logs.classify import EVENT_KINDS, LogClassifier, LogEvent, classify_text, normalize_pci
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
        ("<4>[  123.456789] ", None, 123.456789),  # dmesg -r: the priority before the time
        ("<14>[    1.200000] ", None, 1.2),  # a priority with the facility folded in (user.info)
        ("<4>[  105.480943][    C2] ", None, 105.480943),  # a pstore dump: and the caller (CONFIG_PRINTK_CALLER)
        ("[    5.518860][    T0] ", None, 5.51886),  # the caller without the priority
        ("<6>", None, None),  # dmesg -r of a kernel that does not stamp times (printk.time=0)
        (  # a syslog relay's line as it travels (RFC 3164): the priority, then the syslog line
            "<6>Dec  2 10:43:35 worker4 kernel: [240314.528856] ",
            datetime(2025, 12, 2, 10, 43, 35, tzinfo=UTC).timestamp(),
            240314.528856,
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


@pytest.mark.parametrize(
    ("line", "framed"),
    [
        # from an EFI pstore dump (tests/fixtures/kernel-logs/pstore-efi-panic-ath11k.log's source)
        ("<13>[    8.729870][ T1650] Started bpfilter", (None, 8.72987, "Started bpfilter")),
        (
            "<0>[  105.480845][    C2] Kernel panic - not syncing: x",
            (None, 105.480845, "Kernel panic - not syncing: x"),
        ),
        ("Panic#1 Part1", (None, None, "Panic#1 Part1")),  # pstore's own header: not a time
        (
            "<4>[10469.941836] ---[ end trace 0000000000000000 ]---",
            (None, 10469.941836, "---[ end trace 0000000000000000 ]---"),
        ),
    ],
)
def test_raw_priority_and_caller_prefixes_are_framed(line: str, framed: tuple[float | None, float | None, str]) -> None:
    assert frame(line) == framed


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
        ("[  15.0] mlx5_core 0000:5c:00.0 ibp92s0: Link down", "ib_link", "warn", "0000:5c:00.0"),
        (
            "nvidia-nvswitch3: SXid (PCI:0000:86:00.0): 12028, Non-fatal, Link 61 egress non-posted PRIV error",
            "sxid",
            "warn",
            "0000:86:00",
        ),
        # The OOM killer of kernel 3.10 (RHEL/CentOS 7) and 4.x chose a process, "or sacrifice child".
        ("Out of memory: Kill process 7429 (java) score 259 or sacrifice child", "oom", "warn", "java:7429"),
        (
            "Memory cgroup out of memory: Kill process 42453 (memcg_test_1) score 0 or sacrifice child",
            "oom",
            "warn",
            "memcg_test_1:42453",
        ),
        (
            "[Fri Aug 30 11:11:22 2024] nvidia-peermem nv_get_p2p_free_callback:127 ERROR detected invalid context, "
            "skipping further processing",
            "peermem",
            "warn",
            None,
        ),
        ("nvidia_peermem: Unknown symbol ib_register_peer_memory_client (err -22)", "peermem", "warn", None),
        ("NVRM: API mismatch: the client has the version 515.48.07, but", "driver", "reboot", None),
        ("NVRM: API mismatch: the client 'nvidia-powerd' (pid 849)", "driver", "reboot", None),
        ("Kernel panic - not syncing: Fatal exception in interrupt", "panic", "drain", None),
        ("Kernel panic - not syncing: Out of memory and no killable processes...", "panic", "drain", None),
        ("BUG: unable to handle page fault for address: ffffa92a3eaffff8", "oops", "reboot", None),
        ("BUG: kernel NULL pointer dereference, address: 0000000000000040", "oops", "reboot", None),
        ("kernel BUG at mm/rmap.c:399!", "oops", "reboot", None),
        ("Oops: 0002 [#1] PREEMPT SMP NOPTI", "oops", "reboot", None),
        ("general protection fault: 0000 [#1] SMP", "oops", "reboot", None),
        ("Internal error: Oops: 0000000096000005 [#2] PREEMPT SMP", "oops", "reboot", None),  # arm64
    ],
)
def test_host_network_and_switch_events(line: str, kind: str, action: str, where: str | None) -> None:
    event = one(line)
    assert (event.kind, event.action, event.pci_bus or event.device) == (kind, action, where)
    assert event.kind in EVENT_KINDS  # the list the dashboard offers as filters
    assert event.severity == severity_of(event.action)


def test_what_each_new_kind_says() -> None:
    mismatch = "Jun 30 11:07:05 gpu-0 kernel: NVRM: API mismatch: the client has the version 535.54.03, but#012NVRM: "
    mismatch += "this kernel module has the version 530.30.02.  Please#012NVRM: make sure that this kernel module"
    assert one(mismatch).message == (
        "the driver's kernel module and its user-space libraries differ (libraries 535.54.03, kernel module 530.30.02)"
    )
    assert one("NVRM: API mismatch: the client 'kwin_wayland' (pid 1005)").message == (
        "the driver's kernel module and its user-space libraries differ (client kwin_wayland, pid 1005)"
    )
    assert one("Kernel panic - not syncing: Fatal exception").message == "kernel panic: Fatal exception"
    assert one("kernel BUG at lib/list_debug.c:51!").message == "kernel oops: kernel BUG at lib/list_debug.c:51!"
    gpf = "general protection fault, probably for non-canonical address 0x25b5f6bb1a24827e: 0000 [#1] SMP NOPTI"
    assert (
        one(gpf).message
        == "kernel oops: general protection fault, probably for non-canonical address 0x25b5f6bb1a24827e"
    )
    unknown = one("nv_peer_mem: Unknown symbol ib_register_peer_memory_client (err 0)")
    assert (
        unknown.message == "nv_peer_mem did not load (unknown symbol ib_register_peer_memory_client): no GPUDirect RDMA"
    )


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
        # A user-space process's general protection fault is that process's crash, not the kernel's.
        "[  106.318686] traps: pcm-sensor-serv[8542] general protection fault ip:7f638b3f9967 sp:7ffe5e7434b0 error:0",
        "[    5.524915][    T0] ---[ end Kernel panic - not syncing: Fatal exception ]---",  # the panic's last line
        "Panic#1 Part1",  # a pstore record's header
        "[   42.650402][ T3127] OOM killer disabled.",
        # the detail of the "Unknown symbol" line after it, which is the event
        "nvidia_peermem: disagrees about version of symbol ib_register_peer_memory_client",
        "nvidia_peermem: module verification failed: signature and/or required key missing - tainting kernel",
        "[ 8957.099615] NVRM: this kernel module has the version 570.148.06.  Please",  # an API mismatch's continuation
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


OOPS_CAUSE = "[  110.623513] BUG: unable to handle page fault for address: ffffa92a3eaffff8"
OOPS_HEADER = "[  110.623559] Oops: 0002 [#1] PREEMPT SMP NOPTI"


@pytest.mark.parametrize(
    ("lines", "oopses"),
    [
        ([OOPS_CAUSE, "[  110.623533] #PF: supervisor write access in kernel mode", OOPS_HEADER], [1]),
        ([OOPS_HEADER], [1]),  # a header with no cause before it (a general protection fault, an invalid opcode)
        ([OOPS_CAUSE, OOPS_HEADER, "[  111.0] Oops: 0000 [#2] PREEMPT SMP NOPTI"], [1, 3]),  # two oopses
        ([OOPS_CAUSE, *["[  110.7] Call Trace:"] * 60, OOPS_HEADER], [1, 62]),  # too far apart to be one
    ],
)
def test_each_oops_is_one_event_on_its_first_line(lines: list[str], oopses: list[int]) -> None:
    text = "\n".join(lines) + "\n"
    assert [e.line_no for e in classify_text(text) if e.kind == "oops"] == oopses
    assert [e.line_no for e in LogClassifier().feed(lines) if e.kind == "oops"] == oopses  # the agent's way


# The mlx5_core messages that are events, each as the driver writes it for port (PCI function) F of one card.
MLX5_LINES = [
    "mlx5_core 0000:3b:00.{f}: poll_health:801:(pid 0): device's health compromised - reached miss count",
    "mlx5_core 0000:3b:00.{f}: print_health_info:431:(pid 0): Health issue observed, firmware internal error",
    "mlx5_core 0000:3b:00.{f}: mlx5_pcie_event:299:(pid 268269): Detected insufficient power on the PCIe slot (27W).",
    "mlx5_core 0000:3b:00.{f}: Port module event[error]: module {f}, Cable error, High Temperature",
    "mlx5_core 0000:3b:00.{f}: Port module event: module {f}, Cable unplugged",
    "mlx5_core 0000:3b:00.{f} ibp59s0f{f}: Link down",
    "mlx5_core 0000:3b:00.{f} ibp59s0f{f}: Link up",
    "mlx5_core 0000:3b:00.{f}: mlx5_cmd_out_err:838:(pid 268269): ACCESS_REG(0x805) op_mod(0x1) failed",
]


@pytest.mark.parametrize("template", MLX5_LINES)
def test_nic_events_keep_the_pci_function_so_two_ports_stay_apart(template: str) -> None:
    port0, port1 = one(template.format(f=0)), one(template.format(f=1))
    assert (port0.pci_bus, port1.pci_bus) == ("0000:3b:00.0", "0000:3b:00.1")
    assert (port0.kind, port0.action) == (port1.kind, port1.action)


def test_a_nic_address_is_normalised_but_keeps_its_function() -> None:
    assert normalize_pci("00000019:3B:00.1", function=True) == "0019:3b:00.1"
    assert normalize_pci("3b:00.7", function=True) == "0000:3b:00.7"
    assert normalize_pci("0000:3b:00", function=True) == "0000:3b:00"  # none given: none invented
    assert normalize_pci("0000:3b:00.1") == "0000:3b:00"  # GPUs: as NVML's bus id, without the function
