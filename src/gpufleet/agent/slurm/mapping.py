"""Which Slurm job holds which GPU of this node, as gpufleet's Slurm prolog wrote it down.

The map directory (`slurm_job_map_dir`) is in dcgm-exporter's HPC job mapping format, so one prolog
serves both gpufleet and dcgm-exporter's `--hpc-job-mapping-dir`:

    <dir>/<gpu index>    the ids of the jobs holding that GPU, one a line (several when Slurm shares it)
    <dir>/jobs/<job id>  the job's details, `key=value` lines: user, account, partition

The prolog and epilog replace files whole (written aside, then renamed), so a file read here is an old
or a new version, never half of one. Anything else in the directory (their temporary files, the lock,
names that are not numbers) is skipped, as dcgm-exporter skips it. The map is read every sample round:
a dozen small files, cheaper than one NVML call.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pydantic import TypeAdapter, ValidationError

from gpufleet.agent.metrics.ports import Collected, CollectorError
from gpufleet.protocol.metrics import MAX_GPU_JOBS_PER_SAMPLE, GpuJob, JobId, JobOwner

MAX_GPU_INDEX = 255  # as GpuJob.gpu
MAX_JOBS_PER_GPU = 8  # Slurm shares a GPU among a few jobs at most (shards); more is a stale map
MAX_FILE_BYTES = 4096  # a GPU file of 8 ids or a job file is a few dozen bytes
_GPU_FILE = re.compile(r"^[0-9]{1,3}$")
_job_id = TypeAdapter(JobId)
_owner = TypeAdapter(JobOwner)


@dataclass(frozen=True)
class JobDetails:
    """What the prolog recorded about a job; empty where Slurm gave nothing (no account without accounting)."""

    user: str = ""
    account: str = ""
    partition: str = ""


def parse_job_file(text: str) -> JobDetails:
    """The `key=value` lines of `<dir>/jobs/<id>`. Unknown keys and lines without `=` are ignored (a
    newer prolog may write more); the last of a repeated key wins."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip()
    return JobDetails(values.get("user", ""), values.get("account", ""), values.get("partition", ""))


def parse_job_map(gpu_files: Mapping[int, str], job_files: Mapping[str, str]) -> tuple[list[GpuJob], list[str]]:
    """The GPU files' text (by GPU index) and the job files' text (by job id) → one `GpuJob` per (GPU,
    job), by GPU index then as listed, and the problems seen (one line each). Raises nothing.

    A line that is not a job id is skipped; a user or account the protocol refuses is left empty, so
    the GPU still carries the job; a GPU naming more than MAX_JOBS_PER_GPU jobs keeps the first ones.
    """
    jobs: list[GpuJob] = []
    problems: list[str] = []
    details: dict[str, JobDetails] = {}
    for gpu in sorted(gpu_files):
        if not 0 <= gpu <= MAX_GPU_INDEX:
            problems.append(f"GPU {gpu}: not a GPU index (0 to {MAX_GPU_INDEX})")
            continue
        ids: list[str] = []
        for line in gpu_files[gpu].splitlines():
            job = line.strip()
            if not job or job in ids:
                continue
            try:
                ids.append(_job_id.validate_python(job))
            except ValidationError:
                problems.append(f"GPU {gpu}: {job[:40]!r} is not a job id")
        if len(ids) > MAX_JOBS_PER_GPU:
            problems.append(f"GPU {gpu}: {len(ids)} jobs, only the first {MAX_JOBS_PER_GPU} kept")
            ids = ids[:MAX_JOBS_PER_GPU]
        for job in ids:
            if job not in details:
                details[job] = _checked(job, parse_job_file(job_files.get(job, "")), problems)
            jobs.append(GpuJob(gpu=gpu, job=job, user=details[job].user, account=details[job].account))
    if len(jobs) > MAX_GPU_JOBS_PER_SAMPLE:
        problems.append(f"{len(jobs)} GPU jobs, only the first {MAX_GPU_JOBS_PER_SAMPLE} kept")
        jobs = jobs[:MAX_GPU_JOBS_PER_SAMPLE]
    return jobs, problems


def _checked(job: str, found: JobDetails, problems: list[str]) -> JobDetails:
    """The details with a user or account the protocol refuses left empty (and said so)."""

    def valid(field: str, value: str) -> str:
        try:
            return _owner.validate_python(value)
        except ValidationError:
            problems.append(f"job {job}: {field} {value[:40]!r} refused (at most 64 of A-Z a-z 0-9 _ . @ $ -)")
            return ""

    return JobDetails(valid("user", found.user), valid("account", found.account), found.partition)


class SlurmJobMap:
    """A metrics `Collector` that contributes no values, only `gpu_jobs`: the job map read each round.

    A directory that does not exist is an empty map, not a failure: /run is emptied at boot and the
    prolog creates the directory with the first job, so an agent started before any job finds it later.
    """

    name = "slurm_jobs"

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def collect(self) -> Collected:
        """Raises CollectorError when the directory exists but cannot be listed."""
        try:
            entries = list(os.scandir(self.directory))
        except FileNotFoundError:
            return Collected()
        except OSError as exc:
            raise CollectorError(f"cannot list {self.directory}: {exc.strerror or exc}") from exc
        problems: list[str] = []
        gpu_files: dict[int, str] = {}
        for entry in entries:
            if _GPU_FILE.match(entry.name) and entry.is_file(follow_symlinks=False):
                text = self._read(Path(entry.path), problems)
                if text is not None:
                    gpu_files[int(entry.name)] = text
        job_files: dict[str, str] = {}
        details = self.directory / "jobs"
        if details.is_symlink():  # O_NOFOLLOW guards a file's last component only
            problems.append(f"{details}: a symbolic link, not read")
        else:
            wanted = {line.strip() for text in gpu_files.values() for line in text.splitlines()}
            for job in sorted(wanted)[:MAX_GPU_JOBS_PER_SAMPLE]:
                if _is_job_id(job):
                    text = self._read(details / job, problems)
                    if text is not None:
                        job_files[job] = text
        jobs, more = parse_job_map(gpu_files, job_files)
        return Collected(gpu_jobs=jobs, problems=problems + more)

    def _read(self, path: Path, problems: list[str]) -> str | None:
        """A small file's text, never through a link; None if it is not there: the epilog removed it
        meanwhile, or (a job's details) whatever wrote the GPU file wrote none."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                problems.append(f"{path}: a symbolic link, not read")
            else:
                problems.append(f"{path}: {exc.strerror or exc}")
            return None
        with os.fdopen(fd, "rb") as file:
            data = file.read(MAX_FILE_BYTES + 1)
        if len(data) > MAX_FILE_BYTES:
            problems.append(f"{path}: over {MAX_FILE_BYTES} bytes, not read")
            return None
        return data.decode("utf-8", errors="replace")


def _is_job_id(text: str) -> bool:
    try:
        _job_id.validate_python(text)
    except ValidationError:
        return False
    return True
