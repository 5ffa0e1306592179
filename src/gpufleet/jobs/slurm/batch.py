"""A gpufleet job as a Slurm batch job: the `sbatch` arguments and the script. Pure.

The request maps onto sbatch's options one for one: nodes → `--nodes` (one task per node, as gpufleet's
ranks), GPUs per node → `--gres=gpu:N` (`--gres=gpu:<type>:N` for MIG instances, below), CPUs →
`--cpus-per-task`, memory → `--mem` (MiB), time limit → `--time` (whole minutes, rounded up: Slurm has no
seconds), project → `--account`, category → `--partition` when the site's partitions follow categories (else
`slurm_partition`), requeue → `--requeue`/`--no-requeue`. The job's name and
`--comment=gpufleet:<id>:<stamp>` (`queue.job_comment`) let gpufleet find it again.

A job of MIG instances (`gpu_profile`, NVIDIA's profile name, "1g.18gb") asks for the GRES type Slurm gives
them, which is not always that name (jobs.slurm.config renders the same types into slurm.conf): slurmd names a
MIG device by its slices and its memory in GiB rounded, so an H200's 1g.18gb is `--gres=gpu:1g.16gb:N`. The
rule (`mig_gres_type`): the type the inventory's instances of the profile have (`inventory_mig_types`, read by
the sync only when it submits a MIG job), the commonest where they differ (a profile two models size
differently, both in the inventory: an A100 80GB's 3g.40gb is 3g.39gb to Slurm, an H100's 3g.40gb), else the
profile's one type over every model in the profile tables (protocol.mig.slurm_types); a profile without an
instance in the inventory that the tables size differently by model, or do not know, is refused.

The script: the job's own script (a `#!/bin/sh` line added when it has none), or `exec` of its argv.
The job's environment goes through sbatch itself: its variables (and a standard PATH unless it sets one, as
under the built-in executor) are set in sbatch's environment and named in `--export=NAME,...`, which (since
Slurm 20.11) passes exactly those, whatever their values hold (commas, newlines, quotes) and whatever
language the script is in. The head's own environment never reaches the job. Slurm adds its own
(SLURM_*, CUDA_VISIBLE_DEVICES for the job's GPUs).

A job array is one sbatch: `--array=<task ids>%<throttle>` (the task ids gpufleet chose, which are Slurm's
own: SLURM_ARRAY_TASK_ID is the task's GPUFLEET_ARRAY_TASK_ID), `--comment=gpufleet:<array job id>:<stamp>`, and
the output in `gpufleet-<array>_<task>.out`. The variables all tasks share (GPUFLEET_ARRAY_JOB_ID, which is
gpufleet's array id, _COUNT, _MIN, _MAX, and the job's own) go through `--export` as above; the task id
cannot, being different in each task. A shell script gpufleet writes (a command's `exec`, a script with no
#! line) or a user's script run by a shell (#!/bin/sh, #!/bin/bash, #!/usr/bin/env bash...) sets it
from Slurm's by a line added after the #! line and the comments under it (sbatch reads #SBATCH lines only
before the first command). A script in another language (#!/usr/bin/env python3...) is left as it is and
reads SLURM_ARRAY_TASK_ID, the same number.
"""

from __future__ import annotations

import math
import re
import shlex
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpufleet.core.errors import InvalidInput
from gpufleet.jobs import arrays
from gpufleet.jobs.models import Job
from gpufleet.jobs.slurm.config import InventoryMig, gpu_instance_profile, mig_slurm_type
from gpufleet.jobs.slurm.queue import job_comment
from gpufleet.protocol.jobs import DEFAULT_PATH
from gpufleet.protocol.mig import slurm_types

SHELL = "#!/bin/sh"  # as the built-in executor runs scripts without a #! line
# Variables sbatch itself reads (SBATCH_*, SLURM_CONF...): a job may not set them through gpufleet.
SLURM_OWN = ("SLURM_", "SBATCH_")
# Shells that take `export NAME="$VALUE"`: a script they run gets the array task's id set by gpufleet.
SHELLS = frozenset({"sh", "bash", "dash", "ksh", "zsh"})
SET_TASK_ID = f'export {arrays.TASK_ID_VARIABLE}="$SLURM_ARRAY_TASK_ID"\n'


@dataclass(frozen=True)
class BatchOptions:
    """Site settings that shape every submission."""

    partition: str | None = None  # slurm_partition: where jobs without a category go
    output_dir: Path | None = None  # slurm_output_dir: shared with the head, so it can read the output
    run_as_others: bool = False  # the head may submit as another user (it runs as root): sbatch --uid


def output_path(output_dir: Path, job_id: str) -> Path:
    """Where Slurm writes a job's stdout and stderr under `output_dir`: `job_id` is the job's external_id
    (`%j` for a job, `%A_%a` for an array's task, Slurm's patterns for both when submitting)."""
    return output_dir / f"gpufleet-{job_id}.out"


def job_environment(job: Job) -> dict[str, str]:
    """What the job's processes see besides Slurm's own: a standard PATH unless the job sets one. For an array
    task, what all its array's tasks share: the task's own id is set by the script (`render_script`)."""
    env = {"PATH": DEFAULT_PATH} | job.env
    if job.array_job_id is not None:
        env.pop(arrays.TASK_ID_VARIABLE, None)
    return env


def render_script(job: Job) -> str:
    """The batch script: the job's script, or its command; for an array task, one that sets its task id."""
    if job.script is not None:
        script = job.script if job.script.startswith("#!") else f"{SHELL}\n{job.script}"
    elif job.argv:
        script = f"{SHELL}\nexec {shlex.join(job.argv)}\n"
    else:
        raise InvalidInput(f"job {job.id} has neither a command nor a script")
    if job.array_job_id is not None and runs_in_shell(script):
        return _with_task_id(script)
    return script


def runs_in_shell(script: str) -> bool:
    """Whether the script's #! line names a shell, directly (#!/bin/bash -e) or through env (#!/usr/bin/env sh)."""
    words = script.partition("\n")[0].removeprefix("#!").split()
    if words and words[0].rsplit("/", 1)[-1] == "env":
        words = [w for w in words[1:] if not w.startswith("-")]  # env's own options (-S, -i)
    return bool(words) and words[0].rsplit("/", 1)[-1] in SHELLS


def _with_task_id(script: str) -> str:
    """The script with SET_TASK_ID after its #! line and the comments and blank lines under it: sbatch
    stops reading #SBATCH lines at the first command, so the line must not come before them."""
    lines = script.splitlines(keepends=True)
    at = 1
    while at < len(lines) and (not lines[at].strip() or lines[at].lstrip().startswith("#")):
        at += 1
    if at == len(lines) and lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    return "".join([*lines[:at], SET_TASK_ID, *lines[at:]])


def inventory_mig_types(instances: Iterable[InventoryMig]) -> dict[str, str]:
    """Profile ("1g.18gb") → the GRES type the inventory's instances of it have (`config.mig_slurm_type`, as
    slurm.conf has them): the one most of them have, the first by name on a tie."""
    seen: dict[str, Counter[str]] = {}
    for instance in instances:
        profile, kind = gpu_instance_profile(instance.profile), mig_slurm_type(instance)
        if profile and kind and _plausible(profile, kind):
            seen.setdefault(profile, Counter())[kind] += 1
    return {profile: min(kinds, key=lambda k: (-kinds[k], k)) for profile, kinds in seen.items()}


def _plausible(profile: str, kind: str) -> bool:
    """Whether a reported type can be the profile's: its slices, and its memory within a GiB or two of what
    the profile tables say. An agent reporting odd instances must not decide every job's `--gres`."""
    shape = re.compile(r"^(\d+)g\.(\d+)gb$")
    reported = shape.match(kind)
    if reported is None:
        return False
    for known in slurm_types(profile):
        expected = shape.match(known)
        if expected and expected[1] == reported[1] and abs(int(expected[2]) - int(reported[2])) <= 2:
            return True
    return False


def mig_gres_type(profile: str, inventory: Mapping[str, str]) -> str:
    """The GRES type a job of MIG profile `profile` asks Slurm for (the rule in the module's docstring):
    `inventory[profile]` (`inventory_mig_types`), else the profile's one type in the profile tables. Raises
    InvalidInput where neither tells it."""
    if kind := inventory.get(profile):
        return kind
    kinds = slurm_types(profile)
    if len(kinds) == 1:
        return next(iter(kinds))
    if not kinds:
        raise InvalidInput(f"no GPU model has MIG profile {profile}: Slurm has no type for it")
    raise InvalidInput(
        f"Slurm names MIG profile {profile} {' or '.join(sorted(kinds))} by GPU model, and no GPU in the "
        "inventory has an instance of it to tell which: make one (a MIG layout) and submit the job again"
    )


def array_option(task_ids: Sequence[int], throttle: int | None) -> str:
    """sbatch's `--array=` for these tasks: Slurm's syntax, which `arrays.compact` writes."""
    return f"--array={arrays.compact(task_ids)}" + (f"%{throttle}" if throttle else "")


def sbatch_argv(
    job: Job,
    script_path: str,
    options: BatchOptions,
    *,
    head_user: str,
    tasks: Sequence[int] = (),
    mig_types: Mapping[str, str] | None = None,
) -> list[str]:
    """`sbatch` with every option as its own argument (never a shell). For an array task `job`, the sbatch
    of its array's `tasks` (by default the job's own task), with `job`'s options. `mig_types`: the inventory's
    Slurm type of each MIG profile (`inventory_mig_types`), for a job of MIG instances. Raises InvalidInput for
    what Slurm cannot be asked through gpufleet: a container image (Slurm needs pyxis/enroot for that), another
    user's job when the head may not submit as them, or a MIG profile whose Slurm type is unknown."""
    slurms = sorted(k for k in job.env if k.startswith(SLURM_OWN))
    if slurms:
        raise InvalidInput(f"{', '.join(slurms)}: variables starting {' or '.join(SLURM_OWN)} are Slurm's own")
    if job.container:
        raise InvalidInput(
            "containers are not run through Slurm by gpufleet (Slurm needs pyxis/enroot); "
            "run the container from the job's script instead"
        )
    array = job.array_job_id is not None
    argv = [
        "sbatch",
        "--parsable",
        f"--job-name={job.name or 'gpufleet'}",
        f"--comment={job_comment(job.id if job.array_job_id is None else job.array_job_id, job.submitted_at)}",
        f"--nodes={job.nodes}",
        "--ntasks-per-node=1",
        f"--time={max(1, math.ceil(job.time_limit_s / 60))}",
        f"--export={','.join(sorted(job_environment(job)))}",  # the values: in sbatch's environment
        "--requeue" if job.requeue else "--no-requeue",
    ]
    if array:
        argv.append(array_option(tasks or [job.array_task_id or 0], job.array_throttle))
    if job.gpus_per_node:
        kind = f"{mig_gres_type(job.gpu_profile, mig_types or {})}:" if job.gpu_profile else ""
        argv.append(f"--gres=gpu:{kind}{job.gpus_per_node}")
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
        argv.append(f"--output={output_path(options.output_dir, '%A_%a' if array else '%j')}")
    if job.user != head_user:
        if not options.run_as_others:
            raise InvalidInput(
                f"the head runs as {head_user} and cannot submit job {job.id} to Slurm as {job.user}: "
                "run the head as root to submit jobs as their users"
            )
        argv.append(f"--uid={job.user}")
    argv.append(script_path)
    return argv
