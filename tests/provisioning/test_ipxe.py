"""The iPXE scripts: the chain every client gets, and each node's own, from its settings."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from gpufleet.cli.app import app as cli_app
from gpufleet.cli.state import CliState
from gpufleet.client import HeadClient
from gpufleet.provisioning.ipxe import BootTarget, boot_files, kernel_command_line, render_node, script_path

TARGET = BootTarget(
    node="gpu07",
    mac="52:54:00:AA:BB:07",
    address="10.141.0.17",
    cidr="10.141.0.0/16",
    gateway="10.141.255.254",
    interface="boot",
    image="ubuntu-2204-gpu",
    kernel_params="console=ttyS0,115200 nvidia.NVreg_EnableGpuFirmware=0",
)


def test_scripts_are_named_the_way_ipxe_spells_the_mac() -> None:
    assert script_path(TARGET.mac) == "nodes/52-54-00-aa-bb-07.ipxe"


def test_the_kernel_gets_a_static_address_who_it_is_and_the_admins_parameters_last() -> None:
    line = kernel_command_line(TARGET, "10.141.0.1")
    assert line.split() == [
        "initrd=initrd.img",
        "ip=10.141.0.17::10.141.255.254:255.255.0.0:gpu07:boot:none",
        "gpufleet.node=gpu07",
        "gpufleet.image=ubuntu-2204-gpu",
        "gpufleet.head=10.141.0.1",
        "console=ttyS0,115200",
        "nvidia.NVreg_EnableGpuFirmware=0",
    ]
    no_gateway = kernel_command_line(replace(TARGET, gateway=None, kernel_params=" "), "h")
    assert no_gateway.split()[1] == "ip=10.141.0.17:::255.255.0.0:gpu07:boot:none"
    assert no_gateway.split()[-1] == "gpufleet.head=h"


def test_a_node_without_an_image_boots_its_local_disk() -> None:
    script = render_node(replace(TARGET, image=None), "10.141.0.1")
    assert script.startswith("#!ipxe\n")
    assert "kernel" not in script
    assert script.rstrip().endswith("exit")


def test_boot_files_hold_each_chain_name_and_one_script_per_node() -> None:
    files = boot_files(["gpufleet.ipxe", "pxe/second.ipxe"], [(TARGET, "10.141.0.1")])
    assert sorted(files) == ["gpufleet.ipxe", "nodes/52-54-00-aa-bb-07.ipxe", "pxe/second.ipxe"]
    assert files["gpufleet.ipxe"] == files["pxe/second.ipxe"]
    node = files["nodes/52-54-00-aa-bb-07.ipxe"].splitlines()
    assert node[0] == "#!ipxe"
    assert node[-3].startswith("kernel tftp://10.141.0.1/images/ubuntu-2204-gpu/vmlinuz initrd=initrd.img ip=")
    assert node[-2:] == ["initrd tftp://10.141.0.1/images/ubuntu-2204-gpu/initrd.img", "boot"]


def test_the_cli_never_writes_a_script_outside_the_tftp_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The head names the files; a head that names one above the root (a bug, or not our head) is refused
    before anything is written."""
    answers = {
        "/api/v1/provision/dhcp-config": httpx.Response(200, text="dhcp-authoritative\n"),
        "/api/v1/provision/boot-files": httpx.Response(
            200, json={"gpufleet.ipxe": "#!ipxe\n", "nodes/../../escaped.ipxe": "#!ipxe\n"}
        ),
    }
    head = HeadClient("http://head", "t", transport=httpx.MockTransport(lambda r: answers[r.url.path]))
    monkeypatch.setattr(CliState, "client", lambda _self: head)
    conf, root = tmp_path / "gpufleet.conf", tmp_path / "srv" / "tftp"
    result = CliRunner().invoke(
        cli_app, ["provision", "dhcp-config", "--output", str(conf), "--tftp-root", str(root)], obj=CliState()
    )
    assert result.exit_code != 0
    assert "outside" in str(result.exception)
    assert not conf.exists()
    assert not (root / "gpufleet.ipxe").exists()
    assert not (tmp_path / "escaped.ipxe").exists()
