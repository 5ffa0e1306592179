"""Real SNMP agents for the switch tests: scripts/services/snmp.sh started once per xdist worker, on ports
of its own, with snmpsim serving real switches' recordings (tests/fixtures/snmp, one v2c community per
recording, named as its file) and Debian's snmpd serving this machine's interfaces (v2c and v3), with a veth
pair whose far end sits in a network namespace (as root).

`snmp_agents` is the session's pair; `snmpsim_recordings` edits what snmpsim serves (a counter, an
ifOperStatus, sysUpTime) and puts every recording back after the test; `snmpd_link` is the veth pair, its far
end brought back up after the test. Where the agents cannot be had, the tests that need them skip saying why
(a failure under GPUFLEET_REQUIRE_SERVICES=1).
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import pytest

from gpufleet.network.snmp import SnmpCredential, SnmpTarget
from tests.network import snmprec
from tests.services import SCRIPTS, install_tools, need

SCRIPT = SCRIPTS / "snmp.sh"
SNMPSIM_PORT = 18700  # + 2 * the xdist worker's index; snmpd on the next port
T = TypeVar("T")


def _worker_index(worker_id: str) -> int:
    return int(worker_id[2:]) if worker_id.startswith("gw") else 0


def _service(command: str, env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), command],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, **env},
    )


@dataclass(frozen=True)
class SnmpLink:
    """The veth pair snmpd counts: `name` here (an interface of snmpd's), `peer` in namespace `netns`."""

    name: str
    netns: str
    peer: str
    address: str
    peer_address: str

    def set_peer(self, up: bool) -> None:
        """Bring the far end down (the near end's ifOperStatus goes down, as with a pulled cable) or up."""
        state = "up" if up else "down"
        subprocess.run(["ip", "-n", self.netns, "link", "set", self.peer, state], check=True, timeout=30)

    def send(self, datagrams: int, size: int = 1000) -> None:
        """UDP datagrams to the far end's discard port: octets out of `name`, and (its ICMP answers) in."""
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            for _ in range(datagrams):
                sock.sendto(b"\x00" * size, (self.peer_address, 9))


@dataclass(frozen=True)
class SnmpAgents:
    """What snmp.sh's env file says: where snmpsim and snmpd listen and how to reach them."""

    snmpsim_port: int
    communities: tuple[str, ...]  # snmpsim's: one per recording
    recordings: Path  # the copies snmpsim serves, <community>.snmprec
    snmpd_port: int
    snmpd_community: str
    v3: Mapping[str, SnmpCredential]  # "sha" (SHA, AES) and "sha512" (SHA-512, AES-256) users of snmpd
    link: SnmpLink | None  # None where the veth pair could not be made (not root)
    host: str = "127.0.0.1"
    service_env: Mapping[str, str] = field(default_factory=dict, repr=False)

    @classmethod
    def from_env_file(cls, path: Path, service_env: Mapping[str, str]) -> SnmpAgents:
        values = dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)

        def user(prefix: str) -> SnmpCredential:
            return SnmpCredential(
                "3",
                user=values[f"{prefix}_USER"],
                auth_protocol=values[f"{prefix}_AUTH_PROTOCOL"],  # type: ignore[arg-type]
                auth_key=values[f"{prefix}_AUTH_KEY"],
                priv_protocol=values[f"{prefix}_PRIV_PROTOCOL"],  # type: ignore[arg-type]
                priv_key=values[f"{prefix}_PRIV_KEY"],
            )

        link = None
        if values.get("GPUFLEET_SNMPD_LINK"):
            link = SnmpLink(
                values["GPUFLEET_SNMPD_LINK"],
                values["GPUFLEET_SNMPD_LINK_NETNS"],
                values["GPUFLEET_SNMPD_LINK_PEER"],
                values["GPUFLEET_SNMPD_LINK_ADDRESS"],
                values["GPUFLEET_SNMPD_LINK_PEER_ADDRESS"],
            )
        return cls(
            snmpsim_port=int(values["GPUFLEET_SNMPSIM_PORT"]),
            communities=tuple(values["GPUFLEET_SNMPSIM_COMMUNITIES"].split(",")),
            recordings=Path(values["GPUFLEET_SNMPSIM_DATA"]),
            snmpd_port=int(values["GPUFLEET_SNMPD_PORT"]),
            snmpd_community=values["GPUFLEET_SNMPD_COMMUNITY"],
            v3={"sha": user("GPUFLEET_SNMPD_V3"), "sha512": user("GPUFLEET_SNMPD_V3_STRONG")},
            link=link,
            service_env=dict(service_env),
        )

    def snmpsim(self, community: str, **options: float) -> SnmpTarget:
        """A target for the recording `community` (its file name without .snmprec)."""
        assert community in self.communities, f"snmpsim serves {self.communities}"
        return SnmpTarget(self.host, self.snmpsim_port, SnmpCredential("2c", community=community), **options)  # type: ignore[arg-type]

    def snmpd(self, credential: str | SnmpCredential = "2c", **options: float) -> SnmpTarget:
        """A target for snmpd: "2c" (its community), "sha" or "sha512" (its v3 users), or any credential."""
        if isinstance(credential, str):
            credential = (
                SnmpCredential("2c", community=self.snmpd_community) if credential == "2c" else self.v3[credential]
            )
        return SnmpTarget(self.host, self.snmpd_port, credential, **options)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def snmp_agents(worker_id: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SnmpAgents]:
    """The worker's snmpsim and snmpd (scripts/services/snmp.sh); stopped after the session."""
    index = _worker_index(worker_id)
    env = {
        "GPUFLEET_SNMPSIM_PORT": str(SNMPSIM_PORT + 2 * index),
        "GPUFLEET_SNMPD_PORT": str(SNMPSIM_PORT + 2 * index + 1),
        "GPUFLEET_SERVICES_RUN": str(tmp_path_factory.mktemp("snmp")),
    }
    install_tools(("snmpd", "snmpget"), "snmp.sh")
    started = _service("start", env)
    if started.returncode != 0:
        said = (started.stderr.strip() or started.stdout.strip() or "start failed").splitlines()
        need("snmpsim and snmpd", f"`snmp.sh start` failed: {said[-1]}")
    try:
        yield SnmpAgents.from_env_file(Path(started.stdout.strip().splitlines()[-1]), env)
    finally:
        _service("stop", env)


class Recordings:
    """Edits to what snmpsim serves, each recording put back as it was when the test ends."""

    def __init__(self, agents: SnmpAgents) -> None:
        self.agents = agents
        self._originals: dict[Path, str] = {}

    def path(self, community: str) -> Path:
        return self.agents.recordings / f"{community}.snmprec"

    def set(self, community: str, changes: Mapping[str, int | str | None]) -> None:
        """OID -> its new value (same type as recorded), None to take the OID away."""
        path = self.path(community)
        self._originals.setdefault(path, path.read_text())
        snmprec.edit(path, {oid: None if v is None else str(v) for oid, v in changes.items()})

    def restore(self) -> None:
        for path, text in self._originals.items():
            snmprec.replace(path, text)
        self._originals.clear()


@pytest.fixture
def snmpsim_recordings(snmp_agents: SnmpAgents) -> Iterator[Recordings]:
    recordings = Recordings(snmp_agents)
    try:
        yield recordings
    finally:
        recordings.restore()


@pytest.fixture
def snmpd_link(snmp_agents: SnmpAgents) -> Iterator[SnmpLink]:
    """snmpd's veth pair (root only: skips, or fails in CI, without it); its far end up again afterwards."""
    if snmp_agents.link is None:
        need("a veth pair for snmpd", "snmp.sh makes it only as root (network namespaces)")
    assert snmp_agents.link is not None
    try:
        yield snmp_agents.link
    finally:
        snmp_agents.link.set_peer(up=True)


def eventually(read: Callable[[], T], done: Callable[[T], bool], what: str, within_s: float = 30.0) -> T:
    """Read until `done` says so (snmpd caches its interface tables for a few seconds), at most
    `within_s`; fail saying `what` was awaited and what was read last."""
    deadline = time.monotonic() + within_s
    while True:
        value = read()
        if done(value):
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: still not so after {within_s:g} s; last read {value!r}")
        time.sleep(0.5)
