"""Slurm's jobs parsed from real `squeue --json` output (22.05.8), job arrays' tasks and unstarted rest
included, the later versions' shapes, sacct's lines for jobs that left the queue, and gpufleet jobs (and
arrays) rendered as sbatch arguments and scripts."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpufleet.core.errors import InvalidInput, NotFound, Unavailable
from gpufleet.jobs.models import Job, JobState
from gpufleet.jobs.slurm import output as slurm_output
from gpufleet.jobs.slurm.batch import (
    BatchOptions,
    inventory_mig_types,
    job_environment,
    mig_gres_type,
    render_script,
    sbatch_argv,
)
from gpufleet.jobs.slurm.config import InventoryMig
from gpufleet.jobs.slurm.history import parse_sacct_end
from gpufleet.jobs.slurm.queue import (
    SlurmJob,
    job_comment,
    parse_squeue_json,
    split_task_name,
    task_name,
    task_ranges,
)

FIXTURES = Path(__file__).parent.parent / "fixtures" / "slurm"
SUBMITTED = datetime(2025, 12, 6, 5, 46, 40, 123456, tzinfo=UTC)  # 1765000000.123456


def jobs(name: str) -> dict[str, SlurmJob]:
    return {j.name: j for j in parse_squeue_json((FIXTURES / name).read_text())}


def test_running_and_pending_jobs_of_slurm_22_05() -> None:
    found = jobs("squeue-json-active.json")
    holder = found["holder"]
    assert (holder.job_id, holder.user, holder.partition, holder.slurm_state) == ("21", "nobody", "gpu", "RUNNING")
    assert holder.state == JobState.RUNNING
    assert holder.gpufleet_id == 7  # its --comment=gpufleet:7
    assert holder.nodes == ("sim001",)
    assert holder.gpus == {"sim001": [0, 1, 2]}
    assert holder.gpus_per_node == 3
    assert holder.time_limit_s == 300.0
    assert holder.started_at is not None
    assert holder.ended_at is None  # Slurm's end_time of a running job is its start plus the limit, not an end
    assert holder.exit_code is None
    waiter = found["waiter"]
    assert (waiter.state, waiter.reason, waiter.nodes, waiter.gpus) == (JobState.PENDING, "Resources", (), {})
    assert waiter.gpufleet_id is None
    assert waiter.time_limit_s is None  # no --time: the partition's INFINITE
    assert found["ok"].reason == "Priority"
    assert found["ok"].gpus_per_node == 0
    assert (found["cancelled"].state, found["cancelled"].reason) == (JobState.CANCELLED, "JobHeldUser")


def test_how_jobs_ended_in_slurm_22_05() -> None:
    found = jobs("squeue-json-ended.json")
    ended = {name: (j.state, j.exit_code, j.reason) for name, j in found.items()}
    assert ended == {
        "holder": (JobState.COMPLETED, 0, None),
        "waiter": (JobState.COMPLETED, 0, None),
        "fails": (JobState.FAILED, 5, "NonZeroExitCode"),  # exit 5: wait status 1280
        "killed": (JobState.FAILED, 128 + 9, "JobLaunchFailure"),  # SIGKILL
        "timesout": (JobState.TIMEOUT, 128 + 15, "TimeLimit"),  # SIGTERM at the limit
        "ok": (JobState.COMPLETED, 0, None),
        "cancelled": (JobState.CANCELLED, 0, "JobHeldUser"),
    }
    for job in found.values():
        assert job.ended_at is not None
        assert job.submitted_at is not None


def test_the_shapes_of_slurm_23_11_and_later() -> None:
    """From 23.02 job_state is a list of words and from 23.11 numbers are {set, infinite, number} and the
    exit code an object (field names as in Slurm's openapi v0.0.40 job description)."""
    raw = {
        "jobs": [
            {
                "job_id": 812,
                "name": "train",
                "user_name": "alice",
                "account": "vision",
                "partition": "h200",
                "job_state": ["COMPLETED"],
                "state_reason": "None",
                "comment": "gpufleet:44",
                "nodes": "gpu[001-002]",
                "node_count": {"set": True, "infinite": False, "number": 2},
                "gres_detail": ["gpu:h200:8(IDX:0-7)", "gpu:h200:8(IDX:0-7)"],
                "tres_per_node": "gres/gpu=8",
                "time_limit": {"set": True, "infinite": False, "number": 60},
                "submit_time": {"set": True, "infinite": False, "number": 1796000000},
                "start_time": {"set": True, "infinite": False, "number": 1796000010},
                "end_time": {"set": True, "infinite": False, "number": 1796003610},
                "exit_code": {"status": ["SIGNALED"], "return_code": {"set": True, "number": 0}, "signal": {"id": 9}},
            },
            {
                "job_id": 813,
                "name": "wait",
                "user_name": "bob",
                "job_state": ["PENDING", "REQUEUED"],
                "state_reason": "Priority",
                "nodes": "",
                "time_limit": {"set": False, "infinite": True, "number": 0},
                "submit_time": {"set": True, "infinite": False, "number": 1796000000},
                "start_time": {"set": True, "infinite": False, "number": 0},
                "exit_code": {"status": ["PENDING"], "return_code": {"set": True, "number": 0}},
            },
        ],
        "errors": [],
    }
    train, wait = parse_squeue_json(json.dumps(raw))
    assert (train.state, train.gpufleet_id, train.node_count, train.gpus_per_node) == (JobState.COMPLETED, 44, 2, 8)
    assert train.gpus == {"gpu001": list(range(8)), "gpu002": list(range(8))}
    assert train.time_limit_s == 3600.0
    assert train.exit_code == 128 + 9
    assert train.ended_at == datetime.fromtimestamp(1796003610, UTC)
    assert (wait.state, wait.reason, wait.time_limit_s, wait.started_at) == (JobState.PENDING, "Priority", None, None)


def array(name: str) -> dict[str, SlurmJob]:
    """An array's records by their Slurm name (`1_0`...), the rest of the array under "rest"."""
    found = parse_squeue_json((FIXTURES / name).read_text())
    return {("rest" if j.array_pending else j.slurm_name): j for j in found}


def test_an_arrays_tasks_and_its_unstarted_rest_in_slurm_22_05() -> None:
    """sbatch --array=0-5%2 --comment=gpufleet:41, task 0 exiting 3 at once, the others sleeping."""
    found = array("squeue-json-array.json")
    assert sorted(found) == ["1_0", "1_1", "1_2", "rest"]
    failed, running, rest = found["1_0"], found["1_1"], found["rest"]
    # A started task is a record of its own: its own job id, the array's id, its task id.
    assert (failed.job_id, failed.array_job_id, failed.array_task_id, failed.array_pending) == ("2", "1", 0, None)
    assert (failed.state, failed.exit_code, failed.reason) == (JobState.FAILED, 3, "NonZeroExitCode")
    assert (running.job_id, running.state, running.nodes) == ("3", JobState.RUNNING, ("sim001",))
    assert running.started_at is not None
    assert running.ended_at is None
    # The tasks not started are one record, the array's own job id, throttled by %2.
    assert (rest.job_id, rest.array_job_id, rest.array_task_id) == ("1", "1", None)
    assert (rest.array_pending, rest.state, rest.reason) == ("3-5%2", JobState.PENDING, "JobArrayTaskLimit")
    assert [t for t in range(8) if rest.stands_for(t)] == [3, 4, 5]
    assert (rest.first_pending, rest.slurm_name) == (3, "1_3")
    assert {j.gpufleet_id for j in found.values()} == {41}  # every record carries the array's comment
    assert not failed.stands_for(0)  # a task record stands for no other task


def test_the_last_unstarted_task_is_a_pending_task_record() -> None:
    found = array("squeue-json-array-last-pending.json")
    last = found["1_5"]
    assert (last.job_id, last.array_task_id, last.array_pending, last.state) == ("1", 5, None, JobState.PENDING)
    assert (found["1_3"].state, found["1_1"].state) == (JobState.RUNNING, JobState.COMPLETED)
    assert "rest" not in found


def test_an_array_cancelled_before_its_tasks_started() -> None:
    """scancel 9_4 (a pending task: it leaves no record at all), then scancel 9 (the whole array)."""
    found = array("squeue-json-array-cancelled.json")
    assert sorted(found) == ["9_0", "9_1", "rest"]
    rest = found["rest"]
    assert (rest.array_pending, rest.state) == ("2-3,5%2", JobState.CANCELLED)
    assert [t for t in range(7) if rest.stands_for(t)] == [2, 3, 5]
    assert (found["9_0"].state, found["9_0"].exit_code) == (JobState.CANCELLED, 128 + 15)


def test_array_task_strings_and_names() -> None:
    assert task_ranges("[5-999%50]") == (range(5, 1000),)
    assert task_ranges("1,3,5-7") == (range(1, 2), range(3, 4), range(5, 8))
    assert task_ranges("0-200:2%3") == (range(0, 201, 2),)
    assert [task_ranges(t) for t in ("1-5...", "", "0-9:0", "a")] == [None] * 4
    unreadable = SlurmJob("1", "n", "u", None, None, "PENDING", None, None, array_job_id="1", array_pending="0-9...")
    assert unreadable.stands_for(123)  # unknown: kept waiting rather than taken for ended
    assert (unreadable.first_pending, unreadable.slurm_name) == (None, "1")
    assert (task_name("1234", 7), split_task_name("1234_7")) == ("1234_7", ("1234", 7))
    assert [split_task_name(n) for n in ("1234", "1234_", "_7", "1234_[3-5]")] == [None] * 4
    plain = jobs("squeue-json-active.json")["holder"]  # 22.05: array_job_id 0 for a job that is no array
    assert (plain.array_job_id, plain.array_task_id, plain.array_pending, plain.slurm_name) == (None, None, None, "21")


def test_an_array_task_in_the_shapes_of_slurm_23_11_and_later() -> None:
    unset = {"set": False, "infinite": False, "number": 0}
    base = {"name": "t", "user_name": "u", "job_state": ["PENDING"], "array_task_string": ""}
    raw = {
        "jobs": [
            base
            | {
                "job_id": 90,
                "array_job_id": {"set": True, "infinite": False, "number": 88},
                "array_task_id": {"set": True, "infinite": False, "number": 4},
            },
            base
            | {
                "job_id": 88,
                "array_job_id": {"set": True, "infinite": False, "number": 88},
                "array_task_id": unset,
                "array_task_string": "5-9%2",
            },
            base | {"job_id": 91, "array_job_id": unset, "array_task_id": unset},
        ]
    }
    task, rest, plain = parse_squeue_json(json.dumps(raw))
    assert (task.slurm_name, rest.slurm_name, rest.array_pending, plain.slurm_name) == ("88_4", "88_5", "5-9%2", "91")


def test_an_unreachable_controller_and_bad_output_are_clear_errors() -> None:
    unreachable = {
        "jobs": [],
        "errors": [{"error": "Unable to contact slurm controller (connect failure)", "errno": 1}],
    }
    with pytest.raises(Unavailable, match="Unable to contact slurm controller"):
        parse_squeue_json(json.dumps(unreachable))
    with pytest.raises(InvalidInput, match="did not print JSON"):
        parse_squeue_json("JOBID PARTITION NAME")
    with pytest.raises(InvalidInput, match="no job list"):
        parse_squeue_json("{}")
    with pytest.raises(InvalidInput, match="no state"):
        parse_squeue_json(json.dumps({"jobs": [{"job_id": 1}]}))
    with pytest.raises(InvalidInput, match="unreadable node list"):
        parse_squeue_json(json.dumps({"jobs": [{"job_id": 1, "job_state": "RUNNING", "nodes": "gpu[3-1"}]}))


def test_a_comment_names_a_gpufleet_job_only_in_gpufleets_form() -> None:
    def with_comment(comment: str | None) -> int | None:
        return SlurmJob("1", "n", "u", None, None, "RUNNING", None, comment).gpufleet_id

    assert with_comment("gpufleet:12") == 12  # as gpufleet wrote them before the stamp
    assert with_comment(job_comment(12, SUBMITTED)) == 12
    bad = (None, "gpufleet:", "gpufleet:12x", "my job", "gpufleet: 3", "gpufleet:12:", "gpufleet:12:3:4")
    assert [with_comment(c) for c in bad] == [None] * len(bad)


def test_sacct_tells_how_a_job_that_left_the_queue_ended() -> None:
    lines = "30|CANCELLED by 0|0:15|2026-11-30T09:30:01\n31|COMPLETED|0:0|2026-11-30T09:31:00\n"
    assert parse_sacct_end(lines, "30") == (
        JobState.CANCELLED,
        "cancelled",
        128 + 15,
        datetime(2026, 11, 30, 9, 30, 1, tzinfo=UTC),
    )
    assert parse_sacct_end(lines, "31") == (
        JobState.COMPLETED,
        "completed",
        0,
        datetime(2026, 11, 30, 9, 31, tzinfo=UTC),
    )
    assert parse_sacct_end(lines, "32") is None
    assert parse_sacct_end("33|RUNNING|0:0|Unknown\n", "33") is None  # not ended: nothing to record
    # An array task, asked as `sacct -j 1234_7,1234_8`: JobID is Slurm's name for the task (slurmdbd).
    tasks = "1234_7|COMPLETED|0:0|2026-11-30T09:32:00\n1234_8|FAILED|2:0|2026-11-30T09:32:05\n"
    assert parse_sacct_end(tasks, "1234_8") == (
        JobState.FAILED,
        "failed",
        2,
        datetime(2026, 11, 30, 9, 32, 5, tzinfo=UTC),
    )
    assert parse_sacct_end(tasks, "1234_7") is not None
    assert parse_sacct_end(tasks, "1234") is None  # the array's id is not one of its tasks


def job(**values: object) -> Job:
    defaults: dict[str, object] = {
        "id": 5,
        "name": "train",
        "user": "alice",
        "project": "vision",
        "nodes": 2,
        "gpus_per_node": 8,
        "cpus_per_node": 0,
        "mem_per_node_mib": 0,
        "time_limit_s": 3601.0,
        "argv": ["python", "train.py", "--lr", "3e-4", "--name", "it's mine"],
        "script": None,
        "env": {},
        "workdir": None,
        "container": None,
        "requeue": False,
        "category": None,
        "submitted_at": SUBMITTED,
    }
    return Job(**(defaults | values))


def test_a_job_becomes_sbatch_arguments_one_option_each() -> None:
    argv = sbatch_argv(job(), "/tmp/s.sh", BatchOptions(partition="batch"), head_user="alice")
    assert argv == [
        "sbatch",
        "--parsable",
        "--job-name=train",
        "--comment=gpufleet:5:1765000000123456",  # the row's id and the microsecond it was submitted
        "--nodes=2",
        "--ntasks-per-node=1",
        "--time=61",  # minutes, rounded up
        "--export=PATH",  # a standard PATH; nothing of the head's environment
        "--no-requeue",
        "--gres=gpu:8",
        "--partition=batch",
        "--account=vision",
        "/tmp/s.sh",
    ]
    other = sbatch_argv(
        job(category="h200", cpus_per_node=16, mem_per_node_mib=65536, workdir="/work", requeue=True, gpus_per_node=0),
        "/tmp/s.sh",
        BatchOptions(partition="batch", output_dir=Path("/shared/out"), run_as_others=True),
        head_user="root",
    )
    assert "--gres=gpu:0" not in other
    for option in (
        "--requeue",
        "--cpus-per-task=16",
        "--mem=65536",
        "--partition=h200",
        "--chdir=/work",
        "--output=/shared/out/gpufleet-%j.out",
        "--uid=alice",
    ):
        assert option in other


def test_a_mig_job_asks_slurm_for_slurms_type_of_its_profile() -> None:
    """Slurm names an H200's 1g.18gb (16384 MiB) 1g.16gb, and slurm.conf has it so (jobs.slurm.config)."""
    mig = job(nodes=1, gpus_per_node=2, gpu_profile="1g.18gb")
    argv = sbatch_argv(mig, "s", BatchOptions(), head_user="alice")
    assert "--gres=gpu:1g.16gb:2" in argv
    assert not [a for a in argv if "1g.18gb" in a]
    # the inventory's instances say which: an A100 80GB's 3g.40gb is 3g.39gb to Slurm, an H100's 3g.40gb
    three = job(nodes=1, gpus_per_node=1, gpu_profile="3g.40gb")
    for kind in ("3g.39gb", "3g.40gb"):
        assert f"--gres=gpu:{kind}:1" in sbatch_argv(
            three, "s", BatchOptions(), head_user="alice", mig_types={"3g.40gb": kind}
        )
    with pytest.raises(InvalidInput, match=r"Slurm names MIG profile 3g\.40gb 3g\.39gb or 3g\.40gb by GPU model"):
        sbatch_argv(three, "s", BatchOptions(), head_user="alice", mig_types={"1g.18gb": "1g.16gb"})


@pytest.mark.parametrize(
    ("profile", "inventory", "expected"),
    [
        ("1g.18gb", {}, "1g.16gb"),  # H200 only
        ("7g.141gb", {}, "7g.140gb"),
        ("1g.10gb", {}, "1g.10gb"),  # 9728 MiB on an A100 80GB, 9984 on an H100: 10 GiB either way
        ("3g.40gb", {"3g.40gb": "3g.39gb"}, "3g.39gb"),
        ("3g.71gb", {"3g.71gb": "3g.64gb"}, "3g.64gb"),  # the inventory's type, as slurm.conf has it, first
    ],
)
def test_the_slurm_type_of_a_mig_profile(profile: str, inventory: dict[str, str], expected: str) -> None:
    assert mig_gres_type(profile, inventory) == expected


def test_a_mig_profile_without_a_slurm_type_is_refused() -> None:
    with pytest.raises(InvalidInput, match=r"no GPU model has MIG profile 1g\.99gb"):
        mig_gres_type("1g.99gb", {})
    with pytest.raises(InvalidInput, match="no GPU in the inventory has an instance of it"):
        mig_gres_type("4g.40gb", {})  # 4g.39gb on an A100 80GB, 4g.40gb on an H100


def test_the_inventorys_slurm_type_of_each_profile() -> None:
    a100, h100 = InventoryMig("3g.40gb", 3, 40192), InventoryMig("3g.40gb", 3, 40448)
    instances = [a100, a100, h100, InventoryMig("1g.18gb"), InventoryMig("MIG 1g.18gb", 1, 16384)]
    instances += [InventoryMig("", 1, 16384), InventoryMig("3g.40gb"), InventoryMig("4g.40gb", 4, 40192)]
    instances += [InventoryMig("4g.40gb", 4, 40448)]
    assert inventory_mig_types(instances) == {
        "3g.40gb": "3g.39gb",  # two A100 instances, one H100: the commonest
        "1g.18gb": "1g.16gb",  # with or without memory, "MIG " or not
        "4g.40gb": "4g.39gb",  # a tie: the first by name
    }
    assert inventory_mig_types([]) == {}


def test_what_cannot_go_to_slurm_is_refused_with_the_reason() -> None:
    with pytest.raises(InvalidInput, match="pyxis"):
        sbatch_argv(job(container="nvcr.io/nvidia/pytorch:24.05-py3"), "s", BatchOptions(), head_user="alice")
    with pytest.raises(InvalidInput, match="runs as gpufleet and cannot submit job 5 to Slurm as alice"):
        sbatch_argv(job(), "s", BatchOptions(), head_user="gpufleet")


def test_the_script_is_the_jobs_own_or_its_command() -> None:
    assert render_script(job()) == "#!/bin/sh\nexec python train.py --lr 3e-4 --name 'it'\"'\"'s mine'\n"
    assert (
        render_script(job(argv=[], script="#!/usr/bin/env python3\nprint(1)\n")) == "#!/usr/bin/env python3\nprint(1)\n"
    )
    assert render_script(job(argv=[], script="echo hi\n")) == "#!/bin/sh\necho hi\n"
    with pytest.raises(InvalidInput, match="neither a command nor a script"):
        render_script(job(argv=[]))


def test_the_environment_is_named_to_sbatch_and_slurms_own_variables_are_refused() -> None:
    argv = sbatch_argv(job(env={"B": "1,2", "A": "x"}), "s", BatchOptions(), head_user="alice")
    assert "--export=A,B,PATH" in argv
    with pytest.raises(InvalidInput, match="SBATCH_PARTITION, SLURM_CONF: variables starting SLURM_ or SBATCH_"):
        sbatch_argv(job(env={"SLURM_CONF": "/x", "SBATCH_PARTITION": "y"}), "s", BatchOptions(), head_user="alice")


def test_a_slurm_jobs_output_is_read_from_its_file_by_byte_offset(tmp_path: Path) -> None:
    ended = job(external_id="812", state=JobState.COMPLETED, started_at=datetime(2026, 11, 30, tzinfo=UTC), run=0)
    (tmp_path / "gpufleet-812.out").write_bytes("héllo\nwörld\n".encode())
    first = slurm_output.read(ended, tmp_path, after=0, limit_bytes=3)  # "h" and half of "é": stops before it
    assert [c.data for c in first.chunks] == ["h"]
    assert (first.next_after, first.done) == (1, False)
    rest = slurm_output.read(ended, tmp_path, after=first.next_after)
    assert [c.data for c in rest.chunks] == ["éllo\nwörld\n"]
    assert rest.done
    assert rest.next_after == len("héllo\nwörld\n".encode())
    assert slurm_output.read(ended, tmp_path, after=rest.next_after).chunks == []
    with pytest.raises(NotFound, match="set slurm_output_dir"):
        slurm_output.read(ended, None)
    with pytest.raises(NotFound, match="not there"):
        slurm_output.read(job(external_id="9", state=JobState.RUNNING, started_at=ended.started_at), tmp_path)
    waiting = slurm_output.read(job(external_id="10", state=JobState.PENDING, started_at=None), tmp_path)
    assert (waiting.chunks, waiting.done) == ([], False)


def task(**values: object) -> Job:
    """Task 7 of gpufleet's array 5 (throttle %50), with the variables submission gives it."""
    env = {
        "GPUFLEET_ARRAY_JOB_ID": "5",
        "GPUFLEET_ARRAY_TASK_ID": "7",
        "GPUFLEET_ARRAY_TASK_COUNT": "1000",
        "GPUFLEET_ARRAY_TASK_MIN": "0",
        "GPUFLEET_ARRAY_TASK_MAX": "999",
    }
    return job(**({"id": 12, "array_job_id": 5, "array_task_id": 7, "array_throttle": 50, "env": env} | values))


def test_an_array_is_one_sbatch_with_the_arrays_comment_and_shared_variables() -> None:
    options = BatchOptions(output_dir=Path("/shared/out"))
    argv = sbatch_argv(task(), "/tmp/s.sh", options, head_user="alice", tasks=[*range(7, 1000), 3])
    assert "--array=3,7-999%50" in argv
    assert "--comment=gpufleet:5:1765000000123456" in argv  # the array's id, which every task's row carries
    assert "--output=/shared/out/gpufleet-%A_%a.out" in argv  # read back as gpufleet-<array>_<task>.out
    # The task's own id differs in each task, so it cannot go through --export; the others can.
    export = next(a for a in argv if a.startswith("--export="))
    assert export == "--export=GPUFLEET_ARRAY_JOB_ID,GPUFLEET_ARRAY_TASK_COUNT,GPUFLEET_ARRAY_TASK_MAX," + (
        "GPUFLEET_ARRAY_TASK_MIN,PATH"
    )
    assert "GPUFLEET_ARRAY_TASK_ID" not in job_environment(task())
    assert job_environment(task())["GPUFLEET_ARRAY_JOB_ID"] == "5"
    unthrottled = sbatch_argv(task(array_throttle=None), "s", BatchOptions(), head_user="alice")
    assert "--array=7" in unthrottled  # by default the task itself


def test_an_array_tasks_shell_script_sets_its_task_id_from_slurms() -> None:
    line = 'export GPUFLEET_ARRAY_TASK_ID="$SLURM_ARRAY_TASK_ID"\n'
    assert render_script(task()) == f"#!/bin/sh\n{line}exec python train.py --lr 3e-4 --name 'it'\"'\"'s mine'\n"
    assert render_script(task(argv=[], script="echo $GPUFLEET_ARRAY_TASK_ID")) == (
        f"#!/bin/sh\n{line}echo $GPUFLEET_ARRAY_TASK_ID"
    )
    # After the comments under the #! line: sbatch stops reading #SBATCH lines at the first command.
    script = "#!/bin/bash -e\n#SBATCH --nice=5\n\n# sweep\nrun $GPUFLEET_ARRAY_TASK_ID\n"
    assert render_script(task(argv=[], script=script)) == (
        f"#!/bin/bash -e\n#SBATCH --nice=5\n\n# sweep\n{line}run $GPUFLEET_ARRAY_TASK_ID\n"
    )
    for shebang in ("#!/usr/bin/env bash", "#!/usr/bin/env -S sh -e", "#!/bin/dash", "#! /bin/sh"):
        assert line in render_script(task(argv=[], script=f"{shebang}\necho\n")), shebang
    assert render_script(task(argv=[], script="#!/bin/sh")) == f"#!/bin/sh\n{line}"
    # Another language reads SLURM_ARRAY_TASK_ID (the same number): its script is left as it is.
    for other in ("#!/usr/bin/env python3\nprint(1)\n", "#!/usr/bin/perl\nprint 1;\n", "#!/bin/shellcheck\n"):
        assert render_script(task(argv=[], script=other)) == other
    assert line not in render_script(job())  # a job that is no array gets no such line
