"""gpufleet slurm config against a real head: nodes that reported their inventory rendered, --dry-run and
--write on real files, and a user's error as one line with the files unchanged."""

from pathlib import Path

import httpx
import pytest

from gpufleet.protocol.inventory import GpuInfo, NodeInventory
from tests.e2e.conftest import Head, cli_json, run_cli

pytestmark = pytest.mark.e2e


def _report(head: Head, name: str, gpus: int) -> None:
    """Join `name` as its agent would and report an inventory with `gpus` H200s."""
    join = head.join_token(1)
    joined = httpx.post(
        f"{head.url}/api/v1/agent/join", json={"name": name}, headers={"Authorization": f"Bearer {join}"}, timeout=30
    )
    joined.raise_for_status()
    inventory = NodeInventory(
        hostname=name,
        cpus=224,
        memory_total_mib=2063937,
        gpus=[
            GpuInfo(index=i, uuid=f"GPU-{name}-{i}", model="NVIDIA H200", pci_bus_id=f"0:{i}:0.0", memory_total_mib=1)
            for i in range(gpus)
        ],
    )
    put = httpx.put(
        f"{head.url}/api/v1/agent/inventory",
        content=inventory.model_dump_json(),
        headers={"Authorization": f"Bearer {joined.json()['credential']}", "Content-Type": "application/json"},
        timeout=30,
    )
    put.raise_for_status()


def test_slurm_config_from_a_real_head(head: Head, tmp_path: Path) -> None:
    assert run_cli(tmp_path, "node", "add", "gpu[001-002]", "--category", "h200", server=head.url).returncode == 0
    for name in ("gpu001", "gpu002"):
        _report(head, name, 8)
    shown = run_cli(tmp_path, "slurm", "config", server=head.url)
    assert shown.returncode == 0, shown.stderr
    assert "NodeName=gpu[001-002] CPUs=224 RealMemory=2063360 Gres=gpu:h200:8\n" in shown.stdout
    assert cli_json(tmp_path, head.url, "slurm", "config")["partitions"] == ["all", "h200"]

    etc = tmp_path / "etc"
    etc.mkdir()
    slurm_conf = etc / "slurm.conf"
    slurm_conf.write_text("ClusterName=prod\nGresTypes=gpu\n")
    dry = run_cli(tmp_path, "slurm", "config", "--slurm-conf", str(slurm_conf), "--dry-run", server=head.url)
    assert dry.returncode == 0, dry.stderr
    assert "+# BEGIN gpufleet managed nodes\n" in dry.stdout
    assert f"--- {etc / 'gres.conf'}\n" in dry.stdout
    assert slurm_conf.read_text() == "ClusterName=prod\nGresTypes=gpu\n"
    assert not (etc / "gres.conf").exists()

    wrote = run_cli(tmp_path, "slurm", "config", "--slurm-conf", str(slurm_conf), "--write", server=head.url)
    assert wrote.returncode == 0, wrote.stderr
    assert "PartitionName=h200 Nodes=gpu[001-002] State=UP\n# END gpufleet managed nodes\n" in slurm_conf.read_text()
    assert (etc / "gres.conf").read_text().endswith("NodeName=gpu[001-002] Name=gpu Type=h200 File=/dev/nvidia[0-7]\n")

    before = slurm_conf.read_text()
    slurm_conf.write_text(before + "NodeName=gpu002 CPUs=1\n")
    refused = run_cli(tmp_path, "slurm", "config", "--slurm-conf", str(slurm_conf), "--write", server=head.url)
    assert refused.returncode == 2
    assert refused.stderr.startswith("gpufleet: error: slurm.conf already defines node(s) gpu002")
    assert len(refused.stderr.strip().splitlines()) == 1
    assert "Traceback" not in refused.stderr
    assert slurm_conf.read_text() == before + "NodeName=gpu002 CPUs=1\n"

    missing = run_cli(tmp_path, "slurm", "config", "--slurm-conf", str(etc / "nope.conf"), "--dry-run", server=head.url)
    assert missing.returncode == 2
    assert missing.stderr == f"gpufleet: error: {etc / 'nope.conf'}: no such file\n"
