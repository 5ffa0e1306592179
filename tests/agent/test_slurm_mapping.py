"""The Slurm job map's reader: the pure parse on data, then `SlurmJobMap` over a real directory laid out
as the prolog lays it out (dcgm-exporter's format, plus the jobs' details)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpufleet.agent.metrics.ports import CollectorError
from gpufleet.agent.metrics.sampler import Sampler
from gpufleet.agent.slurm import script_path
from gpufleet.agent.slurm.mapping import (
    MAX_FILE_BYTES,
    MAX_JOBS_PER_GPU,
    JobDetails,
    SlurmJobMap,
    parse_job_file,
    parse_job_map,
)
from gpufleet.protocol.metrics import MAX_GPU_JOBS_PER_SAMPLE, GpuJob

ALICE = "user=alice\naccount=vision\npartition=gpu\n"


def test_a_job_file_gives_user_account_and_partition() -> None:
    assert parse_job_file(ALICE) == JobDetails("alice", "vision", "gpu")
    # A newer prolog's extra keys, junk lines and blanks are ignored; nothing known is empty.
    assert parse_job_file("qos=high\nnonsense\n user = bob \n") == JobDetails(user="bob")
    assert parse_job_file("") == JobDetails()


def test_each_gpu_gets_a_row_per_job_holding_it_with_the_jobs_details() -> None:
    jobs, problems = parse_job_map({2: "41\n", 0: "40\n", 1: "40\n41\n"}, {"40": ALICE, "41": "user=bob\naccount=\n"})

    assert jobs == [
        GpuJob(gpu=0, job="40", user="alice", account="vision"),
        GpuJob(gpu=1, job="40", user="alice", account="vision"),
        GpuJob(gpu=1, job="41", user="bob", account=""),
        GpuJob(gpu=2, job="41", user="bob", account=""),
    ]
    assert problems == []


def test_a_gpu_file_without_the_jobs_details_still_maps_the_gpu() -> None:
    # What another tool writing dcgm-exporter's format leaves: ids only.
    jobs, problems = parse_job_map({3: "77\n"}, {})

    assert jobs == [GpuJob(gpu=3, job="77")]
    assert problems == []


def test_bad_lines_and_values_are_dropped_and_said() -> None:
    jobs, problems = parse_job_map(
        {0: "12\n\n12\nrm -rf /\n13\n", 300: "14\n"},
        {"12": "user=alice\naccount=a b\n", "13": "user=" + "x" * 65 + "\n"},
    )

    assert jobs == [GpuJob(gpu=0, job="12", user="alice"), GpuJob(gpu=0, job="13")]
    assert problems == [
        "GPU 0: 'rm -rf /' is not a job id",
        "job 12: account 'a b' refused (at most 64 of A-Z a-z 0-9 _ . @ $ -)",
        f"job 13: user {'x' * 40!r} refused (at most 64 of A-Z a-z 0-9 _ . @ $ -)",
        "GPU 300: not a GPU index (0 to 255)",
    ]


def test_the_map_is_bounded() -> None:
    crowded = "".join(f"{i}\n" for i in range(MAX_JOBS_PER_GPU + 3))
    jobs, problems = parse_job_map({0: crowded}, {})
    assert [j.job for j in jobs] == [str(i) for i in range(MAX_JOBS_PER_GPU)]
    assert problems == [f"GPU 0: {MAX_JOBS_PER_GPU + 3} jobs, only the first {MAX_JOBS_PER_GPU} kept"]

    many = {gpu: "".join(f"{gpu}{i}\n" for i in range(MAX_JOBS_PER_GPU)) for gpu in range(64)}
    jobs, problems = parse_job_map(many, {})
    assert len(jobs) == MAX_GPU_JOBS_PER_SAMPLE
    assert problems == [f"{64 * MAX_JOBS_PER_GPU} GPU jobs, only the first {MAX_GPU_JOBS_PER_SAMPLE} kept"]


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_the_reader_reads_the_directory_and_skips_what_is_not_a_gpu_file(tmp_path: Path) -> None:
    _write(tmp_path / "0", "40\n")
    _write(tmp_path / "3", "40\n")
    _write(tmp_path / "jobs" / "40", ALICE)
    _write(tmp_path / ".gpufleet.Xy12ab", "99\n")  # a write in progress
    _write(tmp_path / ".lock", "")
    _write(tmp_path / "README", "1\n")
    (tmp_path / "7").mkdir()  # a directory named like a GPU

    collected = SlurmJobMap(tmp_path).collect()

    assert collected.gpu_jobs == [
        GpuJob(gpu=0, job="40", user="alice", account="vision"),
        GpuJob(gpu=3, job="40", user="alice", account="vision"),
    ]
    assert collected.entities == {}  # it adds no metric values
    assert collected.problems == []


def test_a_missing_directory_is_an_empty_map_and_an_unreadable_one_fails(tmp_path: Path) -> None:
    assert SlurmJobMap(tmp_path / "not-yet").collect().gpu_jobs == []  # no job since boot
    _write(tmp_path / "file", "")
    with pytest.raises(CollectorError, match="cannot list"):
        SlurmJobMap(tmp_path / "file").collect()


def test_links_and_oversized_files_are_not_read(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    _write(secret, "123\n")
    (tmp_path / "map").mkdir()
    os.symlink(secret, tmp_path / "map" / "0")
    _write(tmp_path / "map" / "1", "5\n" * (MAX_FILE_BYTES // 2 + 1))
    _write(tmp_path / "map" / "2", "6\n")
    os.symlink(secret, tmp_path / "map" / "jobs")  # the details' directory through a link: not followed

    collected = SlurmJobMap(tmp_path / "map").collect()

    assert collected.gpu_jobs == [GpuJob(gpu=2, job="6")]
    assert collected.problems == [
        f"{tmp_path / 'map' / '1'}: over {MAX_FILE_BYTES} bytes, not read",
        f"{tmp_path / 'map' / 'jobs'}: a symbolic link, not read",
    ]


def test_the_sampler_sends_the_map_with_the_sample_and_reports_problems_once(tmp_path: Path) -> None:
    _write(tmp_path / "1", "40\nnot a job\n")
    sampler = Sampler([SlurmJobMap(tmp_path)], clock=lambda: 5.0)

    sample, events = sampler.collect()
    again, events_again = sampler.collect()

    assert sample.gpu_jobs == again.gpu_jobs == [GpuJob(gpu=1, job="40")]
    assert [e.message for e in events] == ["slurm_jobs: GPU 1: 'not a job' is not a job id"]
    assert events_again == []
    (tmp_path / "1").unlink()  # the epilog ran
    assert sampler.collect()[0].gpu_jobs == []


def test_the_scripts_ship_with_the_package() -> None:
    for which in ("prolog", "epilog"):
        path = script_path(which)
        assert path.name == f"{which}.sh"
        assert path.read_text().startswith("#!/bin/sh\n")
        assert os.access(path, os.X_OK), f"{path} must be executable: Slurm runs it directly"
