"""Real LLDP neighbours for the topology tests: Debian's lldpd in network namespaces (scripts/services/lldpd.sh),
one lab per xdist worker: a switch namespace (chassis leaf01, bridge ports swp1-swp3) and two nodes cabled to it,
node1 (gpu001: eth0 -- swp1, eth1 -- swp3) and node2 (gpu002: eth0 -- swp2), each lldpd with its own socket.

Where lldpd cannot be had (not root, not installable, namespaces not allowed) the tests skip saying why; under
GPUFLEET_REQUIRE_SERVICES=1 that is a failure.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.services import SCRIPTS, install_tools, need

SCRIPT = SCRIPTS / "lldpd.sh"


@dataclass(frozen=True)
class LldpNode:
    """One namespace of the lab: its name, its lldpd's control socket, the chassis name it announces."""

    namespace: str
    socket: str
    name: str


@dataclass(frozen=True)
class LldpLab:
    """What `lldpd.sh start` printed: the switch, the two nodes, and the cabling (node:interface -> switch port)."""

    switch: LldpNode
    node1: LldpNode
    node2: LldpNode
    cables: Mapping[str, str]  # "gpu001:eth0" -> "leaf01:swp1"
    service_env: Mapping[str, str]

    @classmethod
    def from_env_file(cls, path: Path, service_env: Mapping[str, str]) -> LldpLab:
        values = dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)

        def node(prefix: str) -> LldpNode:
            return LldpNode(values[f"{prefix}_NS"], values[f"{prefix}_SOCKET"], values[f"{prefix}_NAME"])

        cables = dict(pair.split("=", 1) for pair in values["GPUFLEET_LLDP_CABLES"].split(","))
        return cls(
            switch=node("GPUFLEET_LLDP_SWITCH"),
            node1=node("GPUFLEET_LLDP_NODE1"),
            node2=node("GPUFLEET_LLDP_NODE2"),
            cables=cables,
            service_env=dict(service_env),
        )


def _worker_index(worker_id: str) -> int:
    return int(worker_id[2:]) if worker_id.startswith("gw") else 0


def _service(command: str, env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), command],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, **env},
    )


@pytest.fixture(scope="session")
def lldp_lab(worker_id: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LldpLab]:
    """The worker's lab, its lldpds already hearing each other; stopped (namespaces deleted) after the session."""
    if os.geteuid() != 0:
        need("lldpd", "network namespaces need root (run the tests as root)")
    install_tools(("lldpd", "lldpctl", "ip"), "lldpd.sh")
    env = {
        "GPUFLEET_LLDP_TAG": f"gfl{_worker_index(worker_id)}",
        "GPUFLEET_SERVICES_RUN": str(tmp_path_factory.mktemp("lldpd")),
    }
    started = _service("start", env)
    if started.returncode != 0:
        _service("stop", env)  # what a failed start left: namespaces, lldpds
        said = (started.stderr.strip() or started.stdout.strip() or "start failed").splitlines()
        need("lldpd", f"`lldpd.sh start` failed: {said[-1]}")
    try:
        yield LldpLab.from_env_file(Path(started.stdout.strip().splitlines()[-1]), env)
    finally:
        _service("stop", env)
