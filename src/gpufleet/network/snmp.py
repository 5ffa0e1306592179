"""Switches over SNMP: one poll of one switch, as plain data. The only module that calls pysnmp.

`poll(target)` reads, with GETBULK walks of the columns it needs and nothing else:

- SNMPv2-MIB's system group (sysDescr, sysObjectID, sysUpTime, sysName);
- IF-MIB's ifTable and ifXTable: each port's names, state, speed, octets (the 64-bit HC counters where
  the switch answers them), errors and discards;
- ENTITY-SENSOR-MIB's entPhySensorTable with ENTITY-MIB's names of the sensors (temperatures, fans,
  voltages, power supplies), and on Cisco switches without it CISCO-ENVMON-MIB's temperature, fan and
  supply tables;
- LLDP-MIB's lldpRemTable (who is behind each port) and lldpLocPortTable (which port that is).

pysnmp 7 is asyncio; `poll` runs its calls on a private event loop of its own, with an SNMP engine of its
own (so v3 users with the same name and other keys on two switches never meet), and returns when the
poll is done: callers (the head's switch loop, from a worker thread) get a plain synchronous API. Every
failure reaches the caller as a `GpufleetError`: `Unavailable` for a switch that does not answer (a wrong
v2c community is one: agents drop such requests without a word), `InvalidInput` for a v3 user, key or
protocol the switch refuses, or a view that does not let us read. Walks are bounded: at most `MAX_ROWS`
rows per column, and a column whose OIDs stop increasing ends there, so a broken agent cannot keep a
poll going forever; the whole poll gives up after `MAX_POLL_S`.

OIDs are numeric (no MIB is compiled or loaded at run time); each is named where it is defined.
`parse_reading` turns walked columns into a `SwitchReading` and is pure: the tests feed it real
switches' recordings.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from gpufleet.core.errors import GpufleetError, InvalidInput, Unavailable

log = logging.getLogger(__name__)

AuthProtocol = Literal["sha", "sha256", "sha512", "md5"]
PrivProtocol = Literal["aes", "aes256", "des"]
SensorKind = Literal["temperature", "fan", "power_supply", "voltage", "other"]

MAX_ROWS = 10_000  # rows per column of one walk: a bigger table is cut there (and logged)
MAX_POLL_S = 120.0  # one whole poll of one switch, however many requests it takes
BULK_VARBINDS = 60  # variable bindings asked for in one GETBULK (over all the columns walked at once)
PROBE_USER = "gpufleet-probe"  # the unknown v3 user of the probe that tells a silent agent from a down one
MIN_KEY_LENGTH = 8  # USM: a pass phrase shorter than 8 characters is refused (RFC 3414 section 11.2)


# -- what a poll takes and gives ---------------------------------------------------------------------------
@dataclass(frozen=True)
class SnmpCredential:
    """How to authenticate to one switch: a v2c community, or a v3 user with its protocols and keys
    (none: noAuthNoPriv; authentication: authNoPriv; both: authPriv). Secrets never appear in a repr.

    Raises InvalidInput when built with a combination that cannot work (see `validate`)."""

    version: Literal["2c", "3"] = "2c"
    community: str | None = field(default=None, repr=False)
    user: str | None = None
    auth_protocol: AuthProtocol | None = None
    auth_key: str | None = field(default=None, repr=False)
    priv_protocol: PrivProtocol | None = None
    priv_key: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise InvalidInput, saying what is wrong, for a credential that cannot work: a v2c one
        without a community or with v3 fields, a v3 one with a community, without a user, with a
        protocol and no key (or a key and no protocol), with privacy but no authentication, an unknown
        protocol, or a key shorter than 8 characters."""
        v3_fields = (self.user, self.auth_protocol, self.auth_key, self.priv_protocol, self.priv_key)
        if self.version == "2c":
            if not self.community:
                raise InvalidInput("SNMP v2c needs a community")
            if any(v is not None for v in v3_fields):
                raise InvalidInput("a v3 user, protocols and keys are for SNMP version 3, not 2c")
            return
        if self.version != "3":
            raise InvalidInput(f"SNMP version must be 2c or 3, not {self.version!r}")
        self._validate_v3()

    def _validate_v3(self) -> None:
        if self.community is not None:
            raise InvalidInput("a community is for SNMP v2c; version 3 takes a user and keys")
        if not self.user:
            raise InvalidInput("SNMP v3 needs a user")
        if self.auth_protocol is not None and self.auth_protocol not in _AUTH_PROTOCOLS:
            raise InvalidInput(f"unknown SNMP v3 authentication protocol {self.auth_protocol!r}: one of {_AUTH_NAMES}")
        if self.priv_protocol is not None and self.priv_protocol not in _PRIV_PROTOCOLS:
            raise InvalidInput(f"unknown SNMP v3 privacy protocol {self.priv_protocol!r}: one of {_PRIV_NAMES}")
        if (self.auth_protocol is None) != (self.auth_key is None):
            raise InvalidInput("an SNMP v3 authentication protocol and its key go together")
        if (self.priv_protocol is None) != (self.priv_key is None):
            raise InvalidInput("an SNMP v3 privacy protocol and its key go together")
        if self.priv_protocol is not None and self.auth_protocol is None:
            raise InvalidInput("SNMP v3 privacy (encryption) needs authentication too")
        for what, key in (("authentication", self.auth_key), ("privacy", self.priv_key)):
            if key is not None and len(key) < MIN_KEY_LENGTH:
                raise InvalidInput(f"an SNMP v3 {what} key has at least {MIN_KEY_LENGTH} characters")

    @property
    def security_level(self) -> str:
        """v3's level: noAuthNoPriv, authNoPriv or authPriv (v2c: community)."""
        if self.version == "2c":
            return "community"
        if self.priv_protocol is not None:
            return "authPriv"
        return "authNoPriv" if self.auth_protocol is not None else "noAuthNoPriv"


@dataclass(frozen=True)
class SnmpTarget:
    """One switch's SNMP agent. `timeout_s` and `retries` apply to each request of a poll."""

    host: str
    port: int = 161
    credential: SnmpCredential = field(default_factory=lambda: SnmpCredential("2c", community="public"))
    timeout_s: float = 2.0
    retries: int = 1

    @property
    def where(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True)
class PortReading:
    """One interface (IF-MIB): its ifIndex, names and state, speed in Mb/s, and counters as the switch
    gave them. Octets are ifHCInOctets/ifHCOutOctets (`counter_bits` 64) where both answered, else the
    32-bit ifInOctets/ifOutOctets (`counter_bits` 32); errors and discards are always 32-bit counters.
    None: the switch did not say."""

    index: int
    name: str  # ifName, else ifDescr
    alias: str  # ifAlias: the admin's description of the port ("" where none)
    admin_up: bool
    oper_up: bool
    oper_status: str  # up, down, testing, unknown, dormant, notPresent, lowerLayerDown
    speed_mbps: int | None
    in_octets: int | None
    out_octets: int | None
    in_errors: int | None
    out_errors: int | None
    in_discards: int | None
    out_discards: int | None
    counter_bits: int = 64


@dataclass(frozen=True)
class SensorReading:
    """One sensor: ENTITY-SENSOR-MIB's (value scaled to its unit: celsius, rpm, volts, amperes, watts...)
    or a vendor table's. `ok`: True when the switch says it works, False when it says it failed or is
    out of its range, None when it cannot tell (a sensor whose value is unavailable, an empty slot)."""

    index: int
    name: str
    kind: SensorKind
    value: float | None
    unit: str
    ok: bool | None


@dataclass(frozen=True)
class LldpRemote:
    """One LLDP neighbour the switch sees (LLDP-MIB lldpRemTable). `local_port` is the switch's own port
    it was seen on, by its ifName where it can be matched to one. MAC-typed ids read aa:bb:cc:dd:ee:ff."""

    local_port_num: int
    local_port: str | None
    chassis_id: str | None
    port_id: str | None
    port_description: str | None
    system_name: str | None


@dataclass(frozen=True)
class SwitchReading:
    """What one poll of one switch read. Text is "" where the switch did not answer it."""

    sys_name: str
    sys_descr: str
    sys_object_id: str
    uptime_s: float  # sysUpTime: since the SNMP agent (re)started
    ports: list[PortReading]
    sensors: list[SensorReading]
    lldp: list[LldpRemote]


# -- OIDs -------------------------------------------------------------------------------------------------
# SNMPv2-MIB system group: scalars, read with GET (index .0)
SYS_DESCR = "1.3.6.1.2.1.1.1"  # sysDescr
SYS_OBJECT_ID = "1.3.6.1.2.1.1.2"  # sysObjectID
SYS_UPTIME = "1.3.6.1.2.1.1.3"  # sysUpTime (TimeTicks: hundredths of a second)
SYS_NAME = "1.3.6.1.2.1.1.5"  # sysName
SCALARS = (SYS_DESCR, SYS_OBJECT_ID, SYS_UPTIME, SYS_NAME)

# IF-MIB ifTable (1.3.6.1.2.1.2.2.1), indexed by ifIndex
IF_DESCR = "1.3.6.1.2.1.2.2.1.2"  # ifDescr
IF_SPEED = "1.3.6.1.2.1.2.2.1.5"  # ifSpeed (bits/s, Gauge32: 4294967295 means "see ifHighSpeed")
IF_ADMIN_STATUS = "1.3.6.1.2.1.2.2.1.7"  # ifAdminStatus
IF_OPER_STATUS = "1.3.6.1.2.1.2.2.1.8"  # ifOperStatus
IF_IN_OCTETS = "1.3.6.1.2.1.2.2.1.10"  # ifInOctets (Counter32)
IF_IN_DISCARDS = "1.3.6.1.2.1.2.2.1.13"  # ifInDiscards (Counter32)
IF_IN_ERRORS = "1.3.6.1.2.1.2.2.1.14"  # ifInErrors (Counter32)
IF_OUT_OCTETS = "1.3.6.1.2.1.2.2.1.16"  # ifOutOctets (Counter32)
IF_OUT_DISCARDS = "1.3.6.1.2.1.2.2.1.19"  # ifOutDiscards (Counter32)
IF_OUT_ERRORS = "1.3.6.1.2.1.2.2.1.20"  # ifOutErrors (Counter32)
# IF-MIB ifXTable (1.3.6.1.2.1.31.1.1.1), indexed by ifIndex
IF_NAME = "1.3.6.1.2.1.31.1.1.1.1"  # ifName
IF_HC_IN_OCTETS = "1.3.6.1.2.1.31.1.1.1.6"  # ifHCInOctets (Counter64)
IF_HC_OUT_OCTETS = "1.3.6.1.2.1.31.1.1.1.10"  # ifHCOutOctets (Counter64)
IF_HIGH_SPEED = "1.3.6.1.2.1.31.1.1.1.15"  # ifHighSpeed (Mb/s)
IF_ALIAS = "1.3.6.1.2.1.31.1.1.1.18"  # ifAlias
IF_COLUMNS = (
    IF_DESCR, IF_SPEED, IF_ADMIN_STATUS, IF_OPER_STATUS, IF_IN_OCTETS, IF_IN_DISCARDS, IF_IN_ERRORS,
    IF_OUT_OCTETS, IF_OUT_DISCARDS, IF_OUT_ERRORS,
    IF_NAME, IF_HC_IN_OCTETS, IF_HC_OUT_OCTETS, IF_HIGH_SPEED, IF_ALIAS,
)  # fmt: skip

# ENTITY-SENSOR-MIB entPhySensorTable (1.3.6.1.2.1.99.1.1.1), indexed by entPhysicalIndex
SENSOR_TYPE = "1.3.6.1.2.1.99.1.1.1.1"  # entPhySensorType
SENSOR_SCALE = "1.3.6.1.2.1.99.1.1.1.2"  # entPhySensorScale
SENSOR_PRECISION = "1.3.6.1.2.1.99.1.1.1.3"  # entPhySensorPrecision
SENSOR_VALUE = "1.3.6.1.2.1.99.1.1.1.4"  # entPhySensorValue
SENSOR_OPER_STATUS = "1.3.6.1.2.1.99.1.1.1.5"  # entPhySensorOperStatus
SENSOR_COLUMNS = (SENSOR_TYPE, SENSOR_SCALE, SENSOR_PRECISION, SENSOR_VALUE, SENSOR_OPER_STATUS)
# ENTITY-MIB entPhysicalTable (1.3.6.1.2.1.47.1.1.1.1), indexed by entPhysicalIndex: read where sensors are
ENT_DESCR = "1.3.6.1.2.1.47.1.1.1.1.2"  # entPhysicalDescr
ENT_CONTAINED_IN = "1.3.6.1.2.1.47.1.1.1.1.4"  # entPhysicalContainedIn
ENT_CLASS = "1.3.6.1.2.1.47.1.1.1.1.5"  # entPhysicalClass
ENT_NAME = "1.3.6.1.2.1.47.1.1.1.1.7"  # entPhysicalName
ENTITY_COLUMNS = (ENT_DESCR, ENT_CONTAINED_IN, ENT_CLASS, ENT_NAME)

# CISCO-ENVMON-MIB (1.3.6.1.4.1.9.9.13.1): read on Cisco switches (sysObjectID under 1.3.6.1.4.1.9)
CISCO_ENTERPRISE = "1.3.6.1.4.1.9"
ENVMON_TEMP_DESCR = "1.3.6.1.4.1.9.9.13.1.3.1.2"  # ciscoEnvMonTemperatureStatusDescr
ENVMON_TEMP_VALUE = "1.3.6.1.4.1.9.9.13.1.3.1.3"  # ciscoEnvMonTemperatureStatusValue (celsius)
ENVMON_TEMP_STATE = "1.3.6.1.4.1.9.9.13.1.3.1.6"  # ciscoEnvMonTemperatureState
ENVMON_FAN_DESCR = "1.3.6.1.4.1.9.9.13.1.4.1.2"  # ciscoEnvMonFanStatusDescr
ENVMON_FAN_STATE = "1.3.6.1.4.1.9.9.13.1.4.1.3"  # ciscoEnvMonFanState
ENVMON_SUPPLY_DESCR = "1.3.6.1.4.1.9.9.13.1.5.1.2"  # ciscoEnvMonSupplyStatusDescr
ENVMON_SUPPLY_STATE = "1.3.6.1.4.1.9.9.13.1.5.1.3"  # ciscoEnvMonSupplyState
ENVMON_COLUMNS = (
    ENVMON_TEMP_DESCR, ENVMON_TEMP_VALUE, ENVMON_TEMP_STATE, ENVMON_FAN_DESCR, ENVMON_FAN_STATE,
    ENVMON_SUPPLY_DESCR, ENVMON_SUPPLY_STATE,
)  # fmt: skip

# LLDP-MIB (IEEE 802.1AB-2005, 1.0.8802.1.1.2)
LLDP_LOC_PORT_ID_SUBTYPE = "1.0.8802.1.1.2.1.3.7.1.2"  # lldpLocPortIdSubtype, indexed by lldpLocPortNum
LLDP_LOC_PORT_ID = "1.0.8802.1.1.2.1.3.7.1.3"  # lldpLocPortId
LLDP_LOC_PORT_DESC = "1.0.8802.1.1.2.1.3.7.1.4"  # lldpLocPortDesc
# lldpRemTable, indexed by lldpRemTimeMark, lldpRemLocalPortNum, lldpRemIndex
LLDP_REM_CHASSIS_ID_SUBTYPE = "1.0.8802.1.1.2.1.4.1.1.4"  # lldpRemChassisIdSubtype
LLDP_REM_CHASSIS_ID = "1.0.8802.1.1.2.1.4.1.1.5"  # lldpRemChassisId
LLDP_REM_PORT_ID_SUBTYPE = "1.0.8802.1.1.2.1.4.1.1.6"  # lldpRemPortIdSubtype
LLDP_REM_PORT_ID = "1.0.8802.1.1.2.1.4.1.1.7"  # lldpRemPortId
LLDP_REM_PORT_DESC = "1.0.8802.1.1.2.1.4.1.1.8"  # lldpRemPortDesc
LLDP_REM_SYS_NAME = "1.0.8802.1.1.2.1.4.1.1.9"  # lldpRemSysName
LLDP_COLUMNS = (
    LLDP_LOC_PORT_ID_SUBTYPE, LLDP_LOC_PORT_ID, LLDP_LOC_PORT_DESC,
    LLDP_REM_CHASSIS_ID_SUBTYPE, LLDP_REM_CHASSIS_ID, LLDP_REM_PORT_ID_SUBTYPE, LLDP_REM_PORT_ID,
    LLDP_REM_PORT_DESC, LLDP_REM_SYS_NAME,
)  # fmt: skip

COLUMNS = IF_COLUMNS + SENSOR_COLUMNS + ENTITY_COLUMNS + ENVMON_COLUMNS + LLDP_COLUMNS  # every column poll may walk

# Enumerations
IF_STATUS = {1: "up", 2: "down", 3: "testing", 4: "unknown", 5: "dormant", 6: "notPresent", 7: "lowerLayerDown"}
SPEED_SEE_HIGH_SPEED = 4_294_967_295  # ifSpeed's maximum: the real speed is in ifHighSpeed
# EntitySensorDataType: unit and kind
SENSOR_UNITS = {
    1: "", 2: "", 3: "volts", 4: "volts", 5: "amperes", 6: "watts", 7: "hertz", 8: "celsius", 9: "%RH",
    10: "rpm", 11: "cmm", 12: "", 13: "", 14: "dBm",
}  # fmt: skip
SENSOR_TYPE_KIND: dict[int, SensorKind] = {3: "voltage", 4: "voltage", 8: "temperature", 10: "fan", 11: "fan"}
# EntitySensorDataScale -> power of ten (RFC 3433: exa(14) is 10^18, peta(15) 10^15, as its text says)
SENSOR_SCALE_EXPONENT = {
    1: -24, 2: -21, 3: -18, 4: -15, 5: -12, 6: -9, 7: -6, 8: -3, 9: 0, 10: 3, 11: 6, 12: 9, 13: 12, 14: 18,
    15: 15, 16: 21, 17: 24,
}  # fmt: skip
SENSOR_OK, SENSOR_UNAVAILABLE, SENSOR_NONOPERATIONAL = 1, 2, 3  # EntitySensorStatus
ENT_CLASS_POWER_SUPPLY, ENT_CLASS_FAN = 6, 7  # PhysicalClass
ENVMON_NORMAL, ENVMON_NOT_PRESENT = 1, 5  # CISCO-ENVMON-MIB CiscoEnvMonState
# LLDP-MIB subtypes whose id is a MAC address or a network address; others are text
CHASSIS_ID_MAC, CHASSIS_ID_NETWORK_ADDRESS = 4, 5  # LldpChassisIdSubtype
PORT_ID_MAC, PORT_ID_NETWORK_ADDRESS = 3, 4  # LldpPortIdSubtype

Value = int | bytes | str  # integers (all kinds), octet strings, OIDs (dotted)
Index = tuple[int, ...]
Columns = Mapping[str, Mapping[Index, Value]]  # column OID -> row index -> value


# -- parsing (pure) ---------------------------------------------------------------------------------------
def parse_reading(columns: Columns) -> SwitchReading:
    """The reading that walked `columns` make (scalars as column -> {(0,): value}). Pure: what a
    switch did not answer is left out, never guessed."""
    ports = parse_ports(columns)
    return SwitchReading(
        sys_name=_text(_scalar(columns, SYS_NAME)) or "",
        sys_descr=_text(_scalar(columns, SYS_DESCR)) or "",
        sys_object_id=_oid_text(_scalar(columns, SYS_OBJECT_ID)),
        uptime_s=(_int(_scalar(columns, SYS_UPTIME)) or 0) / 100.0,
        ports=ports,
        sensors=parse_sensors(columns) + parse_envmon(columns),
        lldp=parse_lldp(columns, ports),
    )


def parse_ports(columns: Columns) -> list[PortReading]:
    """IF-MIB's ports, by ifIndex."""
    indexes = sorted({i[0] for c in IF_COLUMNS for i in columns.get(c, {}) if len(i) == 1})
    ports = []
    for index in indexes:

        def get(column: str, row: int = index) -> Value | None:
            return columns.get(column, {}).get((row,))

        hc_in, hc_out = _int(get(IF_HC_IN_OCTETS)), _int(get(IF_HC_OUT_OCTETS))
        wide = hc_in is not None and hc_out is not None
        admin, oper = _int(get(IF_ADMIN_STATUS)), _int(get(IF_OPER_STATUS))
        ports.append(
            PortReading(
                index=index,
                name=_text(get(IF_NAME)) or _text(get(IF_DESCR)) or str(index),
                alias=_text(get(IF_ALIAS)) or "",
                admin_up=admin == 1,
                oper_up=oper == 1,
                oper_status=IF_STATUS.get(oper, f"unknown({oper})") if oper is not None else "unknown",
                speed_mbps=_speed_mbps(_int(get(IF_HIGH_SPEED)), _int(get(IF_SPEED))),
                in_octets=hc_in if wide else _int(get(IF_IN_OCTETS)),
                out_octets=hc_out if wide else _int(get(IF_OUT_OCTETS)),
                in_errors=_int(get(IF_IN_ERRORS)),
                out_errors=_int(get(IF_OUT_ERRORS)),
                in_discards=_int(get(IF_IN_DISCARDS)),
                out_discards=_int(get(IF_OUT_DISCARDS)),
                counter_bits=64 if wide else 32,
            )
        )
    return ports


def _speed_mbps(high_speed: int | None, speed: int | None) -> int | None:
    """ifHighSpeed (Mb/s) where it says something, else ifSpeed (bits/s) in Mb/s; None if unknown (0)."""
    if high_speed:
        return high_speed
    if speed and speed != SPEED_SEE_HIGH_SPEED:
        return round(speed / 1e6) or None
    return None


def parse_sensors(columns: Columns) -> list[SensorReading]:
    """ENTITY-SENSOR-MIB's sensors, named by ENTITY-MIB (entPhysicalName, else entPhysicalDescr)."""
    types = columns.get(SENSOR_TYPE, {})
    sensors = []
    for row in sorted(types):
        if len(row) != 1:
            continue
        index = row[0]
        sensor_type = _int(types[row]) or 0
        raw = _int(columns.get(SENSOR_VALUE, {}).get(row))
        status = _int(columns.get(SENSOR_OPER_STATUS, {}).get(row))
        value = None
        if raw is not None and status != SENSOR_UNAVAILABLE:
            scale = _int(columns.get(SENSOR_SCALE, {}).get(row)) or 9
            precision = _int(columns.get(SENSOR_PRECISION, {}).get(row)) or 0
            value = _scaled(raw, SENSOR_SCALE_EXPONENT.get(scale, 0) - precision)
        ok = {SENSOR_OK: True, SENSOR_NONOPERATIONAL: False}.get(status) if status is not None else None
        name = (
            _text(columns.get(ENT_NAME, {}).get(row)) or _text(columns.get(ENT_DESCR, {}).get(row)) or f"sensor {index}"
        )
        sensors.append(
            SensorReading(
                index=index,
                name=name,
                kind=_sensor_kind(columns, index, sensor_type),
                value=value,
                unit=SENSOR_UNITS.get(sensor_type, ""),
                ok=ok,
            )
        )
    return sensors


def _scaled(raw: int, exponent: int) -> float:
    # round() keeps 28.2 from printing as 28.200000000000003
    return round(raw * 10.0**exponent, max(0, -exponent) + 3)


def _sensor_kind(columns: Columns, index: int, sensor_type: int) -> SensorKind:
    """By the unit where it tells (celsius, rpm, volts); else by what holds the sensor: one inside a
    power supply (ENTITY-MIB containment, up to 3 levels) is the power supply's."""
    kind = SENSOR_TYPE_KIND.get(sensor_type)
    if kind is not None:
        return kind
    classes, parents = columns.get(ENT_CLASS, {}), columns.get(ENT_CONTAINED_IN, {})
    entity = index
    for _ in range(4):
        entity_class = _int(classes.get((entity,)))
        if entity_class == ENT_CLASS_POWER_SUPPLY:
            return "power_supply"
        if entity_class == ENT_CLASS_FAN:
            return "fan"
        parent = _int(parents.get((entity,)))
        if not parent:
            break
        entity = parent
    return "other"


def parse_envmon(columns: Columns) -> list[SensorReading]:
    """CISCO-ENVMON-MIB's temperatures, fans and power supplies (where the switch has the MIB)."""
    tables: tuple[tuple[SensorKind, str, str | None, str, str], ...] = (
        ("temperature", ENVMON_TEMP_DESCR, ENVMON_TEMP_VALUE, ENVMON_TEMP_STATE, "celsius"),
        ("fan", ENVMON_FAN_DESCR, None, ENVMON_FAN_STATE, ""),
        ("power_supply", ENVMON_SUPPLY_DESCR, None, ENVMON_SUPPLY_STATE, ""),
    )
    sensors = []
    for kind, descr_column, value_column, state_column, unit in tables:
        descrs, states = columns.get(descr_column, {}), columns.get(state_column, {})
        for row in sorted(set(descrs) | set(states)):
            if len(row) != 1:
                continue
            state = _int(states.get(row))
            value = _int(columns.get(value_column, {}).get(row)) if value_column else None
            sensors.append(
                SensorReading(
                    index=row[0],
                    name=_text(descrs.get(row)) or f"{kind} {row[0]}",
                    kind=kind,
                    value=float(value) if value is not None else None,
                    unit=unit,
                    ok=None if state is None or state == ENVMON_NOT_PRESENT else state == ENVMON_NORMAL,
                )
            )
    return sensors


def parse_lldp(columns: Columns, ports: Sequence[PortReading]) -> list[LldpRemote]:
    """LLDP-MIB's remote systems, each with the local port it was seen on."""
    by_name = {p.name: p.name for p in ports}
    remotes = []
    systems = columns.get(LLDP_REM_SYS_NAME, {})
    rows = sorted({r for c in LLDP_COLUMNS[3:] for r in columns.get(c, {}) if len(r) == 3})
    for row in rows:
        local_num = row[1]

        def get(column: str, key: Index = row) -> Value | None:
            return columns.get(column, {}).get(key)

        chassis = _lldp_id(get(LLDP_REM_CHASSIS_ID), _int(get(LLDP_REM_CHASSIS_ID_SUBTYPE)), CHASSIS_ID_MAC)
        remotes.append(
            LldpRemote(
                local_port_num=local_num,
                local_port=_local_port(columns, local_num, ports, by_name),
                chassis_id=chassis,
                port_id=_lldp_id(get(LLDP_REM_PORT_ID), _int(get(LLDP_REM_PORT_ID_SUBTYPE)), PORT_ID_MAC),
                port_description=_text(get(LLDP_REM_PORT_DESC)) or None,
                system_name=_text(systems.get(row)) or None,
            )
        )
    return remotes


def _local_port(columns: Columns, num: int, ports: Sequence[PortReading], by_name: Mapping[str, str]) -> str | None:
    """The switch's port for lldpLocPortNum `num`: its lldpLocPortId or lldpLocPortDesc where one names
    an interface (ifName or ifDescr-derived name); else what they say; else the port whose ifIndex is
    the number (the usual numbering); else None."""
    subtype = _int(columns.get(LLDP_LOC_PORT_ID_SUBTYPE, {}).get((num,)))
    said = [
        _lldp_id(columns.get(LLDP_LOC_PORT_ID, {}).get((num,)), subtype, PORT_ID_MAC),
        _text(columns.get(LLDP_LOC_PORT_DESC, {}).get((num,))),
    ]
    for name in said:
        if name and name in by_name:
            return by_name[name]
    descrs = columns.get(IF_DESCR, {})
    for port in ports:
        descr = _text(descrs.get((port.index,)))
        if descr and descr in said:
            return port.name
    same_index = next((p.name for p in ports if p.index == num), None)
    if same_index is not None and not any(said):
        return same_index
    return next((s for s in said if s), same_index)


def _lldp_id(value: Value | None, subtype: int | None, mac_subtype: int) -> str | None:
    """A chassis or port id as people read it: a MAC as aa:bb:cc:dd:ee:ff, a network address as an IP
    address, text as text (binary as hex)."""
    if value is None:
        return None
    raw = value.encode() if isinstance(value, str) else value if isinstance(value, bytes) else str(value).encode()
    if not raw:
        return None
    if subtype == mac_subtype and len(raw) == 6:
        return _hex(raw)
    network_subtype = CHASSIS_ID_NETWORK_ADDRESS if mac_subtype == CHASSIS_ID_MAC else PORT_ID_NETWORK_ADDRESS
    if subtype == network_subtype and len(raw) in (5, 17) and raw[0] in (1, 2):  # IANA family 1 IPv4, 2 IPv6
        return str(ipaddress.ip_address(raw[1:]))
    return _text(raw) if _printable(raw) else _hex(raw)


def _scalar(columns: Columns, column: str) -> Value | None:
    return columns.get(column, {}).get((0,))


def _int(value: Value | None) -> int | None:
    return value if isinstance(value, int) else None


def _printable(raw: bytes) -> bool:
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        return False
    return all(c.isprintable() or c in "\r\n\t" for c in text.rstrip("\x00"))


def _text(value: Value | None) -> str | None:
    """An OCTET STRING as text: UTF-8 (undecodable bytes replaced), trailing NULs and spaces gone."""
    if value is None or isinstance(value, int):
        return None
    text = value if isinstance(value, str) else value.decode(errors="replace")
    return text.rstrip("\x00").strip()


def _hex(raw: bytes) -> str:
    return ":".join(f"{b:02x}" for b in raw)


def _oid_text(value: Value | None) -> str:
    if value is None or isinstance(value, int):
        return ""
    return value if isinstance(value, str) else value.decode(errors="replace")


# -- SNMP (pysnmp, asyncio) -------------------------------------------------------------------------------
def poll(target: SnmpTarget) -> SwitchReading:
    """Poll one switch once: system, ports, sensors and LLDP neighbours. Blocks until done; runs pysnmp
    on a private event loop, so it may be called from any thread that is not running one.

    Raises Unavailable (no answer, a name that does not resolve, a poll longer than MAX_POLL_S: each
    naming host:port) or InvalidInput (a v3 user, key or protocol the switch refuses; a view that denies
    the read)."""
    target.credential.validate()
    # A runner with a loop factory never installs its loop as the thread's; closing it cancels what is
    # left and runs the transports' last callbacks, so no socket outlives the poll.
    with asyncio.Runner(loop_factory=asyncio.new_event_loop) as runner:
        return runner.run(_poll_within_limit(target))


async def _poll_within_limit(target: SnmpTarget) -> SwitchReading:
    try:
        return await asyncio.wait_for(_poll(target), MAX_POLL_S)
    except TimeoutError:
        raise Unavailable(f"SNMP agent {target.where}: the poll took longer than {MAX_POLL_S:g} s") from None


async def _poll(target: SnmpTarget) -> SwitchReading:
    session = _Session(target)
    try:
        await session.open()
        columns: dict[str, dict[Index, Value]] = dict(await session.get_scalars(SCALARS))
        columns.update(await session.walk(IF_COLUMNS))
        sensors = await session.walk(SENSOR_COLUMNS, optional=True)
        columns.update(sensors)
        if any(sensors.values()):
            columns.update(await session.walk(ENTITY_COLUMNS, optional=True))
        if _oid_text(_scalar(columns, SYS_OBJECT_ID)).startswith(CISCO_ENTERPRISE + "."):
            columns.update(await session.walk(ENVMON_COLUMNS, optional=True))
        columns.update(await session.walk(LLDP_COLUMNS, optional=True))
    finally:
        await session.close()
    return parse_reading(columns)


class ColumnWalk:
    """Walking table columns side by side with GETBULK, as data: which OID to ask for next in each column
    still `active`, and what each answer adds. A GETBULK answer holds the columns asked for in turn, row
    after row (RFC 3416 4.2.3); a column ends where its answer leaves its subtree (or the MIB view), where
    its OIDs stop increasing (`stuck`: a broken agent), at `max_rows` rows (`cut`), or where the answer
    stops short of it. Each answer so either moves a column on or ends it: a walk always ends."""

    def __init__(self, columns: Sequence[str], max_rows: int) -> None:
        self.prefixes = {c: _oid_tuple(c) for c in columns}
        self.cursors = dict(self.prefixes)  # the last OID read in each column
        self.rows: dict[str, dict[Index, Value]] = {c: {} for c in columns}
        self.active = list(columns)
        self.max_rows = max_rows
        self.stuck: list[str] = []
        self.cut: list[str] = []

    def take(self, answer: Sequence[tuple[Index, Value | None]]) -> None:
        """One GETBULK answer to the request for `active` (None: noSuchObject, endOfMibView...)."""
        ended: set[str] = set()
        for position, (oid, value) in enumerate(answer):
            column = self.active[position % len(self.active)]
            if column in ended:
                continue
            prefix = self.prefixes[column]
            if value is None or oid[: len(prefix)] != prefix or len(oid) == len(prefix):
                ended.add(column)  # past the column, or endOfMibView
            elif oid <= self.cursors[column]:
                self.stuck.append(column)
                ended.add(column)
            else:
                self.cursors[column] = oid
                self.rows[column][oid[len(prefix) :]] = value
                if len(self.rows[column]) >= self.max_rows:
                    self.cut.append(column)
                    ended.add(column)
        ended.update(self.active[len(answer) :])  # an agent that answers short has nothing more
        self.active = [c for c in self.active if c not in ended]


class _PduError(Exception):
    """The agent answered a request with an error status (other than the ones the poll maps itself)."""


class _Session:
    """One poll's SNMP engine, credential and transport; requests and walks on them."""

    def __init__(self, target: SnmpTarget) -> None:
        self.target = target
        self.engine: Any = None
        self.auth: Any = None
        self.transport: Any = None

    async def open(self) -> None:
        hlapi = _hlapi()
        target = self.target
        self.engine = hlapi.SnmpEngine()
        self.auth = _auth_data(target.credential)
        try:
            self.transport = await hlapi.UdpTransportTarget.create(
                (target.host, target.port), timeout=target.timeout_s, retries=target.retries
            )
        except _pysnmp_error() as exc:
            raise Unavailable(f"SNMP agent {target.where}: {_first_line(exc)}") from None

    async def close(self) -> None:
        if self.engine is not None:
            self.engine.close_dispatcher()
            await asyncio.sleep(0)  # the transports close in callbacks of this loop

    async def get_scalars(self, scalars: Iterable[str]) -> dict[str, dict[Index, Value]]:
        """GET each scalar's instance .0; what the agent lacks is left out. As the poll's first request,
        a silence is looked into (`_silence`)."""
        hlapi = _hlapi()
        names = [hlapi.ObjectType(hlapi.ObjectIdentity(f"{s}.0")) for s in scalars]
        try:
            answer = await self._request(hlapi.get_cmd, names)
        except _Silence as silence:
            raise await self._silence(silence) from None
        found: dict[str, dict[Index, Value]] = {}
        for oid, value in answer:
            plain = _plain(value)
            if plain is not None and oid[-1] == 0:
                found[".".join(map(str, oid[:-1]))] = {(0,): plain}
        return found

    async def _silence(self, silence: _Silence) -> GpufleetError:
        """Why the agent did not answer our first request: where it answers an SNMPv3 probe (a request
        from an unknown user, which agents answer with a report), it is up and refuses our credential
        without a word, as agents do with a wrong v2c community or a v3 privacy key they cannot decrypt
        with (InvalidInput); where it does not, it is unreachable or down (Unavailable)."""
        hlapi = _hlapi()
        target = self.target
        try:
            probe = await hlapi.UdpTransportTarget.create(
                (target.host, target.port), timeout=target.timeout_s, retries=0
            )
            answer = await hlapi.get_cmd(
                self.engine,
                hlapi.UsmUserData(PROBE_USER),
                probe,
                hlapi.ContextData(),
                hlapi.ObjectType(hlapi.ObjectIdentity(f"{SYS_UPTIME}.0")),
                lookupMib=False,
            )
        except _pysnmp_error():
            return silence.unavailable
        if type(answer[0]).__name__ == "RequestTimedOut":
            return silence.unavailable
        if target.credential.version == "2c":
            what = "not to this v2c community (a wrong community, or one this host may not use)"
        else:
            what = "not to this v3 user's requests (a wrong privacy key or protocol?)"
        return InvalidInput(f"SNMP agent {target.where} answers SNMP but {what}")

    async def walk(self, columns: Sequence[str], *, optional: bool = False) -> dict[str, dict[Index, Value]]:
        """Walk `columns` side by side with GETBULK, each to its end, at most MAX_ROWS rows each. Where
        `optional`, an agent that answers with an error status reads as not having the columns."""
        try:
            return await self._walk(columns)
        except _Silence as silence:  # it answered the poll's first request: no need to wonder why
            raise silence.unavailable from None
        except _PduError as exc:
            if not optional:
                raise Unavailable(f"SNMP agent {self.target.where}: {exc}") from None
            log.debug("%s: %s: read as absent", self.target.where, exc)
            return {c: {} for c in columns}

    async def _walk(self, columns: Sequence[str]) -> dict[str, dict[Index, Value]]:
        hlapi = _hlapi()
        walk = ColumnWalk(columns, MAX_ROWS)
        repetitions = max(1, BULK_VARBINDS // len(walk.active))
        while walk.active:
            names = [hlapi.ObjectType(hlapi.ObjectIdentity(walk.cursors[c])) for c in walk.active]
            try:
                answer = await self._request(hlapi.bulk_cmd, names, bulk=repetitions)
            except _TooBig:
                if repetitions == 1:
                    raise _PduError("tooBig for a single row") from None
                repetitions = max(1, repetitions // 2)
                continue
            walk.take([(oid, _plain(value)) for oid, value in answer])
            repetitions = max(1, BULK_VARBINDS // max(1, len(walk.active)))
        if walk.stuck:
            log.warning("%s: OIDs stopped increasing in %s: read up to there", self.target.where, ", ".join(walk.stuck))
        if walk.cut:
            log.warning("%s: %s cut at %d rows each", self.target.where, ", ".join(walk.cut), MAX_ROWS)
        return walk.rows

    async def _request(self, command: Any, names: list[Any], bulk: int | None = None) -> list[tuple[Index, Any]]:
        """Send one GET (or GETBULK with `bulk` repetitions); the answer's (OID, value) pairs. Maps the
        failures: Unavailable, InvalidInput, _TooBig, _PduError."""
        hlapi = _hlapi()
        args = (self.engine, self.auth, self.transport, hlapi.ContextData())
        try:
            if bulk is None:
                indication, status, index, var_binds = await command(*args, *names, lookupMib=False)
            else:
                indication, status, index, var_binds = await command(*args, 0, bulk, *names, lookupMib=False)
        except _pysnmp_error() as exc:
            raise Unavailable(f"SNMP agent {self.target.where}: {_first_line(exc)}") from None
        if indication:
            raise _indication_error(self.target, indication)
        if status:
            name = status.prettyPrint() if hasattr(status, "prettyPrint") else str(status)
            if name == "tooBig":
                raise _TooBig
            if name in ("authorizationError", "noAccess"):
                raise InvalidInput(f"SNMP agent {self.target.where} refused the read: {name}")
            raise _PduError(f"error status {name} at variable {int(index)}")
        return [(tuple(int(x) for x in oid), value) for oid, value in var_binds]


class _TooBig(Exception):
    """The agent said tooBig: ask for fewer rows at a time."""


class _Silence(Exception):
    """A request timed out; `unavailable` says so to the caller, unless a probe finds out why."""

    def __init__(self, unavailable: Unavailable) -> None:
        super().__init__(str(unavailable))
        self.unavailable = unavailable


# pysnmp's error indications that mean the switch refused who we are (v3 user, keys, protocols)
_REFUSALS = {
    "UnknownUserName": "unknown SNMP v3 user",
    "WrongDigest": "wrong SNMP v3 authentication key or protocol",
    "DecryptionError": "wrong SNMP v3 privacy key or protocol",
    "UnsupportedSecurityLevel": "the SNMP v3 user does not allow this security level",
    "UnknownSecurityName": "unknown SNMP v3 security name",
    "AuthenticationFailure": "SNMP authentication failed",
    "AuthenticationError": "SNMP authentication failed",
    "UnknownCommunityName": "unknown SNMP community",
    "NoSuchView": "no SNMP view for this user",
    "NoAccessEntry": "no SNMP access for this user",
    "NotInView": "not in the user's SNMP view",
    "NoGroupName": "the SNMP v3 user has no group",
}


def _indication_error(target: SnmpTarget, indication: Any) -> Exception:
    kind = type(indication).__name__
    if kind in _REFUSALS:
        what = f"{_REFUSALS[kind]} ({indication})"
        return InvalidInput(f"SNMP agent {target.where} refused the credential: {what}")
    if kind == "RequestTimedOut":
        tries = target.retries + 1
        return _Silence(
            Unavailable(f"SNMP agent {target.where} did not answer ({tries} tries, {target.timeout_s:g} s each)")
        )
    return Unavailable(f"SNMP agent {target.where}: {indication}")


def _auth_data(credential: SnmpCredential) -> Any:
    hlapi = _hlapi()
    if credential.version == "2c":
        return hlapi.CommunityData(credential.community, mpModel=1)
    auth = _AUTH_PROTOCOLS.get(credential.auth_protocol or "", "USM_AUTH_NONE")
    priv = _PRIV_PROTOCOLS.get(credential.priv_protocol or "", "USM_PRIV_NONE")
    return hlapi.UsmUserData(
        credential.user,
        authKey=credential.auth_key,
        privKey=credential.priv_key,
        authProtocol=getattr(hlapi, auth),
        privProtocol=getattr(hlapi, priv),
    )


# our names -> pysnmp's constants (pysnmp.hlapi.v3arch.asyncio)
_AUTH_PROTOCOLS = {
    "md5": "USM_AUTH_HMAC96_MD5",
    "sha": "USM_AUTH_HMAC96_SHA",
    "sha256": "USM_AUTH_HMAC192_SHA256",
    "sha512": "USM_AUTH_HMAC384_SHA512",
}
# aes256 is draft-blumenthal-aes-usm's key extension, as Net-SNMP's AES-256 (and most agents) do it
_PRIV_PROTOCOLS = {
    "des": "USM_PRIV_CBC56_DES",
    "aes": "USM_PRIV_CFB128_AES",
    "aes256": "USM_PRIV_CFB256_AES_BLUMENTHAL",
}
_AUTH_NAMES = ", ".join(sorted(_AUTH_PROTOCOLS))
_PRIV_NAMES = ", ".join(sorted(_PRIV_PROTOCOLS))


def _plain(value: Any) -> Value | None:
    """A value as pysnmp decoded it (pyasn1 types) as int, bytes or a dotted OID; None for noSuchObject,
    noSuchInstance and endOfMibView (NULLs)."""
    univ = _univ()
    if isinstance(value, univ.Null):
        return None
    if isinstance(value, univ.ObjectIdentifier):
        return ".".join(str(x) for x in value)
    if isinstance(value, univ.OctetString):  # IpAddress, Opaque and BITS too
        return bytes(value)
    if isinstance(value, univ.Integer):  # Integer32, Counter32/64, Gauge32, TimeTicks
        return int(value)
    return None


def _oid_tuple(oid: str) -> Index:
    return tuple(int(x) for x in oid.split("."))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# pysnmp is imported on first use (importing this module for its dataclasses costs nothing), and it ships
# no type information (no py.typed): what comes from it is Any here, and checked by the tests.
@functools.cache
def _hlapi() -> Any:
    import pysnmp.hlapi.v3arch.asyncio as hlapi  # type: ignore[import-untyped]

    return hlapi


@functools.cache
def _univ() -> Any:
    from pyasn1.type import univ

    return univ


@functools.cache
def _pysnmp_error() -> type[Exception]:
    from pysnmp.error import PySnmpError  # type: ignore[import-untyped]

    return cast("type[Exception]", PySnmpError)
