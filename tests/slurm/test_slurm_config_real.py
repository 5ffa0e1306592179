"""Slurm 22.05 itself reads what gpufleet renders: a throwaway slurmctld and slurmd (own state directory, own
ports, auth/none on loopback) start from a slurm.conf whose node and partition lines are gpufleet's, and a
gres.conf that is gpufleet's alone.

The node standing for this machine carries the CPUs and memory gpufleet's agent reads (`read_host_facts`), so
slurmd's own check of the node against slurm.conf is real: the node comes up idle only if CPUs= and RealMemory=
are no more than slurmd finds and gres.conf gives it every GPU that slurm.conf promises (else Slurm marks it
invalid, as the control cases show). A job then asks for the rendered GRES type and is given the GPUs.

MIG needs no GPU here either: gres.conf gives a MIG node AutoDetect=nvml, and slurmd's own test hook,
fake_gpus.conf beside slurm.conf, stands for NVML (slurmd reads the devices it lists instead of asking NVML),
listing them by the names slurmd's NVML plugin would give them (`nvidia_h200_1g.16gb` for an H200's 1g.18gb).

Nothing here touches the shared test Slurm (`slurm_cluster`, used only to have Slurm installed and to be root).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpufleet.agent.host import read_host_facts
from gpufleet.core import managed_block
from gpufleet.jobs.slurm.batch import inventory_mig_types, mig_gres_type
from gpufleet.jobs.slurm.config import InventoryGpu, InventoryMig, InventoryNode, render
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

    def start(self, nodes_block: str, gres_conf: str, fake_gpus: str = "") -> None:
        """Write slurm.conf (fixed settings, then gpufleet's block placed as the CLI places it), gres.conf and
        `fake_gpus` (fake_gpus.conf, where given), and start slurmctld and slurmd in the foreground."""
        for sub in ("etc", "spool/ctld", "spool/d", "log", "run", "jobout"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        if fake_gpus:
            (self.conf.parent / "fake_gpus.conf").write_text(fake_gpus)
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


# -- MIG -------------------------------------------------------------------------------------------------------


@pytest.fixture
def nvml_dev() -> Iterator[Path]:
    """A directory with a short path for the devices of fake_gpus.conf: slurmd reads its lines into 256 bytes."""
    path = Path(tempfile.mkdtemp(prefix="gfmig", dir="/tmp"))
    yield path
    shutil.rmtree(path)


def nvml_devices(dev: Path, layout: list[str | list[str]]) -> str:
    """fake_gpus.conf listing the devices slurmd's NVML plugin (gpu_nvml.c) would find: per GPU of `layout`,
    NVML's name for it (a whole GPU) or for each of its MIG devices; one line per device,
    `<type>|<CPUs>|<CPU list>|<links>|<files>|<unique id>|<flags>`. The files are character devices made in
    `dev`: a whole GPU's nvidiaN, a MIG device's that and two nvidia-capM; a MIG device's unique id is
    MIG-<GPU UUID>/<GPU instance>/<compute instance>, as gpu_nvml.c gives them."""
    cpus = read_host_facts().cpus
    lines, minor = [], 0

    def node(name: str, major: int, number: int) -> str:
        os.mknod(dev / name, 0o666 | 0o020000, os.makedev(major, number))
        return str(dev / name)

    for gpu, names in enumerate(layout):
        card = node(f"nvidia{gpu}", 240, gpu)
        if isinstance(names, str):
            lines.append(f"{names}|{cpus}|0-{cpus - 1}|(null)|{card}|(null)|nvidia_gpu_env")
            continue
        for instance, name in enumerate(names, start=1):
            caps = [node(f"nvidia-cap{minor + 1}", 241, minor + 1), node(f"nvidia-cap{minor + 2}", 241, minor + 2)]
            minor += 2
            files = ",".join([card, *caps])
            lines.append(f"{name}|{cpus}|0-{cpus - 1}|(null)|{files}|MIG-GPU-fake{gpu}/{instance}/0|nvidia_gpu_env")
    assert all(len(line) < 255 for line in lines)
    return "".join(f"{line}\n" for line in lines)


# MIG instances as the agent reports them: NVIDIA's profile, the compute slices and NVML's memory size (MiB).
H200_1G = InventoryMig("1g.18gb", 1, 16384)  # nvidia_h200_1g.16gb to slurmd
H200_3G = InventoryMig("3g.71gb", 3, 66560)  # nvidia_h200_3g.65gb
H200_4G = InventoryMig("4g.71gb", 4, 66560)  # nvidia_h200_4g.65gb
H100_1G = InventoryMig("1g.10gb", 1, 9984)  # nvidia_h100_80gb_hbm3_1g.10gb


def mig_inventory(gpus: tuple[InventoryGpu, ...]) -> list[InventoryNode]:
    """This machine with `gpus`, beside two nodes of eight all-1g.18gb H200 (not running)."""
    facts = read_host_facts()
    here = InventoryNode(NODE, True, "mig", facts.hostname, facts.cpus, facts.memory_total_mib, gpus, len(gpus))
    h200 = tuple(InventoryGpu(i, "NVIDIA H200", True, (H200_1G,) * 7) for i in range(8))
    others = [InventoryNode(f"cfgmig{i:02}", True, "mig", "localhost", 224, 2063937, h200, 8) for i in (1, 2)]
    return [here, *others]


MIXED_H200 = (
    InventoryGpu(0, "NVIDIA H200"),
    InventoryGpu(1, "NVIDIA H200"),
    InventoryGpu(2, "NVIDIA H200", True, (H200_1G,) * 7),
    InventoryGpu(3, "NVIDIA H200", True, (H200_3G, H200_4G)),
)
# What slurmd's NVML plugin finds on that node: `<model up to its first '-'>_<slices>g.<GiB>gb`, the GiB being
# NVML's memory size rounded (gpu_nvml.c), for each MIG device; the model name for each whole GPU.
MIXED_H200_DEVICES: list[str | list[str]] = [
    "nvidia_h200",
    "nvidia_h200",
    ["nvidia_h200_1g.16gb"] * 7,
    ["nvidia_h200_3g.65gb", "nvidia_h200_4g.65gb"],
]


def test_slurm_runs_a_mig_node_on_the_rendered_config(throwaway: Throwaway, nvml_dev: Path, tmp_path: Path) -> None:
    """A node of two whole H200 and two in MIG mode (7 x 1g.18gb; 3g.71gb + 4g.71gb): slurmd gives each device
    the names NVML's slices and memory make (nvidia_h200_1g.16gb, ...) the rendered type in its name, the node
    comes up with every GRES slurm.conf promises, and a job asking for 1g.18gb MIG devices as a gpufleet job of
    that profile asks (`--gres=gpu:1g.16gb:2`) gets two.

    What this cannot show without a MIG GPU: that NVML on a real H200 reports the memory sizes used here (those
    of protocol.mig's tables), and, since Slurm 22.05 reads fake_gpus.conf whatever AutoDetect says, that
    `AutoDetect=nvml` is what turns the reading on: here it is only parsed.
    """
    rendered = render(mig_inventory(MIXED_H200))
    assert rendered.warnings == []
    assert f"NodeName={NODE} AutoDetect=nvml\n" in rendered.gres_conf
    throwaway.start(rendered.nodes_block, rendered.gres_conf, nvml_devices(nvml_dev, MIXED_H200_DEVICES))
    assert throwaway.wait_node("idle", lambda state: state.startswith(("idle|", "inval", "drain"))) == "idle|none"

    # slurmd adds the sockets of the devices' CPUs, (S:0) or so: the fakes' CPUs are all of this machine's
    partitions = re.sub(r"\(S:[-0-9,]+\)", "", throwaway.run("sinfo", "-h", "-o", "%P|%D|%N|%G"))
    assert set(partitions.split()) == {
        f"all*|1|{NODE}|gpu:h200:2,gpu:1g.16gb:7,gpu:3g.65gb:1,gpu:4g.65gb:1",
        "all*|2|cfgmig[01-02]|gpu:1g.16gb:56",
        f"mig|1|{NODE}|gpu:h200:2,gpu:1g.16gb:7,gpu:3g.65gb:1,gpu:4g.65gb:1",
        "mig|2|cfgmig[01-02]|gpu:1g.16gb:56",
    }
    # what a gpufleet job of profile 1g.18gb asks for, with and without the inventory to tell
    kind = mig_gres_type("1g.18gb", inventory_mig_types(i for gpu in MIXED_H200 for i in gpu.mig))
    assert kind == mig_gres_type("1g.18gb", {}) == "1g.16gb"
    out = tmp_path / "slurm" / "jobout" / "mig.out"
    throwaway.run(
        "sbatch", "--wait", "-w", NODE, f"--gres=gpu:{kind}:2", "-o", str(out),
        "--wrap", "echo CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES",
    )  # fmt: skip
    assert out.read_text().strip() == "CUDA_VISIBLE_DEVICES=MIG-GPU-fake2/1/0,MIG-GPU-fake2/2/0"


def test_control_slurm_refuses_a_mig_node_typed_by_nvidias_profile_names(throwaway: Throwaway, nvml_dev: Path) -> None:
    """Why the types are Slurm's names: the same node with NVIDIA's profile names in slurm.conf (1g.18gb is no
    substring of nvidia_h200_1g.16gb), and Slurm will not use it."""
    rendered = render(mig_inventory(MIXED_H200))
    nvidia = rendered.nodes_block
    for slurms, nvidias in (("1g.16gb", "1g.18gb"), ("3g.65gb", "3g.71gb"), ("4g.65gb", "4g.71gb")):
        nvidia = nvidia.replace(slurms, nvidias)
    assert "Gres=gpu:h200:2,gpu:1g.18gb:7,gpu:3g.71gb:1,gpu:4g.71gb:1\n" in nvidia
    throwaway.start(nvidia, rendered.gres_conf, nvml_devices(nvml_dev, MIXED_H200_DEVICES))
    reason = "gres/gpu count reported lower than configured"
    state = throwaway.wait_node("refused", lambda state: reason in state or state.startswith("idle"))
    assert reason in state, state


def test_control_slurm_refuses_the_mixed_node_the_warning_names(throwaway: Throwaway, nvml_dev: Path) -> None:
    """The warning for a whole-GPU type that would take the MIG devices is true: beside 1g.10gb MIG devices
    (nvidia_h100_80gb_hbm3_1g.10gb), slurmd gives the longer h100_80gb_hbm3 to two of them and finds no
    type for the whole GPUs, and Slurm will not use the node."""
    h100 = "NVIDIA H100 80GB HBM3"
    gpus = (InventoryGpu(0, h100), InventoryGpu(1, h100), InventoryGpu(2, h100, True, (H100_1G,) * 7))
    rendered = render(mig_inventory(gpus))
    assert [w for w in rendered.warnings if "slurmd would give its 1g.10gb MIG devices" in w]
    fake = nvml_devices(nvml_dev, ["nvidia_h100_80gb_hbm3"] * 2 + [["nvidia_h100_80gb_hbm3_1g.10gb"] * 7])
    throwaway.start(rendered.nodes_block, rendered.gres_conf, fake)
    reason = "gres/gpu count reported lower than configured"
    state = throwaway.wait_node("refused", lambda state: reason in state or state.startswith("idle"))
    assert reason in state, state
