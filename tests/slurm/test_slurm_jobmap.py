"""Against a real Slurm 22.05 (scripts/services/slurm.sh runs gpufleet's prolog and epilog): a job's GPUs
are mapped to it while it runs, exactly those Slurm allocated, with the user, account and partition
Slurm hands the prolog, as the agent reads them; and forgotten when it ends."""

from __future__ import annotations

import contextlib
import getpass
import re
from pathlib import Path

import pytest

from gpufleet.agent.slurm.mapping import SlurmJobMap, parse_job_file
from gpufleet.core.errors import InvalidInput
from gpufleet.jobs.slurm.commands import SlurmCommands
from gpufleet.protocol.metrics import GpuJob
from tests.slurm.conftest import SlurmCluster, sinfo_node, wait_until

pytestmark = pytest.mark.slurm


def allocated_gpus(commands: SlurmCommands, job: str) -> set[int]:
    """The GPU indexes Slurm gave the job: `GRES=gpu:fake:2(IDX:0-1)` in `scontrol show job -d`."""
    shown = commands.run(["scontrol", "show", "job", "-d", job])
    found = re.search(r"\bGRES=\S*\(IDX:([0-9,-]+)\)", shown)
    assert found is not None, shown
    indexes: set[int] = set()
    for part in found.group(1).split(","):
        first, _, last = part.partition("-")
        indexes.update(range(int(first), int(last or first) + 1))
    return indexes


def mapped_to(job_map_dir: Path, job: str) -> set[int]:
    """The GPU files that name the job."""
    return {int(p.name) for p in job_map_dir.glob("[0-9]*") if p.name.isdigit() and job in p.read_text().splitlines()}


def test_a_jobs_gpus_are_mapped_while_it_runs_and_forgotten_after(slurm_cluster: SlurmCluster, slurm_node: str) -> None:
    if "SLURM_JOB_MAP_DIR" not in slurm_cluster.env:
        pytest.fail("the running test Slurm predates the job map: bash scripts/services/slurm.sh stop, then rerun")
    commands = SlurmCommands(slurm_cluster.conf, timeout_s=30)
    jobmap = slurm_cluster.job_map_dir
    reader = SlurmJobMap(jobmap)
    submitted = commands.run(
        ["sbatch", "--parsable", "--gres=gpu:2", "--account=vision", "-o", "/dev/null", "--wrap", "sleep 6"]
    )
    job = submitted.strip().split(";")[0]
    assert job.isdigit(), submitted
    try:
        wait_until("the prolog to map the job", lambda: any(j.job == job for j in reader.collect().gpu_jobs))
        gpus = allocated_gpus(commands, job)
        assert len(gpus) == 2
        assert mapped_to(jobmap, job) == gpus  # exactly the allocated GPUs, read as dcgm-exporter reads them
        user = getpass.getuser()  # sbatch runs as us: SLURM_JOB_USER
        assert [j for j in reader.collect().gpu_jobs if j.job == job] == [
            GpuJob(gpu=gpu, job=job, user=user, account="vision") for gpu in sorted(gpus)
        ]
        details = parse_job_file((jobmap / "jobs" / job).read_text())
        assert (details.user, details.account, details.partition) == (user, "vision", "gpu")

        wait_until("the epilog to forget the job", lambda: not mapped_to(jobmap, job), timeout_s=60)
        assert not (jobmap / "jobs" / job).exists()
        assert all(j.job != job for j in reader.collect().gpu_jobs)
        # The prolog and epilog never failed: a failing one would have drained the node.
        state = sinfo_node(commands, slurm_cluster.node)
        assert state in {"idle", "mixed", "allocated", "completing"}, state
    finally:
        with contextlib.suppress(InvalidInput):  # a job that ended: nothing to cancel
            commands.run(["scancel", job])
