"""The classifier on every real log in tests/fixtures/kernel-logs, against hand-checked expectations.

Each expectation was made by reading the file, not by running the classifier: one entry per line
an admin must hear about (line number, kind, code, GPU/device, action). Multi-line messages count
once (the "fallen off the bus" paragraph, on its last line; an SXid's Severity/Data lines belong to
the SXid above them; an Xid 119's RPC history to its Xid). Everything else in these files is noise:
boot messages, IPv6 address changes, Ethernet carrier changes, ib_sm sweeps, GSP RPC tables, call
traces, Fabric Manager team setup.

A kernel oops counts once too: its cause ("BUG: unable to handle ...", "kernel BUG at ...") and the
"Oops: 0000 [#1]" header after it are one event, on the cause's line; the panic that may follow is
an event of its own.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.logs.classify import EVENT_KINDS, LogClassifier, LogEvent, classify_text

LOGS = Path(__file__).parents[1] / "fixtures" / "kernel-logs"

Expected = tuple[int, str, int | None, str | None, str]  # line, kind, code, PCI bus or device, action

XID119 = [
    (3, "xid", 119, "0000:9b:00", "reset_gpu"),
    (38, "xid", 119, "0000:9b:00", "reset_gpu"),
    (40, "xid", 119, "0000:9b:00", "reset_gpu"),
    (42, "xid", 119, "0000:9b:00", "reset_gpu"),
    (43, "xid", 119, "0000:9b:00", "reset_gpu"),
]
EXPECTED: dict[str, list[Expected]] = {
    "Thunderbird_2k.log": [],  # 2,000 lines of a 2005 HPC cluster's syslog: ib_sm sweeps, ACPI, e1000, ntpd
    "kmsg.1.log": [],  # /dev/kmsg records: nvswitch device opens, IPv6 ADDRCONF, WireGuard
    "ibstat.47.0.all.active.0": [],
    "ib-sysfs-h100-snapshot.csv": [],  # a sysfs table, not a log: the agent's IB collector reads these
    "fabricmanager.log": [(100, "sxid", 12028, "0000:86:00", "warn")],  # "detected NVSwitch non-fatal error"
    "dmesg-with-xid-119.log": XID119,
    "kmsg-xid119-gsp-timeout-dell-xe9680.log": XID119,
    "kmsg-xid13-xid43.log": [(n, "xid", 13, "0000:38:00", "warn") for n in range(1, 17)]
    + [(17, "xid", 43, "0000:38:00", "warn")],
    "kmsg-xid79-sxid20034-nvlink-down.log": [
        (3, "xid", 79, "0000:91:00", "reboot"),
        (4, "gpu_off_bus", None, "0000:91:00", "reboot"),
        # Lines 8, 9, 12, 13 are SXid details (Severity/Engine, Data); line 8's own header line (nvswitch2,
        # engine 60) is not in the capture, and 07:00 is reported with the same code at line 10.
        (6, "sxid", 20034, "0000:06:00", "drain"),
        (7, "sxid", 20034, "0000:05:00", "drain"),
        (10, "sxid", 20034, "0000:07:00", "drain"),
        (11, "sxid", 20034, "0000:05:00", "drain"),
    ],
    "ibstat.47.0.some.down.0": [
        # Down and Disabled, but Ethernet ports of ConnectX-6 Dx cards (MT4125): NIC events, not the
        # InfiniBand fabric; every InfiniBand port (MT4129) in this file is Active.
        (77, "nic", None, "mlx5_2/1", "warn"),
        (162, "nic", None, "mlx5_7/1", "warn"),
        (179, "nic", None, "mlx5_8/1", "warn"),
    ],
    "host-crash-driver-lines-real.txt": [
        (8, "oom", None, "R:27438", "warn"),  # kernel 3.10: "Kill process ... or sacrifice child"
        (12, "oom", None, "memcg_test_1:42453", "warn"),  # its "Killed process" line (13) is the same kill
        (18, "driver", None, None, "reboot"),  # API mismatch as rsyslog writes it (#012 for newlines)
        (21, "driver", None, None, "reboot"),  # its three continuation lines are the same message
        (27, "driver", None, None, "reboot"),  # the newer wording, naming the client
        (37, "peermem", None, None, "warn"),  # Unknown symbol: the module did not load (36 is its detail)
        (40, "peermem", None, None, "warn"),  # the older nv_peer_mem module
        (45, "oops", None, None, "reboot"),  # its "Oops: 0000 [#2]" header (49) is the same oops
        (55, "oops", None, None, "reboot"),  # 58 is its header; 53-54 are ordinary NVRM lines
        (61, "oops", None, None, "reboot"),  # 65 "Oops: Oops: 0000 [#1]" is its header
        (70, "oops", None, None, "reboot"),  # kernel BUG at; 71 "invalid opcode: 0000 [#1]" is its header
        (74, "oops", None, None, "reboot"),  # a general protection fault header with no cause line before it
        (78, "oops", None, None, "reboot"),  # arm64: the header is line 90, twelve lines on
        # 93, a user-space process's general protection fault, is that process's crash, not the kernel's.
        (98, "ib_link", None, "0005:03:00.0", "warn"),  # two ports of one card stay two
        (99, "ib_link", None, "0005:03:00.1", "warn"),
        (100, "nic", None, "0005:03:00.1", "ignore"),
    ],
    # An EFI pstore dump read after the crash (`<prio>[uptime][caller]` lines, "Panic#1 PartN" headers).
    "pstore-efi-panic-ath11k.log": [(45, "panic", None, None, "drain")],
    # An oops and the panic it led to; the panic's closing "---[ end Kernel panic ..." line (70) is not another.
    "oops-panic-kasan-lkml.log": [(2, "oops", None, None, "reboot"), (69, "panic", None, None, "drain")],
    "kernel-log-lines-real.txt": [
        (8, "xid", 79, "0000:2b:00", "reboot"),
        (9, "gpu_off_bus", None, "0000:2b:00", "reboot"),
        (15, "gpu_off_bus", None, "0000:b3:00", "reboot"),  # the three-line message, lines 13-15
        (19, "xid", 45, "0000:dc:00", "warn"),
        (20, "xid", 45, "0000:ed:00", "warn"),
        (21, "xid", 45, "0000:ba:00", "warn"),
        (25, "xid", 144, "0000:01:00", "warn"),  # "Nonfatal"
        (26, "xid", 149, "0000:00:00", "drain"),  # "Fatal"
        (27, "xid", 149, "0019:01:00", "drain"),
        (28, "xid", 145, "0018:01:00", "warn"),
        (32, "xid", 154, "0009:01:00", "reset_gpu"),  # recovery action changed to Drain and Reset
        (33, "xid", 154, "0008:01:00", "reset_gpu"),  # ... to GPU Reset Required
        (37, "peermem", None, None, "warn"),  # nvidia-peermem: ERROR detected invalid context
        (38, "xid", 13, "0000:cb:00", "warn"),
        (39, "xid", 13, "0000:cb:00", "warn"),
        (40, "xid", 13, "0000:cb:00", "warn"),
        (41, "xid", 109, "0000:cb:00", "warn"),
        (45, "xid", 31, "000d:00:00", "warn"),
        (49, "xid", 48, "0000:07:00", "reset_gpu"),
        (53, "xid", 48, "0000:52:00", "reset_gpu"),
        (54, "xid", 63, "0000:52:00", "warn"),
        (55, "xid", 94, "0000:52:00", "warn"),
        (59, "xid", 63, "0000:10:1c", "warn"),
        (63, "xid", 94, "0000:01:00", "warn"),  # MIG: "PCI:0000:01:00 GPU-I:05"
        (64, "xid", 94, "0000:01:00", "warn"),
        (65, "xid", 95, "0000:01:00", "reset_gpu"),
        (69, "xid", 48, None, "reset_gpu"),  # NVIDIA's documented "XID 48 ..." form, no address
        (70, "xid", 63, None, "warn"),
        (71, "xid", 64, None, "reset_gpu"),
        (79, "ib_link", None, "ib1", "warn"),  # line 78 is eth0 losing carrier: not InfiniBand
        (83, "nic", None, "0000:01:00.0", "ignore"),  # cable plugged
        (84, "ib_link", None, "0000:01:00.0", "ignore"),  # link up
        (89, "nic", None, "0000:5c:00.0", "warn"),  # insufficient power on the PCIe slot
        (90, "nic", None, None, "warn"),  # cable error, high temperature
        (91, "nic", None, "0000:d2:00.0", "ignore"),  # ACCESS_REG failed
        (95, "nic", None, "0000:0d:00.0", "drain"),  # health compromised
        (96, "nic", None, "0000:0d:00.0", "drain"),  # firmware internal error
        (104, "ib_link", None, "mlx5_10/1", "warn"),  # ibstat: State: Down
    ],
}
# The kinds the issue asks to be found on these logs, for the precision/recall figures.
FAULT_KINDS = {"xid", "sxid", "gpu_off_bus", "ecc", "ib_link", "nic", "driver", "peermem", "panic", "oops"}


def _seen(events: list[LogEvent]) -> list[Expected]:
    return [(e.line_no, e.kind, e.code, e.pci_bus or e.device, e.action) for e in events]


def test_every_real_log_is_covered() -> None:
    assert sorted(p.name for p in LOGS.iterdir()) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_real_log_gives_exactly_the_hand_checked_events(name: str) -> None:
    text = (LOGS / name).read_text(errors="replace")
    events = classify_text(text, year=2025)
    assert _seen(events) == EXPECTED[name]
    assert {e.kind for e in events} <= set(EVENT_KINDS)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_streaming_lines_gives_what_the_whole_text_gives(name: str) -> None:
    text = (LOGS / name).read_text(errors="replace")
    streamed = list(LogClassifier(year=2025).feed(text.splitlines()))
    assert [e.as_json() for e in streamed] == [e.as_json() for e in classify_text(text, year=2025)]


def precision_recall() -> tuple[float, float, int, int]:
    """Over every fixture: (precision, recall, events found, events expected) of the fault kinds."""
    found = expected = hits = 0
    for name, wanted in EXPECTED.items():
        events = _seen(classify_text((LOGS / name).read_text(errors="replace"), year=2025))
        got = {e for e in events if e[1] in FAULT_KINDS}
        want = {e for e in wanted if e[1] in FAULT_KINDS}
        found += len(got)
        expected += len(want)
        hits += len(got & want)
    return hits / found, hits / expected, found, expected


def test_precision_and_recall_on_the_real_logs_are_one() -> None:
    precision, recall, found, expected = precision_recall()
    assert expected == 92
    assert (precision, recall) == (1.0, 1.0), (found, expected)
