"""The shipped Slurm prolog and epilog, run as slurmd runs them (a clean environment with the job's
variables, as Slurm 22.05 sets them; see tests/slurm/test_slurm_jobmap.py for the real thing) over a
temporary map directory, under dash, bash --posix and busybox sh (each skipped, naming it, where it is
missing). What they write is read back with the agent's reader, so the two cannot drift apart."""

from __future__ import annotations

import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from gpufleet.agent.slurm import script_path
from gpufleet.agent.slurm.mapping import SlurmJobMap
from gpufleet.protocol.metrics import GpuJob

SHELLS = [pytest.param(shell, marks=pytest.mark.requires_tool(shell)) for shell in ("dash", "bash", "busybox")]


@pytest.fixture(params=SHELLS)
def shell(request: pytest.FixtureRequest) -> list[str]:
    name = str(request.param)
    if name == "busybox":
        return ["busybox", "sh"]
    return [name, "--posix"] if name == "bash" else [name]


@pytest.fixture
def bin_dir(tmp_path: Path) -> Path:
    """A `logger` that writes to a file instead of syslog, first on PATH."""
    path = tmp_path / "bin"
    path.mkdir()
    logger = path / "logger"
    logger.write_text(f'#!/bin/sh\necho "$*" >>{tmp_path / "syslog"}\n')
    logger.chmod(0o755)
    return path


def _run(
    shell: list[str], bin_dir: Path, which: str, job: str, *args: str, **env: str
) -> subprocess.CompletedProcess[str]:
    """One prolog or epilog run with slurmd's kind of environment: nothing but the job's variables."""
    environ = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_ID": job, **env}
    return subprocess.run(
        [*shell, str(script_path(which)), *args],
        env=environ,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def _prolog(shell: list[str], bin_dir: Path, job: str, gpus: str | None, *args: str, **env: str) -> str:
    env = {"SLURM_JOB_USER": "alice", "SLURM_JOB_ACCOUNT": "vision", "SLURM_JOB_PARTITION": "gpu", **env}
    if gpus is not None:
        env["SLURM_JOB_GPUS"] = gpus
    result = _run(shell, bin_dir, "prolog", job, *args, **env)
    assert result.returncode == 0, result.stderr
    return result.stderr


def _epilog(shell: list[str], bin_dir: Path, job: str, *args: str, **env: str) -> str:
    result = _run(shell, bin_dir, "epilog", job, *args, **env)
    assert result.returncode == 0, result.stderr
    return result.stderr


def _files(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): p.read_text() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_the_prolog_maps_the_jobs_gpus_as_dcgm_exporter_reads_them(
    shell: list[str], bin_dir: Path, tmp_path: Path
) -> None:
    jobmap = tmp_path / "jobmap"

    assert _prolog(shell, bin_dir, "4242", "1,3", str(jobmap)) == ""

    assert _files(jobmap) == {
        ".lock": "",
        "1": "4242\n",
        "3": "4242\n",
        "jobs/4242": "user=alice\naccount=vision\npartition=gpu\n",
    }
    for name in ("1", "3", "jobs/4242"):  # readable by an agent that is not root
        assert stat.S_IMODE((jobmap / name).stat().st_mode) == 0o644
    assert SlurmJobMap(jobmap).collect().gpu_jobs == [
        GpuJob(gpu=1, job="4242", user="alice", account="vision"),
        GpuJob(gpu=3, job="4242", user="alice", account="vision"),
    ]


def test_the_epilog_removes_only_its_own_job(shell: list[str], bin_dir: Path, tmp_path: Path) -> None:
    jobmap = tmp_path / "jobmap"
    _prolog(shell, bin_dir, "10", "0,1", str(jobmap))
    _prolog(shell, bin_dir, "11", "1,2", str(jobmap), SLURM_JOB_USER="bob", SLURM_JOB_ACCOUNT="")  # shares GPU 1
    _prolog(shell, bin_dir, "11", "1,2", str(jobmap), SLURM_JOB_USER="bob", SLURM_JOB_ACCOUNT="")  # a rerun
    assert (jobmap / "1").read_text() == "10\n11\n"

    # Without SLURM_JOB_GPUS: the epilog finds the job's GPUs in the map itself.
    _epilog(shell, bin_dir, "10", str(jobmap))

    assert _files(jobmap) == {
        ".lock": "",
        "1": "11\n",
        "2": "11\n",
        "jobs/11": "user=bob\naccount=\npartition=gpu\n",
    }
    _epilog(shell, bin_dir, "11", str(jobmap), SLURM_JOB_GPUS="1,2")
    _epilog(shell, bin_dir, "11", str(jobmap))  # twice: nothing left to remove, still fine
    assert _files(jobmap) == {".lock": ""}
    assert SlurmJobMap(jobmap).collect().gpu_jobs == []


def test_a_file_naming_another_job_is_left_alone(shell: list[str], bin_dir: Path, tmp_path: Path) -> None:
    jobmap = tmp_path / "jobmap"
    _prolog(shell, bin_dir, "7", "0", str(jobmap))
    (jobmap / "0").write_text("8\n")  # say the GPU went to job 8 since (a lost epilog, a manual fix)

    _epilog(shell, bin_dir, "7", str(jobmap), SLURM_JOB_GPUS="0")

    assert (jobmap / "0").read_text() == "8\n"
    assert not (jobmap / "jobs" / "7").exists()


def test_a_job_without_gpus_writes_nothing(shell: list[str], bin_dir: Path, tmp_path: Path) -> None:
    jobmap = tmp_path / "jobmap"
    assert _prolog(shell, bin_dir, "5", None, str(jobmap)) == ""
    assert not jobmap.exists()
    assert _epilog(shell, bin_dir, "5", str(jobmap)) == ""


def test_the_directory_comes_from_the_argument_then_the_environment(
    shell: list[str], bin_dir: Path, tmp_path: Path
) -> None:
    from_env, from_arg = tmp_path / "env", tmp_path / "arg"

    _prolog(shell, bin_dir, "1", "0", GPUFLEET_SLURM_JOB_MAP_DIR=str(from_env))
    _prolog(shell, bin_dir, "2", "1", str(from_arg), GPUFLEET_SLURM_JOB_MAP_DIR=str(from_env))

    assert (from_env / "0").read_text() == "1\n"
    assert not (from_env / "1").exists()
    assert (from_arg / "1").read_text() == "2\n"
    _epilog(shell, bin_dir, "1", GPUFLEET_SLURM_JOB_MAP_DIR=str(from_env))
    assert not (from_env / "0").exists()
    assert "/run/gpufleet/slurm-jobs}" in script_path("prolog").read_text()  # the agent's default
    assert "/run/gpufleet/slurm-jobs}" in script_path("epilog").read_text()


def test_mapping_problems_never_fail_the_job(shell: list[str], bin_dir: Path, tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("")

    # A directory that cannot be created: Slurm would drain the node on a non-zero exit.
    stderr = _prolog(shell, bin_dir, "3", "0", str(blocked / "jobmap"))
    assert f"gpufleet-prolog: job 3: cannot create {blocked}/jobmap/jobs" in stderr
    assert f"prolog: job 3: cannot create {blocked}/jobmap/jobs" in (tmp_path / "syslog").read_text()
    assert _epilog(shell, bin_dir, "3", str(blocked / "jobmap")) == ""  # nothing there to clean

    jobmap = tmp_path / "jobmap"
    assert "is not a job id" in _prolog(shell, bin_dir, "3;reboot", "0", str(jobmap))
    assert not jobmap.exists()
    assert "'x' is not a GPU index" in _prolog(shell, bin_dir, "4", "0,x,2", str(jobmap))
    assert sorted(p.name for p in jobmap.iterdir()) == [".lock", "0", "2", "jobs"]
    assert "is not a job id" in _epilog(shell, bin_dir, "", str(jobmap))
    assert (jobmap / "0").exists()


def test_a_failed_write_is_reported_and_leaves_the_old_file(shell: list[str], bin_dir: Path, tmp_path: Path) -> None:
    jobmap = tmp_path / "jobmap"
    _prolog(shell, bin_dir, "1", "0", str(jobmap))
    _prolog(shell, bin_dir, "3", "0", str(jobmap))  # shares GPU 0 with job 1
    before = _files(jobmap)
    mktemp = bin_dir / "mktemp"  # a full or read-only file system, which root meets too
    mktemp.write_text("#!/bin/sh\necho 'mktemp: No space left on device' >&2\nexit 1\n")
    mktemp.chmod(0o755)

    stderr = _prolog(shell, bin_dir, "2", "0,1", str(jobmap))
    assert f"cannot write {jobmap}/0" in stderr
    assert f"cannot write {jobmap}/jobs/2" in stderr
    stderr = _epilog(shell, bin_dir, "1", str(jobmap))
    assert f"cannot rewrite {jobmap}/0" in stderr

    # GPU 0's file whole, as it was (never half written); job 1's details gone: removing needs no new file.
    assert before["0"] == "1\n3\n"
    assert _files(jobmap) == {name: text for name, text in before.items() if name != "jobs/1"}


def test_they_run_without_a_path_as_slurmd_starts_them(shell: list[str], tmp_path: Path) -> None:
    jobmap = tmp_path / "jobmap"
    environ = {"SLURM_JOB_ID": "9", "SLURM_JOB_GPUS": "0"}  # slurmd 22.05 passes no PATH
    argv = [shutil.which(shell[0]) or shell[0], *shell[1:]]
    for which in ("prolog", "epilog"):
        done = subprocess.run(
            [*argv, str(script_path(which)), str(jobmap)],
            env=environ,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert (done.returncode, done.stderr) == (0, "")
        if which == "prolog":
            assert (jobmap / "0").read_text() == "9\n"
    assert not (jobmap / "0").exists()
