"""Slurm 22.05 itself reads what gpufleet renders: a throwaway slurmctld and slurmd (own state directory, own
ports, auth/none on loopback) start from a slurm.conf whose node and partition lines are gpufleet's, and a
gres.conf that is gpufleet's alone.

The node standing for this machine carries the CPUs and memory gpufleet's agent reads (`read_host_facts`), so
slurmd's own check of the node against slurm.conf is real: the node comes up idle only if CPUs= and RealMemory=
are no more than slurmd finds and gres.conf gives it every GPU that slurm.conf promises (else Slurm marks it
invalid, as the control cases show). A job then asks for the rendered GRES type and is given the GPUs.

Nothing here touches the shared test Slurm (`slurm_cluster`, used only to have Slurm installed and to be root).
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpufleet.agent.host import read_host_facts
from gpufleet.core import managed_block
from gpufleet.jobs.slurm.config import InventoryGpu, InventoryNode, render
from tests.slurm.conftest import SlurmCluster

pytestmark = pytest.mark.slurm

NODE = "cfgnode"  # this machine, as slurmd -N names it
GPUS = 4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Throwaway:
    """A Slurm of its own under `root`: the files, the environment its client programs need, its daemons."""

    root: Path
    procs: list[subprocess.Popen[bytes]]

    @property
    def conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        clean = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SINFO_", "SQUEUE_"))}
        return clean | {"SLURM_CONF": str(self.conf), "LC_ALL": "C"}

    def run(self, *argv: str) -> str:
        done = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=30, check=False)
        assert done.returncode == 0, f"{argv}: {done.stderr}"
        return done.stdout

    def start(self, nodes_block: str, gres_conf: str) -> None:
        """Write slurm.conf (fixed settings, then gpufleet's block placed as the CLI places it) and gres.conf,
        and start slurmctld and slurmd in the foreground."""
        for sub in ("etc", "spool/ctld", "spool/d", "log", "run", "jobout"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        host = socket.gethostname().split(".")[0]
        base = "\n".join(
            [
                "ClusterName=gpufleetcfg",
                f"SlurmctldHost={host}(127.0.0.1)",
                f"SlurmctldPort={free_port()}",
                f"SlurmdPort={free_port()}",
                "SlurmUser=root",
                "SlurmdUser=root",
                "AuthType=auth/none",
                "CredType=cred/none",
                f"StateSaveLocation={self.root}/spool/ctld",
                f"SlurmdSpoolDir={self.root}/spool/d",
                f"SlurmctldPidFile={self.root}/run/slurmctld.pid",
                f"SlurmdPidFile={self.root}/run/slurmd.pid",
                f"SlurmctldLogFile={self.root}/log/slurmctld.log",
                f"SlurmdLogFile={self.root}/log/slurmd.log",
                "ProctrackType=proctrack/linuxproc",
                "TaskPlugin=task/none",
                "AccountingStorageType=accounting_storage/none",
                "SelectType=select/cons_tres",
                "SelectTypeParameters=CR_Core",
                "ReturnToService=2",
                "MpiDefault=none",
                "GresTypes=gpu",
                "",
            ]
        )
        self.conf.write_text(managed_block.place(base, nodes_block, "nodes"))
        (self.conf.parent / "gres.conf").write_text(gres_conf)
        for argv in (
            ["slurmctld", "-D", "-c", "-f", str(self.conf)],
            ["slurmd", "-D", "-N", NODE, "-f", str(self.conf)],
        ):
            with (self.root / "log" / f"{argv[0]}.out").open("wb") as log:
                self.procs.append(subprocess.Popen(argv, env=self.env, stdout=log, stderr=subprocess.STDOUT))
            time.sleep(0.5)  # slurmctld listening before slurmd registers saves slurmd's retry delay

    def node(self) -> str:
        """sinfo's state and reason for the node: "idle|none", "inval|Low RealMemory ..." (sinfo prints it once
        for each partition the node is in)."""
        out = subprocess.run(
            ["sinfo", "-h", "-N", "-n", NODE, "-o", "%T|%E"],
            check=False,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        lines = out.stdout.split("\n")
        return lines[0].strip()

    def wait_node(self, what: str, settled: Callable[[str], bool], timeout_s: float = 60) -> str:
        """The node's state once `settled` says so; fails the test with Slurm's logs after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while not settled(state := self.node()):
            if time.monotonic() > deadline:
                logs = "\n".join((self.root / "log" / f).read_text()[-1500:] for f in ("slurmctld.log", "slurmd.log"))
                pytest.fail(f"node {NODE} is {state!r}, not {what}, after {timeout_s:g} s\n{logs}")
            time.sleep(0.2)
        return state

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture
def throwaway(slurm_cluster: SlurmCluster, tmp_path: Path) -> Iterator[Throwaway]:
    cluster = Throwaway(tmp_path / "slurm", [])
    yield cluster
    cluster.stop()


@pytest.fixture
def devices(tmp_path: Path) -> str:
    """Character devices standing for GPUs (no driver behind them), as slurmd insists on them."""
    (tmp_path / "dev").mkdir()
    for i in range(GPUS):
        os.mknod(tmp_path / "dev" / f"fakegpu{i}", 0o666 | 0o020000, os.makedev(240, i))
    return str(tmp_path / "dev" / "fakegpu")


def inventory(memory_extra_mib: int = 0, gpus: int = GPUS) -> list[InventoryNode]:
    """This machine as gpufleet's agent sees it, with four A100s, beside sixteen H200 nodes and a CPU node (not
    running: they check the hostlists and partitions; their host is localhost so that slurmctld resolves it)."""
    facts = read_host_facts()
    here = InventoryNode(
        NODE,
        reported=True,
        category="a100",
        hostname=facts.hostname,
        cpus=facts.cpus,
        memory_mib=facts.memory_total_mib + memory_extra_mib,
        gpus=tuple(InventoryGpu(i, "NVIDIA A100-SXM4-80GB") for i in range(gpus)),
        expected_gpus=gpus,
    )
    h200 = tuple(InventoryGpu(i, "NVIDIA H200") for i in range(8))
    others = [InventoryNode(f"cfg{i:03}", True, "h200", "localhost", 224, 2063937, h200, 8) for i in range(1, 17)] + [
        InventoryNode("cfgcpu", True, None, "localhost", 64, 515000, (), 0)
    ]
    return [here, *others]


def test_slurm_runs_on_the_rendered_config(throwaway: Throwaway, devices: str, tmp_path: Path) -> None:
    rendered = render(inventory(), device_prefix=devices)
    assert rendered.warnings == []
    throwaway.start(rendered.nodes_block, rendered.gres_conf)
    assert throwaway.wait_node("idle", lambda state: state.startswith(("idle|", "inval", "drain"))) == "idle|none"

    shown = throwaway.run("scontrol", "show", "node", NODE)
    assert "Gres=gpu:a100-sxm4-80gb:4" in shown
    partitions = throwaway.run("sinfo", "-h", "-o", "%P|%D|%N|%G")
    assert set(partitions.split()) == {
        f"all*|1|{NODE}|gpu:a100-sxm4-80gb:4",
        "all*|16|cfg[001-016]|gpu:h200:8",
        "all*|1|cfgcpu|(null)",
        f"a100|1|{NODE}|gpu:a100-sxm4-80gb:4",
        "h200|16|cfg[001-016]|gpu:h200:8",
    }

    out = tmp_path / "slurm" / "jobout" / "job.out"
    throwaway.run(
        "sbatch", "--wait", "-p", "a100", "--gres=gpu:a100-sxm4-80gb:2", "-o", str(out),
        "--wrap", "echo CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES",
    )  # fmt: skip
    assert out.read_text().strip() == "CUDA_VISIBLE_DEVICES=0,1"


@pytest.mark.parametrize(
    ("memory_extra_mib", "gres_gpus", "reason"),
    [(1024, GPUS, "Low RealMemory"), (0, GPUS - 1, "gres/gpu count reported lower than configured")],
)
def test_control_slurm_refuses_a_node_unlike_its_config(
    throwaway: Throwaway, devices: str, memory_extra_mib: int, gres_gpus: int, reason: str
) -> None:
    """The check above has teeth: a GiB of RealMemory too many, or a gres.conf short of a GPU that slurm.conf
    promises, and Slurm will not use the node."""
    rendered = render(inventory(memory_extra_mib=memory_extra_mib), device_prefix=devices)
    gres = render(inventory(memory_extra_mib, gpus=gres_gpus), device_prefix=devices).gres_conf
    throwaway.start(rendered.nodes_block, gres)
    state = throwaway.wait_node("refused", lambda state: reason in state or state.startswith("idle"))
    assert reason in state, state
