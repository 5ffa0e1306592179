"""gpufleet.network.snmp against real SNMP agents (scripts/services/snmp.sh): snmpsim serving three real
switches' recordings, changed between polls where a test needs it, and Debian's snmpd over v2c and v3, whose
counters move with real traffic over a veth pair and whose port goes down when the far end does."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import pytest

from gpufleet.core.errors import InvalidInput, Unavailable
from gpufleet.network import counters, snmp
from gpufleet.network.snmp import PortReading, SnmpCredential, SnmpTarget, SwitchReading
from tests.network import snmprec
from tests.network.conftest import Recordings, SnmpAgents, SnmpLink, eventually

pytestmark = pytest.mark.snmp

ARISTA, CISCO, PROCURVE = "arista-dcs-7150s-52-cl", "cisco-c3560", "hpe-procurve-516733-b21"
# Cisco C3560's rows the tests change (CISCO-IF ifIndex 10149 is Gi0/49, 10501 is Null0: 32-bit counters only)
GI0_49, NULL0 = 10149, 10501


def port_named(reading: SwitchReading, name: str) -> PortReading:
    found = [p for p in reading.ports if p.name == name]
    assert found, f"no port {name} in {[p.name for p in reading.ports]}"
    return found[0]


# -- snmpsim: real switches' recordings --------------------------------------------------------------------
@pytest.mark.parametrize("community", [ARISTA, CISCO, PROCURVE])
def test_poll_reads_what_the_recording_holds(snmp_agents: SnmpAgents, community: str) -> None:
    """Over the network, through GETBULK walks, the same reading the recording parses into."""
    polled = snmp.poll(snmp_agents.snmpsim(community))
    assert polled == snmp.parse_reading(snmprec.columns(snmp_agents.recordings / f"{community}.snmprec"))


def test_recordings_poll_into_the_switches_names_and_speeds(snmp_agents: SnmpAgents) -> None:
    arista = snmp.poll(snmp_agents.snmpsim(ARISTA))
    assert arista.sys_name == "DUMSYS-87"
    assert arista.sys_descr.endswith("Arista Networks DCS-7150S-52-CL")
    assert len(arista.ports) == 59
    assert port_named(arista, "Ethernet49").speed_mbps == 10_000
    assert port_named(arista, "Ethernet25").speed_mbps == 100
    assert [(n.local_port, n.system_name, n.port_id) for n in arista.lldp] == [
        ("Ethernet47", "ZJ-BP-Bak-Arista", "Ethernet23"),
        ("Ethernet48", "ZJ-BP-Bak-Arista", "Ethernet24"),
    ]
    assert {s.kind for s in arista.sensors} == {"temperature", "voltage", "fan", "power_supply", "other"}

    cisco = snmp.poll(snmp_agents.snmpsim(CISCO))
    assert (cisco.sys_name, cisco.sys_object_id) == ("DUMSYS-04", "1.3.6.1.4.1.9.1.617")
    assert port_named(cisco, "Gi0/49").speed_mbps == 1000
    assert port_named(cisco, "Nu0").counter_bits == 32
    assert [(s.kind, s.ok) for s in cisco.sensors] == [("temperature", False), ("fan", True), ("power_supply", True)]

    procurve = snmp.poll(snmp_agents.snmpsim(PROCURVE))
    assert len(procurve.ports) == 42
    assert {n.system_name for n in procurve.lldp} == {None, "NWPU-CA-5548-01"}


def test_error_counter_and_port_state_changed_between_polls(
    snmp_agents: SnmpAgents, snmpsim_recordings: Recordings
) -> None:
    target = snmp_agents.snmpsim(CISCO)
    before = snmp.poll(target)
    gi49 = port_named(before, "Gi0/49")
    assert (gi49.oper_up, gi49.in_errors) == (True, 0)
    assert gi49.in_octets is not None
    snmpsim_recordings.set(
        CISCO,
        {
            f"{snmp.IF_IN_ERRORS}.{GI0_49}": 120,
            f"{snmp.IF_OPER_STATUS}.{GI0_49}": 2,  # down
            f"{snmp.IF_HC_IN_OCTETS}.{GI0_49}": gi49.in_octets + 1_250_000,
        },
    )
    after = snmp.poll(target)
    now = port_named(after, "Gi0/49")
    assert (now.oper_up, now.oper_status, now.admin_up, now.in_errors) == (False, "down", True, 120)
    rates = counters.port_rates(before, 100.0, after, 110.0)[GI0_49]
    assert rates["in_errors_per_s"] == pytest.approx(12.0)
    assert rates["in_bps"] == pytest.approx(1_000_000.0)  # 1,250,000 octets in 10 s
    assert port_named(after, "Gi0/50") == port_named(before, "Gi0/50")


def test_32_bit_counter_wrap_between_polls_gives_the_right_rate(
    snmp_agents: SnmpAgents, snmpsim_recordings: Recordings
) -> None:
    target = snmp_agents.snmpsim(CISCO)
    snmpsim_recordings.set(CISCO, {f"{snmp.IF_IN_OCTETS}.{NULL0}": 2**32 - 1_000})
    before = snmp.poll(target)
    assert port_named(before, "Nu0").in_octets == 2**32 - 1_000
    snmpsim_recordings.set(CISCO, {f"{snmp.IF_IN_OCTETS}.{NULL0}": 4_000})  # wrapped: 5,000 octets later
    after = snmp.poll(target)
    rates = counters.port_rates(before, 0.0, after, 10.0)
    assert rates[NULL0]["in_bps"] == pytest.approx(5_000 * 8 / 10)


def test_cleared_64_bit_counter_and_restart_give_no_spike(
    snmp_agents: SnmpAgents, snmpsim_recordings: Recordings
) -> None:
    target = snmp_agents.snmpsim(CISCO)
    before = snmp.poll(target)
    snmpsim_recordings.set(CISCO, {f"{snmp.IF_HC_IN_OCTETS}.{GI0_49}": 1_000})  # cleared
    cleared = snmp.poll(target)
    rates = counters.port_rates(before, 0.0, cleared, 10.0)
    assert "in_bps" not in rates[GI0_49]
    assert rates[GI0_49]["out_bps"] == 0.0
    snmpsim_recordings.set(CISCO, {f"{snmp.SYS_UPTIME}.0": 4_200})  # restarted 42 s ago
    restarted = snmp.poll(target)
    assert restarted.uptime_s == pytest.approx(42.0)
    assert counters.port_rates(cleared, 10.0, restarted, 70.0) == {}


def test_a_port_gone_from_the_table_is_gone_from_the_reading(
    snmp_agents: SnmpAgents, snmpsim_recordings: Recordings
) -> None:
    recorded = snmprec.records(snmpsim_recordings.path(CISCO))
    rows = [f"{column}.{NULL0}" for column in snmp.IF_COLUMNS]
    snmpsim_recordings.set(CISCO, dict.fromkeys((oid for oid in rows if oid in recorded), None))
    reading = snmp.poll(snmp_agents.snmpsim(CISCO))
    assert NULL0 not in {p.index for p in reading.ports}
    assert len(reading.ports) == 56


def test_walks_are_bounded(snmp_agents: SnmpAgents, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(snmp, "MAX_ROWS", 5)
    reading = snmp.poll(snmp_agents.snmpsim(ARISTA))
    assert len(reading.ports) == 5
    assert len(reading.sensors) == 5


def test_unknown_community_of_snmpsim_is_refused(snmp_agents: SnmpAgents) -> None:
    target = replace(
        snmp_agents.snmpsim(CISCO, timeout_s=0.5, retries=0), credential=SnmpCredential("2c", community="no-such")
    )
    with pytest.raises(InvalidInput, match=f"127.0.0.1:{snmp_agents.snmpsim_port}.*community"):
        snmp.poll(target)


# -- snmpd: a live agent ----------------------------------------------------------------------------------
@pytest.mark.parametrize("credential", ["2c", "sha", "sha512"])
def test_snmpd_polls_over_v2c_and_v3(snmp_agents: SnmpAgents, credential: str) -> None:
    reading = snmp.poll(snmp_agents.snmpd(credential))
    assert reading.sys_name == "gpufleet-snmpd"
    assert reading.sys_descr.startswith("Linux")
    assert reading.sys_object_id == "1.3.6.1.4.1.8072.3.2.10"  # NET-SNMP-TC::linux
    assert reading.uptime_s > 0
    lo = port_named(reading, "lo")
    assert (lo.admin_up, lo.oper_up, lo.counter_bits) == (True, True, 64)
    assert lo.in_octets is not None
    assert (reading.sensors, reading.lldp) == ([], [])  # snmpd has neither ENTITY-SENSOR-MIB nor LLDP-MIB


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"auth_key": "not-the-auth-key"}, "authentication key"),
        ({"priv_key": "not-the-priv-key"}, "privacy key"),
        ({"priv_protocol": "des"}, "privacy key or protocol"),
        ({"user": "nobody-here"}, "unknown SNMP v3 user"),
    ],
)
def test_wrong_v3_credentials_are_refused(snmp_agents: SnmpAgents, change: dict[str, Any], message: str) -> None:
    credential = replace(snmp_agents.v3["sha"], **change)
    with pytest.raises(InvalidInput, match=message) as refused:
        snmp.poll(snmp_agents.snmpd(credential, timeout_s=0.5, retries=0))
    assert f"127.0.0.1:{snmp_agents.snmpd_port}" in str(refused.value)


def test_wrong_community_is_refused(snmp_agents: SnmpAgents) -> None:
    with pytest.raises(InvalidInput, match="not to this v2c community"):
        snmp.poll(snmp_agents.snmpd(SnmpCredential("2c", community="wrong-community"), timeout_s=0.5, retries=0))


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A UDP port something holds and never answers on."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def test_agent_that_never_answers_is_unavailable(silent_port: int) -> None:
    target = SnmpTarget("127.0.0.1", silent_port, SnmpCredential("2c", community="public"), timeout_s=0.3, retries=1)
    with pytest.raises(Unavailable, match=f"127.0.0.1:{silent_port} did not answer"):
        snmp.poll(target)
    v3 = replace(target, credential=SnmpCredential("3", user="u", auth_protocol="sha", auth_key="12345678"))
    with pytest.raises(Unavailable, match=f"127.0.0.1:{silent_port}"):
        snmp.poll(v3)


def test_unknown_host_is_unavailable() -> None:
    target = SnmpTarget("no-such-switch.invalid", 161, SnmpCredential("2c", community="public"), timeout_s=0.3)
    with pytest.raises(Unavailable, match=r"no-such-switch\.invalid:161"):
        snmp.poll(target)


def test_port_down_when_the_far_end_goes_down(snmp_agents: SnmpAgents, snmpd_link: SnmpLink) -> None:
    target = snmp_agents.snmpd("sha")
    up = eventually(
        lambda: port_named(snmp.poll(target), snmpd_link.name), lambda p: p.oper_up, f"{snmpd_link.name} up"
    )
    assert (up.admin_up, up.oper_status) == (True, "up")
    snmpd_link.set_peer(up=False)
    down = eventually(
        lambda: port_named(snmp.poll(target), snmpd_link.name), lambda p: not p.oper_up, f"{snmpd_link.name} down"
    )
    assert (down.admin_up, down.oper_status) == (True, "down")
    snmpd_link.set_peer(up=True)
    eventually(
        lambda: port_named(snmp.poll(target), snmpd_link.name), lambda p: p.oper_up, f"{snmpd_link.name} up again"
    )


def test_counters_move_with_traffic(snmp_agents: SnmpAgents, snmpd_link: SnmpLink) -> None:
    target = snmp_agents.snmpd("2c")
    before = snmp.poll(target)
    before_at = time.monotonic()
    sent = port_named(before, snmpd_link.name).out_octets
    assert sent is not None
    snmpd_link.send(300, size=1000)
    after = eventually(
        lambda: snmp.poll(target),
        lambda r: (port_named(r, snmpd_link.name).out_octets or 0) >= sent + 300 * 1000,
        f"{snmpd_link.name}'s ifHCOutOctets counting 300 datagrams of 1000 bytes",
    )
    rates = counters.port_rates(before, before_at, after, time.monotonic())
    index = port_named(after, snmpd_link.name).index
    assert rates[index]["out_bps"] > 0
    assert rates[index]["out_errors_per_s"] == 0.0


def test_polls_from_several_threads_at_once(snmp_agents: SnmpAgents) -> None:
    """As the head's switch loop polls: a few switches at a time, each on a worker thread."""
    targets = [snmp_agents.snmpsim(c) for c in (ARISTA, CISCO, PROCURVE)] + [
        snmp_agents.snmpd("sha"),
        snmp_agents.snmpd("sha512"),
        snmp_agents.snmpd("2c"),
    ]
    with ThreadPoolExecutor(max_workers=len(targets)) as pool:
        readings = list(pool.map(snmp.poll, targets * 2))
    names = [r.sys_name for r in readings]
    assert names == ["DUMSYS-87", "DUMSYS-04", "DUMSYS-64", *["gpufleet-snmpd"] * 3] * 2
    assert readings[:3] == readings[6:9]
