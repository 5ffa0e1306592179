"""A gpufleet job as a Slurm batch job: the `sbatch` arguments and the script. Pure.

The request maps onto sbatch's options one for one: nodes → `--nodes` (one task per node, as gpufleet's
ranks), GPUs per node → `--gres=gpu:N`, CPUs → `--cpus-per-task`, memory → `--mem` (MiB), time limit →
`--time` (whole minutes, rounded up: Slurm has no seconds), project → `--account`, category →
`--partition` when the site's partitions follow categories (else `slurm_partition`), requeue →
`--requeue`/`--no-requeue`. The job's name and `--comment=gpufleet:<id>` let gpufleet find it again.

The script: the job's own script (a `#!/bin/sh` line added when it has none), or `exec` of its argv.
The job's environment goes through sbatch itself: its variables (and a standard PATH unless it sets one, as
under the built-in executor) are set in sbatch's environment and named in `--export=NAME,...`, which (since
Slurm 20.11) passes exactly those, whatever their values hold (commas, newlines, quotes) and whatever
language the script is in. The head's own environment never reaches the job. Slurm adds its own
(SLURM_*, CUDA_VISIBLE_DEVICES for the job's GPUs).
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass
from pathlib import Path

from gpufleet.core.errors import InvalidInput
from gpufleet.jobs.models import Job
from gpufleet.jobs.slurm.queue import GPUFLEET_COMMENT
from gpufleet.protocol.jobs import DEFAULT_PATH

SHELL = "#!/bin/sh"  # as the built-in executor runs scripts without a #! line
# Variables sbatch itself reads (SBATCH_*, SLURM_CONF...): a job may not set them through gpufleet.
SLURM_OWN = ("SLURM_", "SBATCH_")


@dataclass(frozen=True)
class BatchOptions:
    """Site settings that shape every submission."""

    partition: str | None = None  # slurm_partition: where jobs without a category go
    output_dir: Path | None = None  # slurm_output_dir: shared with the head, so it can read the output
    run_as_others: bool = False  # the head may submit as another user (it runs as root): sbatch --uid


def output_path(output_dir: Path, job_id: str) -> Path:
    """Where Slurm writes a job's stdout and stderr under `output_dir` (`%j` is Slurm's job id)."""
    return output_dir / f"gpufleet-{job_id}.out"


def job_environment(job: Job) -> dict[str, str]:
    """What the job's processes see besides Slurm's own: a standard PATH unless the job sets one."""
    return {"PATH": DEFAULT_PATH} | job.env


def render_script(job: Job) -> str:
    """The batch script: the job's script, or its command."""
    if job.script is not None:
        return job.script if job.script.startswith("#!") else f"{SHELL}\n{job.script}"
    if not job.argv:
        raise InvalidInput(f"job {job.id} has neither a command nor a script")
    return f"{SHELL}\nexec {shlex.join(job.argv)}\n"


def sbatch_argv(job: Job, script_path: str, options: BatchOptions, *, head_user: str) -> list[str]:
    """`sbatch` with every option as its own argument (never a shell). Raises InvalidInput for what Slurm
    cannot be asked through gpufleet: a container image (Slurm needs pyxis/enroot for that), or another
    user's job when the head may not submit as them."""
    slurms = sorted(k for k in job.env if k.startswith(SLURM_OWN))
    if slurms:
        raise InvalidInput(f"{', '.join(slurms)}: variables starting {' or '.join(SLURM_OWN)} are Slurm's own")
    if job.container:
        raise InvalidInput(
            "containers are not run through Slurm by gpufleet (Slurm needs pyxis/enroot); "
            "run the container from the job's script instead"
        )
    argv = [
        "sbatch",
        "--parsable",
        f"--job-name={job.name or 'gpufleet'}",
        f"--comment={GPUFLEET_COMMENT}{job.id}",
        f"--nodes={job.nodes}",
        "--ntasks-per-node=1",
        f"--time={max(1, math.ceil(job.time_limit_s / 60))}",
        f"--export={','.join(sorted(job_environment(job)))}",  # the values: in sbatch's environment
        "--requeue" if job.requeue else "--no-requeue",
    ]
    if job.gpus_per_node:
        argv.append(f"--gres=gpu:{job.gpus_per_node}")
    if job.cpus_per_node:
        argv.append(f"--cpus-per-task={job.cpus_per_node}")
    if job.mem_per_node_mib:
        argv.append(f"--mem={job.mem_per_node_mib}")
    partition = job.category or options.partition
    if partition:
        argv.append(f"--partition={partition}")
    if job.project:
        argv.append(f"--account={job.project}")
    if job.workdir:
        argv.append(f"--chdir={job.workdir}")
    if options.output_dir is not None:
        argv.append(f"--output={output_path(options.output_dir, '%j')}")
    if job.user != head_user:
        if not options.run_as_others:
            raise InvalidInput(
                f"the head runs as {head_user} and cannot submit job {job.id} to Slurm as {job.user}: "
                "run the head as root to submit jobs as their users"
            )
        argv.append(f"--uid={job.user}")
    argv.append(script_path)
    return argv
