"""Switches in the head (network.service): registered with sealed secrets, each poll recorded, the alerts a
poll fires and resolves (a port that was up going down, errors rising, a slow link, a switch that does not
answer, a sensor not ok), each naming switch, port and the node behind it, and the topology joined from the
switch's LLDP and the nodes' own. Readings here are built by hand; tests/network/test_switches_e2e.py polls
real SNMP agents."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.core.clock import FakeClock
from gpufleet.core.credentials import CredentialBox
from gpufleet.core.db import transaction
from gpufleet.core.errors import Conflict
from gpufleet.inventory import service as inventory
from gpufleet.inventory.models import Node
from gpufleet.inventory.schemas import NodeSettings
from gpufleet.monitoring.models import Alert
from gpufleet.network import service as network
from gpufleet.network.models import Switch
from gpufleet.network.prometheus import switch_metrics
from gpufleet.network.schemas import SwitchIn
from gpufleet.network.snmp import LldpRemote, PortReading, SensorReading, SwitchReading
from gpufleet.protocol.topology import LinkNeighbor

BOX = CredentialBox.generate()


def port(index: int, name: str, *, up: bool = True, admin: bool = True, speed: int = 100_000) -> PortReading:
    return PortReading(
        index=index,
        name=name,
        alias="",
        admin_up=admin,
        oper_up=up,
        oper_status="up" if up else "down",
        speed_mbps=speed,
        in_octets=1000 * index,
        out_octets=2000 * index,
        in_errors=0,
        out_errors=0,
        in_discards=0,
        out_discards=0,
        counter_bits=64,
    )


def reading(
    *ports: PortReading, lldp: tuple[LldpRemote, ...] = (), sensors: tuple[SensorReading, ...] = ()
) -> SwitchReading:
    return SwitchReading(
        sys_name="leaf01.example.org",
        sys_descr="Arista Networks EOS version 4.28",
        sys_object_id="1.3.6.1.4.1.30065.1.3011.7280",
        uptime_s=86_400.0,
        ports=list(ports),
        sensors=list(sensors),
        lldp=list(lldp),
    )


def remote(local: str, num: int, system: str, port_id: str) -> LldpRemote:
    return LldpRemote(
        local_port_num=num,
        local_port=local,
        chassis_id="0c:42:a1:00:00:01",
        port_id=port_id,
        port_description=port_id,
        system_name=system,
    )


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    """SQLite only: the queries are plain; the API test of switches runs both databases."""
    return f"sqlite:///{tmp_path / 'gpufleet.db'}"


@pytest.fixture
def switch(sessions: sessionmaker[Session], clock: FakeClock) -> int:
    with transaction(sessions) as s:
        inventory.add_nodes(s, clock, ["gpu001", "gpu002"], NodeSettings())
        spec = SwitchIn(name="leaf01", address="10.0.0.2", community="s3cret-community", expected_speed_mbps=100_000)
        return network.add_switch(s, clock, BOX, spec).id


def record(sessions: sessionmaker[Session], clock: FakeClock, switch_id: int, poll: network.Poll) -> list[Alert]:
    with transaction(sessions) as s:
        fired = network.record_poll(s, clock, switch_id, poll)
        s.expunge_all()
        return fired


def firing(sessions: sessionmaker[Session]) -> dict[str, Alert]:
    with transaction(sessions, readonly=True) as s:
        found = {
            f"{a.rule} {a.labels.get('port', '')}".strip(): a
            for a in s.scalars(select(Alert).where(Alert.status == "firing"))
        }
        s.expunge_all()
        return found


def test_secrets_are_sealed_and_never_shown(sessions: sessionmaker[Session], clock: FakeClock, switch: int) -> None:
    with transaction(sessions, readonly=True) as s:
        row = s.get_one(Switch, switch)
        assert "s3cret-community" not in row.secrets_sealed
        assert json.loads(BOX.open(row.secrets_sealed)) == {"community": "s3cret-community"}
        shown = network.list_switches(s)[0].model_dump_json()
        assert "s3cret" not in shown
        target = network.target(row, BOX, 1.5, 0)
        assert (target.host, target.port, target.credential.community) == ("10.0.0.2", 161, "s3cret-community")
        with pytest.raises(Conflict, match="key file"):
            network.target(row, CredentialBox.generate(), 1.5, 0)
    with transaction(sessions) as s, pytest.raises(Conflict, match="exists"):
        network.add_switch(s, clock, BOX, SwitchIn(name="leaf01", address="10.0.0.3", community="x"))


@pytest.mark.parametrize(
    "spec",
    [
        {"version": "2c"},
        {"version": "2c", "community": "c", "v3_user": "u"},
        {"version": "3", "community": "c"},
        {"version": "3"},
        {"version": "3", "v3_user": "u", "v3_auth_protocol": "sha"},
        {"version": "3", "v3_user": "u", "v3_priv_protocol": "aes", "v3_priv_key": "12345678"},
        {"version": "2c", "community": "c", "address": "10.0.0.1; rm -rf /"},
    ],
)
def test_a_credential_that_cannot_work_is_refused(spec: dict[str, str]) -> None:
    with pytest.raises(ValidationError):
        SwitchIn.model_validate({"name": "leaf02", "address": "10.0.0.1"} | spec)


def test_a_port_that_was_up_going_down_fires_naming_the_switch_port_and_node(
    sessions: sessionmaker[Session], clock: FakeClock, switch: int
) -> None:
    lldp = (remote("Ethernet1", 1, "gpu001.example.org", "eth0"),)
    unused = port(3, "Ethernet3", up=False)  # down at its first poll: an empty port, not an alert
    assert record(sessions, clock, switch, network.Poll(reading(port(1, "Ethernet1"), unused, lldp=lldp))) == []
    clock.advance(30)
    fired = record(sessions, clock, switch, network.Poll(reading(port(1, "Ethernet1", up=False), unused, lldp=lldp)))
    assert [(a.rule, a.node_name, a.labels["port"], a.labels["behind"]) for a in fired] == [
        ("SwitchPortDown", "leaf01", "Ethernet1", "gpu001")
    ]
    assert fired[0].summary == "switch leaf01 port Ethernet1 (node gpu001 eth0) went down"
    with transaction(sessions, readonly=True) as s:
        node = s.scalar(select(Node).where(Node.name == "gpu001"))
        assert node is not None
        assert node.labels == {"switch": "leaf01"}  # the scheduler's topology label
        assert fired[0].node_id == node.id
        detail = network.switch_detail(s, "leaf01")
        assert [(p.name, p.oper_status, p.node) for p in detail.ports] == [
            ("Ethernet1", "down", "gpu001"),
            ("Ethernet3", "down", None),
        ]
    clock.advance(30)
    resolved = record(sessions, clock, switch, network.Poll(reading(port(1, "Ethernet1"), unused, lldp=lldp)))
    assert [(a.rule, a.status) for a in resolved] == [("SwitchPortDown", "resolved")]
    clock.advance(30)  # shut by an admin: not an alert
    shut = port(1, "Ethernet1", up=False, admin=False)
    assert record(sessions, clock, switch, network.Poll(reading(shut, unused, lldp=lldp))) == []


def test_errors_rising_fire_once_and_resolve_after_a_quiet_spell(
    sessions: sessionmaker[Session], clock: FakeClock, switch: int
) -> None:
    ports = reading(port(1, "Ethernet1"), port(2, "Ethernet2"))
    record(sessions, clock, switch, network.Poll(ports))
    rates = {1: {"in_bps": 8e9, "out_bps": 1e9, "in_errors_per_s": 0.5, "out_errors_per_s": 0.0}, 2: {"in_bps": 1.0}}
    for _ in range(3):  # still rising: one alert, its summary kept up to date
        clock.advance(30)
        record(sessions, clock, switch, network.Poll(ports, rates=rates))
    assert list(firing(sessions)) == ["SwitchPortErrors Ethernet1"]
    assert (
        firing(sessions)["SwitchPortErrors Ethernet1"].summary == "switch leaf01 port Ethernet1: errors rising, 0.5/s"
    )
    quiet = {1: {"in_bps": 8e9, "in_errors_per_s": 0.0, "out_errors_per_s": 0.0}}
    clock.advance(30)
    record(sessions, clock, switch, network.Poll(ports, rates=quiet))
    assert list(firing(sessions)) == ["SwitchPortErrors Ethernet1"]  # not yet quiet for switch_error_quiet_s
    clock.advance(300)
    record(sessions, clock, switch, network.Poll(ports, rates=quiet))
    assert firing(sessions) == {}


def test_a_slow_link_to_a_node_and_a_failed_sensor_fire(
    sessions: sessionmaker[Session], clock: FakeClock, switch: int
) -> None:
    psu = SensorReading(index=7, name="PSU2", kind="power_supply", value=None, unit="", ok=False)
    hot = SensorReading(index=8, name="Inlet", kind="temperature", value=31.5, unit="C", ok=True)
    lldp = (remote("Ethernet2", 2, "gpu002", "ens1f0"),)
    slow = reading(
        port(1, "Ethernet1", speed=25_000), port(2, "Ethernet2", speed=25_000), lldp=lldp, sensors=(psu, hot)
    )
    record(sessions, clock, switch, network.Poll(slow))
    found = firing(sessions)
    # Ethernet1 runs slow too, but nothing is known behind it: an uplink or an empty port, not a node's link.
    assert sorted(found) == ["SwitchPortSlow Ethernet2", "SwitchSensor"]
    assert found["SwitchPortSlow Ethernet2"].summary == (
        "switch leaf01 port Ethernet2 (node gpu002 ens1f0) runs at 25000 Mb/s, below the expected 100000 Mb/s"
    )
    assert found["SwitchSensor"].summary == "switch leaf01: power_supply sensor PSU2 is not ok"


def test_an_unreachable_switch_fires_and_a_good_poll_resolves_it(
    sessions: sessionmaker[Session], clock: FakeClock, switch: int
) -> None:
    record(sessions, clock, switch, network.Poll(None, "SNMP: 10.0.0.2:161 did not answer within 2 s"))
    assert firing(sessions)["SwitchUnreachable"].summary == "SNMP: 10.0.0.2:161 did not answer within 2 s"
    with transaction(sessions, readonly=True) as s:
        assert network.list_switches(s)[0].last_error == "SNMP: 10.0.0.2:161 did not answer within 2 s"
    record(sessions, clock, switch, network.Poll(reading(port(1, "Ethernet1"))))
    assert firing(sessions) == {}


def test_the_nodes_own_lldp_finds_it_behind_a_port_and_an_admins_label_stays(
    sessions: sessionmaker[Session], clock: FakeClock, switch: int
) -> None:
    with transaction(sessions) as s:
        gpu001, gpu002 = (s.scalar(select(Node.id).where(Node.name == n)) for n in ("gpu001", "gpu002"))
        assert gpu001 is not None
        assert gpu002 is not None
        s.get_one(Node, gpu002).labels = {"switch": "rack7"}  # an admin's, naming no registered switch
        seen = LinkNeighbor(
            local_interface="eth0", chassis_id="0c:42:a1:00:00:01", system_name="leaf01", port_id="Ethernet1"
        )
        network.record_neighbors(s, clock, gpu001, [seen])
        moved = seen.model_copy(update={"local_interface": "eth1", "port_id": "Ethernet2"})
        network.record_neighbors(s, clock, gpu002, [moved])
    record(sessions, clock, switch, network.Poll(reading(port(1, "Ethernet1"), port(2, "Ethernet2"))))
    with transaction(sessions, readonly=True) as s:
        assert [(p.name, p.node, p.node_interface) for p in network.switch_detail(s, "leaf01").ports] == [
            ("Ethernet1", "gpu001", "eth0"),
            ("Ethernet2", "gpu002", "eth1"),
        ]
        assert s.get_one(Node, gpu001).labels == {"switch": "leaf01"}
        assert s.get_one(Node, gpu002).labels == {"switch": "rack7"}
        links = network.node_links(s, gpu001)
        assert [(k.interface, k.switch, k.switch_port, k.seen_by) for k in links] == [
            ("eth0", "leaf01", "Ethernet1", ["switch", "node"])
        ]


def test_the_ports_are_exposed_as_snmp_exporter_names_them(
    sessions: sessionmaker[Session], clock: FakeClock, switch: int
) -> None:
    lldp = (remote("Ethernet1", 1, "gpu001", "eth0"),)
    narrow = replace(port(2, "Ethernet2", up=False), counter_bits=32)
    record(sessions, clock, switch, network.Poll(reading(port(1, "Ethernet1"), narrow, lldp=lldp)))
    with transaction(sessions, readonly=True) as s:
        families = {f.name: f for f in switch_metrics(s)}
    assert set(families) >= {"ifHCInOctets", "ifInOctets", "ifOperStatus", "ifAdminStatus", "ifHighSpeed", "sysUpTime"}
    samples = {
        (f.name, sm.labels["ifName"]): (sm.value, sm.labels)
        for f in families.values()
        for sm in f.samples
        if "ifName" in sm.labels
    }
    assert samples[("ifHCInOctets", "Ethernet1")][0] == 1000
    assert samples[("ifHCInOctets", "Ethernet1")][1]["node"] == "gpu001"
    assert samples[("ifInOctets", "Ethernet2")][0] == 2000
    assert samples[("ifOperStatus", "Ethernet2")][0] == 2
    assert families["ifHCInOctets"].type == "counter"
    assert families["sysUpTime"].samples[0].value == 8_640_000  # hundredths, as SNMPv2-MIB counts
