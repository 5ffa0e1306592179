"""Issue 10's must-show with real processes: `gpufleet node add 'node[001-064]' --network` on a running
head gives 64 distinct addresses, and `gpufleet provision dhcp-config` writes a configuration the real
dnsmasq accepts (`dnsmasq --test`); clones get addresses of their own; a dry run shows the change."""

import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import Head, cli_json, run_cli
from tests.provisioning.test_networks import dnsmasq

pytestmark = [pytest.mark.e2e, pytest.mark.dnsmasq]


@pytest.fixture
def head(heavy: None, tmp_path: Path) -> Iterator[Head]:
    """Under the heavy lock: a head and a dozen CLI processes would starve the 200-node join storm's
    heartbeats on the other worker."""
    started = Head(tmp_path).start()
    yield started
    started.kill(signal.SIGTERM)


def cli(tmp_path: Path, head: Head, *args: str) -> str:
    done = run_cli(tmp_path, *args, server=head.url)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_sixty_four_nodes_get_addresses_and_a_dhcp_config_dnsmasq_accepts(head: Head, tmp_path: Path) -> None:
    cli(
        tmp_path,
        head,
        "network",
        "create",
        "internal",
        "--cidr",
        "10.141.0.0/16",
        "--range",
        "10.141.0.1-10.141.3.254",
        "--gateway",
        "10.141.255.254",
        "--boot-server",
        "10.141.0.1",
        "--boot-file",
        "gpufleet.ipxe",
    )
    cli(tmp_path, head, "node", "add", "node[001-064]", "--category", "hgx", "--network", "internal")
    hosts = cli_json(tmp_path, head.url, "network", "show", "internal")
    assert len(hosts) == 64
    assert len({h["address"] for h in hosts}) == 64
    assert hosts[0] == {"node": "node001", "address": "10.141.0.2", "mac": None, "interface": "boot"}

    assert "52:54:00:aa:00:01 -> 10.141.0.2" in cli(
        tmp_path, head, "node", "set-mac", "node001", "52-54-00-AA-00-01", "--network", "internal"
    )
    for i in range(2, 65):  # the rest through the API: a CLI process each would take a minute
        head.api("PUT", f"/api/v1/nodes/node{i:03d}/interfaces/internal", json={"mac": f"52:54:00:aa:00:{i:02x}"})
    conf = tmp_path / "dnsmasq.d" / "gpufleet.conf"
    preview = cli(tmp_path, head, "provision", "dhcp-config", "--output", str(conf), "--dry-run")
    assert "+dhcp-host=52:54:00:aa:00:01,set:internal,10.141.0.2,node001" in preview
    assert not conf.exists()  # a dry run writes nothing
    written = cli(
        tmp_path, head, "provision", "dhcp-config", "--output", str(conf), "--tftp-root", str(tmp_path / "tftp")
    )
    assert "(64 hosts), 65 iPXE scripts" in written
    scripts = tmp_path / "tftp"
    assert (
        "chain --autofree tftp://${next-server}/nodes/${net0/mac:hexhyp}.ipxe"
        in (scripts / "gpufleet.ipxe").read_text()
    )
    assert len(list((scripts / "nodes").glob("*.ipxe"))) == 64
    assert "node001 has no software image" in (scripts / "nodes" / "52-54-00-aa-00-01.ipxe").read_text()
    checked = subprocess.run(
        [dnsmasq(), "--test", f"--conf-file={conf}"], capture_output=True, text=True, timeout=30, check=False
    )
    assert checked.returncode == 0, checked.stderr
    tftp = ("--tftp-root", str(tmp_path / "tftp"))
    assert "up to date" in cli(tmp_path, head, "provision", "dhcp-config", "--output", str(conf), *tftp, "--dry-run")

    cli(tmp_path, head, "node", "clone", "node001", "node[065-066]")
    again = {h["node"]: h["address"] for h in cli_json(tmp_path, head.url, "network", "show", "internal")}
    assert (again["node065"], again["node066"]) == ("10.141.0.66", "10.141.0.67")
    full = run_cli(tmp_path, "node", "add", "big[0001-1000]", "--network", "internal", server=head.url)
    assert full.returncode != 0
    assert "free addresses" in full.stderr
    assert cli_json(tmp_path, head.url, "node", "list", "big[0001-0002]") == []
