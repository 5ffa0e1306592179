"""gpufleet.network.snmp without a network: its parsing of three real switches' recordings (snmpsim-data,
tests/fixtures/snmp), the id rendering LLDP needs, and the credential checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.core.errors import InvalidInput
from gpufleet.network import snmp
from gpufleet.network.snmp import LldpRemote, SensorReading, SnmpCredential, SnmpTarget
from tests.conftest import FIXTURES
from tests.network import snmprec

RECORDINGS = FIXTURES / "snmp"
ARISTA = RECORDINGS / "arista-dcs-7150s-52-cl.snmprec"
CISCO = RECORDINGS / "cisco-c3560.snmprec"
PROCURVE = RECORDINGS / "hpe-procurve-516733-b21.snmprec"


def reading(path: Path) -> snmp.SwitchReading:
    return snmp.parse_reading(snmprec.columns(path))


def test_arista_system_ports_and_speeds() -> None:
    r = reading(ARISTA)
    assert r.sys_name == "DUMSYS-87"  # snmpsim-data's recordings carry anonymised names
    assert r.sys_descr == (
        "Arista Networks EOS version 4.20.5F running on an Arista Networks DCS-7150S-52-CL"
    )  # a hex-encoded OCTET STRING in the recording
    assert r.sys_object_id == "1.3.6.1.4.1.30065.1.3011.7150.3282.52.2745"
    assert r.uptime_s == pytest.approx(16_921_773.70)
    assert len(r.ports) == 59
    ports = {p.name: p for p in r.ports}
    e25 = ports["Ethernet25"]
    assert (e25.index, e25.oper_up, e25.oper_status, e25.speed_mbps) == (25, True, "up", 100)
    assert (e25.in_octets, e25.out_octets, e25.in_errors, e25.counter_bits) == (19292610285, 23556819134, 24066, 64)
    assert ports["Ethernet1"].oper_status == "notPresent"
    assert ports["Ethernet1"].admin_up
    assert ports["Ethernet52"].speed_mbps == 10_000
    assert ports["Port-Channel1"].speed_mbps == 20_000  # ifHighSpeed over ifSpeed
    assert ports["Vlan41"].speed_mbps is None  # ifSpeed 0 and ifHighSpeed 0: unknown, not 0 Mb/s
    assert all(p.counter_bits == 64 for p in r.ports)


def test_arista_entity_sensors_scaled_named_and_kinds() -> None:
    sensors = {s.index: s for s in reading(ARISTA).sensors}
    assert len(sensors) == 95
    assert sensors[100006001] == SensorReading(100006001, "Cpu temp sensor", "temperature", 28.2, "celsius", True)
    # voltsDC, precision 2: 1242 -> 12.42 V
    assert sensors[100006007] == SensorReading(
        100006007, "CpucardPwrCon Rail1 12V standby", "voltage", 12.42, "volts", True
    )
    # milli, precision 2: 509 -> 5.09 mA, given in amperes
    assert sensors[100305211].value == pytest.approx(0.00509)
    assert sensors[100305211].unit == "amperes"
    assert sensors[100305211].kind == "other"
    # a current sensor inside a power supply (ENTITY-MIB containment) is the power supply's
    assert sensors[100711102].kind == "power_supply"
    assert sensors[100711102].value == pytest.approx(0.38)
    # fans whose value is unavailable: no value, and no verdict either way
    fan = sensors[100601111]
    assert (fan.kind, fan.value, fan.ok, fan.unit) == ("fan", None, None, "rpm")
    assert not [s for s in sensors.values() if s.ok is False]


def test_arista_lldp_neighbours_on_named_ports() -> None:
    assert reading(ARISTA).lldp == [
        LldpRemote(47, "Ethernet47", "44:4c:a8:31:3e:df", "Ethernet23", None, "ZJ-BP-Bak-Arista"),
        LldpRemote(48, "Ethernet48", "44:4c:a8:31:3e:df", "Ethernet24", None, "ZJ-BP-Bak-Arista"),
    ]


def test_cisco_ports_32_bit_only_where_the_hc_counters_are_missing() -> None:
    r = reading(CISCO)
    assert (r.sys_name, r.sys_object_id) == ("DUMSYS-04", "1.3.6.1.4.1.9.1.617")
    assert len(r.ports) == 57
    ports = {p.name: p for p in r.ports}
    gi49 = ports["Gi0/49"]
    assert (gi49.index, gi49.speed_mbps, gi49.counter_bits) == (10149, 1000, 64)
    assert (gi49.in_octets, gi49.out_octets) == (1050166720685, 6575276732753)  # ifHCInOctets, not ifInOctets
    null0 = ports["Nu0"]  # Null0 has no HC counters: its 32-bit ones, and ifHighSpeed past ifSpeed's maximum
    assert (null0.counter_bits, null0.in_octets, null0.speed_mbps) == (32, 0, 10_000)
    gi1 = ports["Gi0/1"]
    assert (gi1.admin_up, gi1.oper_up, gi1.oper_status) == (True, False, "down")
    assert ports["Vl2"].in_discards == 12652


def test_cisco_envmon_temperature_fan_and_supply() -> None:
    r = reading(CISCO)
    assert [(s.kind, s.name, s.value, s.unit, s.ok) for s in r.sensors] == [
        ("temperature", "SW#1, Sensor#1, YELLOW", 61.0, "celsius", False),  # state warning(2)
        ("fan", "Switch#1, Fan#1", None, "", True),
        ("power_supply", "Sw1, PS1 Normal, RPS NotExist", None, "", True),
    ]
    assert r.lldp == []


def test_procurve_lldp_mac_ids_and_two_agents_on_one_port() -> None:
    r = reading(PROCURVE)
    assert len(r.ports) == 42
    assert r.sensors == []
    assert r.lldp[0] == LldpRemote(8, "8", "e8:39:35:1a:ca:99", "e8:39:35:1a:ca:99", None, None)
    nexus = [n for n in r.lldp if n.local_port_num == 17]
    assert nexus == [
        LldpRemote(17, "17", "8c:60:4f:19:16:3a", "Eth1/19", "Ethernet1/19", "NWPU-CA-5548-01"),
        LldpRemote(17, "17", "NWPU-CA-5548-01(SSI183706KP)", "Ethernet1/19", None, None),
    ]


def test_missing_tables_read_as_empty() -> None:
    columns = snmprec.columns(CISCO)
    for column in snmp.IF_COLUMNS:
        columns.pop(column, None)
    r = snmp.parse_reading(columns)
    assert r.ports == []
    assert r.lldp == []
    assert snmp.parse_reading({}) == snmp.SwitchReading("", "", "", 0.0, [], [], [])


def test_port_without_names_or_state_is_still_a_port() -> None:
    r = snmp.parse_reading({snmp.IF_IN_OCTETS: {(7,): 10}, snmp.IF_OUT_OCTETS: {(7,): 20}})
    [port] = r.ports
    assert (port.index, port.name, port.oper_status, port.oper_up, port.counter_bits) == (7, "7", "unknown", False, 32)
    assert (port.in_octets, port.out_octets, port.speed_mbps, port.in_errors) == (10, 20, None, None)


@pytest.mark.parametrize(
    ("value", "subtype", "expected"),
    [
        (bytes.fromhex("444ca8313edf"), 4, "44:4c:a8:31:3e:df"),  # macAddress
        (b"Ethernet1/19", 5, "Ethernet1/19"),
        (bytes([1, 10, 0, 0, 1]), 5, "10.0.0.1"),  # networkAddress, IANA family 1
        (bytes([2]) + bytes(15) + bytes([1]), 5, "::1"),
        (b"\x01\x02\xff", 7, "01:02:ff"),  # binary as hex
        (b"", 7, None),
        (None, 4, None),
    ],
)
def test_chassis_ids(value: bytes | None, subtype: int, expected: str | None) -> None:
    assert snmp._lldp_id(value, subtype, snmp.CHASSIS_ID_MAC) == expected


def test_local_port_by_description_and_by_number() -> None:
    ports = snmp.parse_ports({snmp.IF_NAME: {(3,): b"swp3", (9,): b"swp9"}})
    columns: dict[str, dict[snmp.Index, snmp.Value]] = {
        snmp.LLDP_LOC_PORT_ID_SUBTYPE: {(1,): 3, (2,): 7},
        snmp.LLDP_LOC_PORT_ID: {(1,): bytes.fromhex("0c42a1000001"), (2,): b""},
        snmp.LLDP_LOC_PORT_DESC: {(1,): b"swp3", (2,): b""},
    }
    names = {p.name: p.name for p in ports}
    assert snmp._local_port(columns, 1, ports, names) == "swp3"  # the MAC id names nothing; the description does
    assert snmp._local_port(columns, 9, ports, names) == "swp9"  # nothing said: the ifIndex of that number
    assert snmp._local_port(columns, 5, ports, names) is None


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"version": "2c"}, "needs a community"),
        ({"version": "2c", "community": "public", "user": "u"}, "for SNMP version 3"),
        ({"version": "1", "community": "public"}, "must be 2c or 3"),
        ({"version": "3", "community": "public", "user": "u"}, "community is for SNMP v2c"),
        ({"version": "3"}, "needs a user"),
        ({"version": "3", "user": "u", "auth_protocol": "sha"}, "protocol and its key go together"),
        ({"version": "3", "user": "u", "auth_key": "12345678"}, "protocol and its key go together"),
        ({"version": "3", "user": "u", "priv_protocol": "aes", "priv_key": "12345678"}, "needs authentication"),
        ({"version": "3", "user": "u", "auth_protocol": "sha", "auth_key": "short"}, "at least 8"),
        ({"version": "3", "user": "u", "auth_protocol": "sha1", "auth_key": "12345678"}, "unknown SNMP v3 auth"),
        (
            {"version": "3", "user": "u", "auth_protocol": "sha", "auth_key": "12345678", "priv_protocol": "3des",
             "priv_key": "12345678"},
            "unknown SNMP v3 privacy",
        ),
    ],
)  # fmt: skip
def test_bad_credentials_refused(fields: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        SnmpCredential(**fields)  # type: ignore[arg-type]


def test_good_credentials_and_no_secret_in_repr() -> None:
    levels = [
        SnmpCredential("2c", community="s3cret-community"),
        SnmpCredential("3", user="mon"),
        SnmpCredential("3", user="mon", auth_protocol="sha512", auth_key="s3cret-auth"),
        SnmpCredential("3", user="mon", auth_protocol="sha", auth_key="s3cret-auth", priv_protocol="aes256",
                       priv_key="s3cret-priv"),
    ]  # fmt: skip
    assert [c.security_level for c in levels] == ["community", "noAuthNoPriv", "authNoPriv", "authPriv"]
    text = repr(SnmpTarget("leaf01", 161, levels[0])) + "".join(map(repr, levels))
    assert "s3cret" not in text


def test_poll_checks_the_credential_first() -> None:
    credential = object.__new__(SnmpCredential)  # built around the checks, as a stored row could be
    object.__setattr__(credential, "version", "3")
    for name in ("community", "user", "auth_protocol", "auth_key", "priv_protocol", "priv_key"):
        object.__setattr__(credential, name, None)
    with pytest.raises(InvalidInput, match="needs a user"):
        snmp.poll(SnmpTarget("127.0.0.1", 9, credential))


# -- walking columns side by side (what a GETBULK answer adds) ---------------------------------------------
A, B = "1.3.6.1.2.1.2.2.1.2", "1.3.6.1.2.1.2.2.1.8"


def oid(column: str, *index: int) -> tuple[int, ...]:
    return (*snmp._oid_tuple(column), *index)


def test_walk_takes_rows_in_turn_and_ends_each_column_at_its_end() -> None:
    walk = snmp.ColumnWalk([A, B], max_rows=100)
    walk.take([(oid(A, 1), b"eth0"), (oid(B, 1), 1), (oid(A, 2), b"eth1"), (oid(B, 2), 2)])
    assert walk.active == [A, B]
    assert walk.cursors[A] == oid(A, 2)
    walk.take([(oid(B, 1), 1), (oid(B, 3), 7), (oid(B, 9), 1), (oid("1.3.6.1.2.1.2.2.1.9", 1), 0)])
    # A's column ran into B's: A ended; B went on to row 3, then left its column
    assert walk.active == []
    assert walk.rows == {A: {(1,): b"eth0", (2,): b"eth1"}, B: {(1,): 1, (2,): 2, (3,): 7}}


def test_walk_ends_at_end_of_mib_view_and_short_answers() -> None:
    walk = snmp.ColumnWalk([A, B], max_rows=100)
    walk.take([(oid(A, 1), b"eth0"), (oid(B, 1), None)])  # endOfMibView for B
    assert walk.active == [A]
    walk.take([])  # nothing more
    assert walk.active == []


def test_walk_of_a_broken_agent_ends() -> None:
    walk = snmp.ColumnWalk([A], max_rows=100)
    for _ in range(3):  # an agent that answers the same row again and again
        walk.take([(oid(A, 5), b"eth4")] * 10)
        if not walk.active:
            break
    assert walk.active == []
    assert walk.stuck == [A]
    assert walk.rows[A] == {(5,): b"eth4"}


def test_walk_of_an_endless_table_is_cut() -> None:
    walk = snmp.ColumnWalk([A], max_rows=25)
    row = 0
    while walk.active:  # an agent whose table never ends
        walk.take([(oid(A, row + n), b"x") for n in range(1, 11)])
        row += 10
    assert len(walk.rows[A]) == 25
    assert walk.cut == [A]
