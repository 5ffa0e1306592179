"""Network boot for real: dnsmasq runs the configuration gpufleet rendered, in a network namespace of
its own, and a "node" in another namespace (joined by a veth pair, no link to the host's network) asks
for a lease with busybox's udhcpc. The node's MAC gets the address gpufleet assigned and the boot file,
the node's own iPXE script comes over TFTP, and a MAC gpufleet does not know gets nothing."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.core.clock import FakeClock
from gpufleet.core.db import transaction
from gpufleet.inventory import categories
from gpufleet.inventory import service as inventory
from gpufleet.inventory.schemas import NodeSettings
from gpufleet.provisioning import boot, networks
from gpufleet.provisioning.ipxe import script_path
from gpufleet.provisioning.networks import NetworkSpec
from tests.conftest import need
from tests.provisioning.test_networks import dnsmasq
from tests.services import require_tool

pytestmark = pytest.mark.dnsmasq

SERVER = "10.231.0.1"
KNOWN_MAC = "52:54:00:aa:bb:01"
UNKNOWN_MAC = "52:54:00:aa:bb:99"
# udhcpc's hook: take the address on the node's end of the veth (for TFTP) and write down the offer.
HOOK = """#!/bin/sh
case "$1" in
  bound|renew) ip addr flush dev "$interface"; ip addr add "$ip/${{mask:-24}}" dev "$interface"
               echo "ip=$ip bootfile=${{bootfile:-$boot_file}} siaddr=$siaddr" > {out} ;;
esac
exit 0
"""


def _run(*argv: str, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture
def namespaces(tmp_path: Path) -> Iterator[tuple[str, str, str]]:
    """A server namespace and a node namespace joined by a veth pair; names unique to this process."""
    if os.geteuid() != 0:
        need("dnsmasq", "network namespaces need root")
    dnsmasq()  # installs busybox and iproute2 with it (scripts/services/dnsmasq.sh)
    require_tool("ip")
    require_tool("busybox")  # udhcpc and tftp: the booting node
    tag = f"gf{os.getpid() % 100_000}"
    server, node = f"{tag}-srv", f"{tag}-node"
    created = _run("ip", "netns", "add", server)
    if created.returncode != 0:
        need("dnsmasq", f"cannot create a network namespace: {created.stderr.strip()}")
    try:
        _run("ip", "netns", "add", node).check_returncode()
        _run("ip", "link", "add", f"{tag}s", "type", "veth", "peer", "name", f"{tag}n").check_returncode()
        for cmd in (
            ("ip", "link", "set", f"{tag}s", "netns", server),
            ("ip", "link", "set", f"{tag}n", "netns", node),
            ("ip", "-n", server, "addr", "add", f"{SERVER}/24", "dev", f"{tag}s"),
            ("ip", "-n", server, "link", "set", f"{tag}s", "up"),
            ("ip", "-n", node, "link", "set", f"{tag}n", "address", KNOWN_MAC),
            ("ip", "-n", node, "link", "set", f"{tag}n", "up"),
        ):
            _run(*cmd).check_returncode()
        yield server, node, tag
    finally:
        for ns in (node, server):  # deleting a namespace deletes its end of the veth pair, and so the pair
            _run("ip", "netns", "del", ns)


def _lease(node_ns: str, device: str, out: Path) -> str | None:
    hook = out.with_suffix(".sh")
    hook.write_text(HOOK.format(out=out))
    hook.chmod(0o755)
    out.unlink(missing_ok=True)
    _run(
        "ip", "netns", "exec", node_ns,
        "busybox", "udhcpc", "-i", device, "-s", str(hook), "-n", "-q", "-f", "-t", "3", "-T", "1", "-O", "bootfile",
    )  # fmt: skip
    return out.read_text().strip() if out.exists() else None


@pytest.mark.one_database  # the database is not what this test is about
def test_a_node_boots_with_the_address_boot_file_and_script_gpufleet_rendered(
    sessions: sessionmaker[Session], clock: FakeClock, tmp_path: Path, namespaces: tuple[str, str, str]
) -> None:
    server_ns, node_ns, tag = namespaces
    with transaction(sessions) as s:
        network = networks.create_network(
            s,
            NetworkSpec(
                "boot", "10.231.0.0/24", "10.231.0.40", "10.231.0.60", boot_server=SERVER, boot_file="gpufleet.ipxe"
            ),
        )
        nodes = inventory.add_nodes(s, clock, ["gpu[01-03]"], NodeSettings(category="hgx"))
        networks.assign(s, nodes, network)
        networks.set_mac(s, nodes[1], network, KNOWN_MAC)  # gpu02: the second address, .41
        categories.update_node_settings(s, nodes[1], set_={"software_image": "ubuntu-gpu", "kernel_params": "quiet"})
        conf_text = boot.dnsmasq_config(s, str(tmp_path / "tftp"))
        files = boot.tftp_files(s)
    for relative, text in files.items():
        (tmp_path / "tftp" / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "tftp" / relative).write_text(text)
    conf = tmp_path / "gpufleet.conf"
    conf.write_text(conf_text)

    started = _run(
        "ip", "netns", "exec", server_ns, dnsmasq(), f"--conf-file={conf}", "--port=0", f"--interface={tag}s",
        "--bind-interfaces", f"--dhcp-leasefile={tmp_path / 'leases'}", f"--pid-file={tmp_path / 'dnsmasq.pid'}",
        "--user=root", "--group=root", f"--log-facility={tmp_path / 'dnsmasq.log'}", "--log-dhcp",
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    try:
        offered = _lease(node_ns, f"{tag}n", tmp_path / "lease")
        assert offered == f"ip=10.231.0.41 bootfile=gpufleet.ipxe siaddr={SERVER}", _log(tmp_path)

        # The chain script would fetch nodes/${net0/mac:hexhyp}.ipxe: fetch it the same way, over TFTP.
        fetched = tmp_path / "fetched.ipxe"
        got = _run(
            "ip", "netns", "exec", node_ns,
            "busybox", "tftp", "-g", "-r", script_path(KNOWN_MAC), "-l", str(fetched), SERVER,
        )  # fmt: skip
        assert got.returncode == 0, got.stderr
        script = fetched.read_text()
        assert script == files["nodes/52-54-00-aa-bb-01.ipxe"]
        assert "kernel tftp://10.231.0.1/images/ubuntu-gpu/vmlinuz" in script
        assert "ip=10.231.0.41::" in script
        assert "gpufleet.node=gpu02" in script
        assert script.rstrip().splitlines()[-2:] == ["initrd tftp://10.231.0.1/images/ubuntu-gpu/initrd.img", "boot"]
        assert "quiet" in script

        # A machine gpufleet does not know gets no lease at all: the range is static.
        _run("ip", "-n", node_ns, "link", "set", f"{tag}n", "address", UNKNOWN_MAC).check_returncode()
        assert _lease(node_ns, f"{tag}n", tmp_path / "lease2") is None
    finally:
        pid = (tmp_path / "dnsmasq.pid").read_text().strip() if (tmp_path / "dnsmasq.pid").exists() else ""
        if pid:
            _run("kill", pid)


def _log(tmp_path: Path) -> str:
    log = tmp_path / "dnsmasq.log"
    return log.read_text()[-2000:] if log.exists() else "(no dnsmasq log)"
