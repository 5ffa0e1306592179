"""ProcessExecutor with real processes on this machine: environment, output, exit codes, the process
tree on cancel and at the time limit, users, workdirs, cgroup files (on a fake cgroup root) and real
containers (podman and bubblewrap, installed by scripts/services/containers.sh)."""

from __future__ import annotations

import asyncio
import itertools
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from filelock import FileLock

from gpufleet.agent.jobs.cgroups import CgroupParent
from gpufleet.agent.jobs.containers import (
    Containers,
    bwrap_command,
    env_file_text,
    podman_command,
    podman_environment,
)
from gpufleet.agent.jobs.identity import DEFAULT_PATH, CannotStart, Identity, identity
from gpufleet.agent.jobs.ports import JobExecutor, RankResult
from gpufleet.agent.jobs.process import ProcessExecutor
from gpufleet.protocol.jobs import MAX_OUTPUT_CHUNK, JobStart
from tests.conftest import ROOT, alive, need
from tests.services import require_tool

GRACE_S = 0.5
IMAGE = "localhost/gpufleet/busybox:test"
# Per process: the xdist workers share podman's storage, where a container's name holds its job id.
_job_ids = itertools.count(1 + (os.getpid() % 100_000) * 10_000)


def launch(**fields: Any) -> JobStart:
    base: dict[str, Any] = {
        "job_id": next(_job_ids),
        "run": 1,
        "rank": 0,
        "world_size": 1,
        "user": pwd.getpwuid(os.geteuid()).pw_name,
        "time_limit_s": 30,
    }
    return JobStart(**(base | fields))


@dataclass
class Ran:
    result: RankResult
    chunks: list[tuple[str, str]] = field(default_factory=list)
    started: int = 0
    seconds: float = 0.0

    def text(self, stream: str = "stdout") -> str:
        return "".join(text for name, text in self.chunks if name == stream)


def run(
    executor: JobExecutor, start: JobStart, *, cancel_when: Path | None = None, lines: int = 1, cancel_after: float = 0
) -> Ran:
    """Run one rank; with `cancel_when`, cancel it once that file has `lines` lines (and `cancel_after` s)."""
    chunks: list[tuple[str, str]] = []
    started = 0

    def on_started() -> None:
        nonlocal started
        started += 1

    async def scenario() -> RankResult:
        cancel = asyncio.Event()

        async def canceller() -> None:
            assert cancel_when is not None
            await asyncio.to_thread(wait_for_lines, cancel_when, lines)
            await asyncio.sleep(cancel_after)
            cancel.set()

        task = asyncio.create_task(canceller()) if cancel_when else None
        result = await executor.run(start, on_started, lambda stream, text: chunks.append((stream, text)), cancel)
        if task:
            task.cancel()
        return result

    began = time.monotonic()
    result = asyncio.run(asyncio.wait_for(scenario(), 60))
    return Ran(result, chunks, started, time.monotonic() - began)


def wait_for_lines(path: Path, lines: int) -> None:
    while not (path.exists() and len(path.read_text().split()) >= lines):
        time.sleep(0.02)


def pids_in(path: Path) -> list[int]:
    return [int(word) for word in path.read_text().split()]


@pytest.fixture
def executor(tmp_path: Path) -> ProcessExecutor:
    return ProcessExecutor(tmp_path / "spool", min_uid=0, grace_s=GRACE_S, track_s=0.05)


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory anyone may write to, under a path anyone may reach (pytest's tmp_path is root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="gpufleet-test-jobs-"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def need_root() -> None:
    if os.geteuid() != 0:
        need("root", "running jobs as another user needs the tests to run as root")


# -- environment -------------------------------------------------------------------------------------


def test_the_environment_is_the_jobs_own(executor: ProcessExecutor, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFLEET_TEST_AGENT_ONLY", "leaked")
    start = launch(
        argv=["env"],
        env={"FOO": "bar baz", "CUDA_VISIBLE_DEVICES": "all", "GPUFLEET_JOB_ID": "999", "PATH": "/opt/x/bin:/usr/bin"},
        gpu_uuids=["GPU-11111111-2222-3333-4444-555555555555", "GPU-66666666-7777-8888-9999-000000000000"],
        gpu_indexes=[2, 5],
        world_size=4,
        rank=3,
        master_addr="10.0.0.7",
        master_port=29600,
    )

    ran = run(executor, start)

    assert ran.result == RankResult("completed", 0)
    env = dict(line.split("=", 1) for line in ran.text().splitlines())
    assert "GPUFLEET_TEST_AGENT_ONLY" not in env
    me = pwd.getpwuid(os.geteuid())
    assert env["HOME"] == me.pw_dir
    assert env["USER"] == env["LOGNAME"] == me.pw_name
    assert env["SHELL"] == me.pw_shell
    assert env["FOO"] == "bar baz"
    assert env["PATH"] == "/opt/x/bin:/usr/bin"  # the job may choose its PATH...
    # ...but not what the allocation fixes
    assert env["CUDA_VISIBLE_DEVICES"] == ",".join(start.gpu_uuids)
    assert env["GPUFLEET_JOB_ID"] == str(start.job_id)
    assert env["GPUFLEET_JOB_RUN"] == "1"
    assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["WORLD_SIZE"], env["NODE_RANK"]) == (
        "10.0.0.7",
        "29600",
        "4",
        "3",
    )
    assert (env["PET_NNODES"], env["PET_NODE_RANK"]) == ("4", "3")
    assert (env["PET_MASTER_ADDR"], env["PET_MASTER_PORT"]) == ("10.0.0.7", "29600")
    assert "RANK" not in env  # torchrun sets it per process


def test_a_job_without_gpus_sees_none(executor: ProcessExecutor) -> None:
    ran = run(executor, launch(script='printf "[%s]" "${CUDA_VISIBLE_DEVICES-unset}"'))

    assert ran.text() == "[]"


# -- output ----------------------------------------------------------------------------------------


def test_output_is_streamed_in_order_in_bounded_chunks_and_kept_on_the_node(executor: ProcessExecutor) -> None:
    # 300,000 two-byte characters: reads split some of them, which the incremental decoder rejoins.
    script = (
        'for i in $(seq 1 2000); do echo "line $i"; done; echo oops >&2; '
        'head -c 300000 /dev/zero | tr "\\0" x | sed "s/x/é/g"; printf "\\377\\n" >&2'
    )
    start = launch(script=script)

    ran = run(executor, start)

    assert ran.result.outcome == "completed"
    assert ran.started == 1
    expected = "".join(f"line {i}\n" for i in range(1, 2001)) + "é" * 300_000
    assert ran.text() == expected
    assert ran.text("stderr") == "oops\n\ufffd\n"
    assert all(0 < len(text) <= MAX_OUTPUT_CHUNK for _, text in ran.chunks)
    base = executor.spool_dir / f"{start.job_id}-1-0"
    assert base.with_suffix(".out").read_text() == expected
    assert base.with_suffix(".err").read_bytes() == b"oops\n\xff\n"
    assert base.with_suffix(".out").stat().st_mode & 0o777 == 0o600


# -- exit codes and failures -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ("exit 0", RankResult("completed", 0)),
        ("exit 3", RankResult("failed", 3, "exited with code 3")),
        ("kill -KILL $$", RankResult("failed", -9, "killed by SIGKILL")),
        ("no-such-command-gpufleet", RankResult("failed", 127, "exited with code 127")),
    ],
)
def test_exit_codes(executor: ProcessExecutor, script: str, expected: RankResult) -> None:
    assert run(executor, launch(script=script)).result == expected


def test_a_command_that_does_not_exist_is_an_error_not_an_exception(executor: ProcessExecutor) -> None:
    ran = run(executor, launch(argv=["/no/such/program", "--flag"]))

    assert ran.result.outcome == "error"
    assert "/no/such/program" in ran.result.message
    assert ran.started == 0


def test_nothing_to_run_is_an_error(executor: ProcessExecutor) -> None:
    assert run(executor, launch()).result == RankResult(
        "error", message="nothing to run: the job has neither argv nor script"
    )


# -- the process tree ------------------------------------------------------------------------------

# A tree that is hard to end: a background child, one that ignores SIGTERM, a grandchild that left the
# session with setsid while its parent lives, and one whose parent is already gone. Each writes its pid.
HARD_TREE = """
sleep 300 & echo $! >> {pids}
sh -c 'trap "" TERM; echo $$ >> {pids}; while :; do sleep 0.05; done' &
sh -c 'setsid sh -c "echo \\$\\$ >> {pids}; exec sleep 300"; sleep 300' &
sh -c 'setsid sh -c "echo \\$\\$ >> {pids}; exec sleep 300" & sleep 0.3' &
echo $$ >> {pids}
wait
"""


def test_cancel_kills_the_whole_tree_even_what_left_the_session(executor: ProcessExecutor, tmp_path: Path) -> None:
    pids = tmp_path / "pids"

    # cancel once all five are up and the orphan's parent has exited (0.3 s)
    ran = run(executor, launch(script=HARD_TREE.format(pids=pids)), cancel_when=pids, lines=5, cancel_after=0.5)

    assert ran.result.outcome == "cancelled"
    assert ran.result.exit_code == -15
    assert len(pids_in(pids)) == 5
    assert [pid for pid in pids_in(pids) if alive(pid)] == []
    assert ran.seconds < 0.8 + GRACE_S + 2  # one grace period, then SIGKILL


def test_the_time_limit_ends_the_whole_tree(executor: ProcessExecutor, tmp_path: Path) -> None:
    pids = tmp_path / "pids"

    ran = run(executor, launch(script=HARD_TREE.format(pids=pids), time_limit_s=1))

    assert ran.result.outcome == "timeout"
    assert ran.result.message == "time limit of 1 s reached"
    assert [pid for pid in pids_in(pids) if alive(pid)] == []
    assert 1 <= ran.seconds < 1 + GRACE_S + 2


def test_what_the_job_leaves_behind_is_ended_when_it_exits(executor: ProcessExecutor, tmp_path: Path) -> None:
    pids = tmp_path / "pids"

    ran = run(executor, launch(script=f"sleep 300 & echo $! > {pids}; echo done"))

    assert ran.result == RankResult("completed", 0)
    assert ran.text() == "done\n"
    assert not alive(pids_in(pids)[0])
    assert ran.seconds < GRACE_S + 2


# -- users and workdirs ----------------------------------------------------------------------------


def test_runs_as_the_submitting_user(executor: ProcessExecutor, open_dir: Path) -> None:
    need_root()
    nobody = pwd.getpwnam("nobody")
    script = 'id -u; id -g; echo "$HOME $USER"; pwd; touch "$GPUFLEET_OUT/mine" && echo wrote'

    ran = run(executor, launch(user="nobody", script=script, env={"GPUFLEET_OUT": str(open_dir)}))

    assert ran.result.outcome == "completed", ran.chunks
    # nobody's home does not exist, so the job runs in /
    assert ran.text().splitlines() == [str(nobody.pw_uid), str(nobody.pw_gid), f"{nobody.pw_dir} nobody", "/", "wrote"]
    assert (open_dir / "mine").stat().st_uid == nobody.pw_uid


def test_a_workdir_the_user_cannot_reach_is_an_error(executor: ProcessExecutor, tmp_path: Path) -> None:
    need_root()
    inner = tmp_path / "inner"  # open itself, but below pytest's directory, which is root's alone
    inner.mkdir(mode=0o777)

    ran = run(executor, launch(user="nobody", argv=["ls"], workdir=str(inner)))

    assert ran.result.outcome == "error"
    assert ran.result.message.startswith(f"cannot start ls as nobody in {inner}: ")
    assert ran.started == 0


def test_an_unknown_user_is_an_error(executor: ProcessExecutor) -> None:
    ran = run(executor, launch(user="no-such-user-gf", argv=["true"]))

    assert ran.result == RankResult("error", message="user no-such-user-gf does not exist on this node")


def test_a_system_account_never_runs_a_job(tmp_path: Path) -> None:
    """A cluster user named like a local system account (root, daemon) must not become it on the node."""
    guarded = ProcessExecutor(tmp_path / "spool", grace_s=GRACE_S, track_s=0.05)  # the agent's default floor
    ran = run(guarded, launch(user="root", argv=["true"]))
    assert ran.result.outcome == "error"
    assert "refusing to run a job as root: uid 0 is a system account" in ran.result.message
    with pytest.raises(CannotStart, match="system account"):
        identity("daemon")


def test_an_agent_that_is_not_root_runs_only_its_own_users_jobs(monkeypatch: pytest.MonkeyPatch) -> None:
    nobody = pwd.getpwnam("nobody")
    monkeypatch.setattr(os, "geteuid", lambda: nobody.pw_uid + 1)
    with pytest.raises(CannotStart, match="the agent is not root, so it cannot run jobs as nobody"):
        identity("nobody")
    monkeypatch.setattr(os, "geteuid", lambda: nobody.pw_uid)
    assert not identity("nobody").switch


def test_the_workdir_is_respected(executor: ProcessExecutor, tmp_path: Path) -> None:
    assert run(executor, launch(argv=["pwd"], workdir=str(tmp_path))).text() == f"{tmp_path}\n"
    home = pwd.getpwuid(os.geteuid()).pw_dir
    if os.path.isdir(home):
        assert run(executor, launch(argv=["pwd"])).text() == f"{home}\n"
    missing = run(executor, launch(argv=["pwd"], workdir=str(tmp_path / "missing")))
    assert missing.result.outcome == "error"
    assert "missing" in missing.result.message


# -- cgroups, on a fake cgroup root ----------------------------------------------------------------


def fake_cgroup_root(tmp_path: Path, controllers: str = "cpuset cpu io memory pids") -> Path:
    root = tmp_path / "cgroup"
    root.mkdir(parents=True)
    (root / "cgroup.controllers").write_text(controllers + "\n")
    (root / "cgroup.subtree_control").write_text("")
    return root


def test_cgroup_detection(tmp_path: Path) -> None:
    root = fake_cgroup_root(tmp_path)

    parent = CgroupParent.detect(root)

    assert parent == CgroupParent(root / "gpufleet")
    assert (root / "cgroup.subtree_control").read_text() == "+cpu +memory"
    assert (root / "gpufleet" / "cgroup.subtree_control").read_text() == "+cpu +memory"
    assert CgroupParent.detect(tmp_path / "nothing-here") is None  # cgroup v1 or hybrid: no cgroup.controllers
    assert CgroupParent.detect(fake_cgroup_root(tmp_path / "v2", "cpuset io hugetlb")) is None
    unwritable = fake_cgroup_root(tmp_path / "ro")
    (unwritable / "cgroup.subtree_control").unlink()
    (unwritable / "cgroup.subtree_control").mkdir()  # a write fails, as it does without root
    assert CgroupParent.detect(unwritable) is None


def test_a_rank_cgroup_gets_its_limits(tmp_path: Path) -> None:
    parent = CgroupParent.detect(fake_cgroup_root(tmp_path))
    assert parent is not None

    path = parent.create("job-1-1-0", cpus=4, mem_mib=2048)

    assert (path / "memory.max").read_text() == str(2048 * 1024 * 1024)
    assert (path / "cpu.max").read_text() == "400000 100000"
    assert not (parent.create("job-2-1-0", cpus=0, mem_mib=0) / "memory.max").exists()


def test_the_child_enters_its_cgroup_before_it_becomes_the_user_and_is_killed_through_it(tmp_path: Path) -> None:
    need_root()
    parent = CgroupParent.detect(fake_cgroup_root(tmp_path))
    assert parent is not None
    executor = ProcessExecutor(tmp_path / "spool", min_uid=0, grace_s=GRACE_S, cgroups=parent, track_s=0.05)
    start = launch(user="nobody", script="trap '' TERM; sleep 300", cpus=2, mem_mib=512)
    rank = parent.path / f"job-{start.job_id}-1-0"
    rank.mkdir()  # what the kernel would provide: cgroup.procs and cgroup.kill (root's, mode 644)
    for name in ("cgroup.procs", "cgroup.kill"):
        (rank / name).write_text("")

    ran = run(executor, start, cancel_when=rank / "cgroup.procs", lines=1)

    assert ran.result == RankResult("cancelled", -9, "cancelled")  # no note: the limits are enforced
    assert (rank / "cgroup.procs").read_text() == "0"  # written by the child, still root
    assert (rank / "cgroup.kill").read_text() == "1"  # SIGTERM was ignored
    assert (rank / "memory.max").read_text() == str(512 * 1024 * 1024)
    assert (rank / "cpu.max").read_text() == "200000 100000"


def test_limits_that_cannot_be_enforced_are_reported(executor: ProcessExecutor) -> None:
    ran = run(executor, launch(argv=["true"], mem_mib=1024))

    assert ran.result.outcome == "completed"
    assert "not enforced" in ran.result.message


# -- containers ------------------------------------------------------------------------------------


def fake_devices(tmp_path: Path) -> Path:
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidia2", "nvidiactl", "nvidia-uvm"):
        (dev / name).write_text("")
    return dev


def test_the_podman_command(tmp_path: Path) -> None:
    rt = Containers(
        "/usr/bin/podman", None, {"CONTAINERS_CONF": "/x"}, True, fake_devices(tmp_path), (tmp_path / "cdi",)
    )
    start = launch(
        container="registry.example/train:1", argv=["python", "t.py"], gpu_indexes=[0, 2], mem_mib=1024, cpus=8
    )
    who = Identity("alice", 2001, 2001, (2001, 3000), "/home/alice", "/bin/bash", True)

    argv = podman_command("/usr/bin/podman", "registry.example/train:1", rt, start, who, "/home/alice", "/s/1.env")

    assert argv[:2] == ["/usr/bin/podman", "run"]
    assert argv[-3:] == ["registry.example/train:1", "python", "t.py"]
    joined = " ".join(argv)
    assert f"--name gpufleet-{start.job_id}-1-0" in joined
    assert "--network host" in joined
    assert "--user 2001:2001 --group-add 3000" in joined
    assert "--security-opt no-new-privileges --cap-drop=all" in joined
    assert "--env-file /s/1.env" in joined  # the job's variables: never on the command line
    assert "-e" not in argv
    assert "--memory 1024m --cpus 8" in joined
    assert "-v /home/alice:/home/alice -w /home/alice" in joined
    devices = [f"{tmp_path}/dev/{name}" for name in ("nvidia0", "nvidia2", "nvidiactl", "nvidia-uvm")]
    assert [argv[i + 1] for i, word in enumerate(argv) if word == "--device"] == devices

    (tmp_path / "cdi").mkdir()
    (tmp_path / "cdi" / "nvidia.yaml").write_text("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\n")
    argv = podman_command("/usr/bin/podman", "img", rt, start, who, "/", "/s/1.env")
    assert [argv[i + 1] for i, word in enumerate(argv) if word == "--device"] == [
        "nvidia.com/gpu=0",
        "nvidia.com/gpu=2",
    ]
    assert "-v" not in argv


def test_podmans_own_environment_is_fixed_and_the_jobs_goes_to_its_env_file(tmp_path: Path) -> None:
    rt = Containers("/usr/bin/podman", None, {"CONTAINERS_STORAGE_CONF": "/etc/gf/storage.conf"})
    executor = ProcessExecutor(tmp_path / "spool", min_uid=0, containers=rt)
    job_env = {"LD_PRELOAD": "/tmp/evil.so", "CONTAINERS_CONF": "/tmp/evil.conf", "PATH": "/evil", "FOO": "a b=c"}
    start = launch(container=IMAGE, argv=["true"], env=job_env, gpu_uuids=["GPU-1"])

    prepared = executor._prepare(start)

    home = pwd.getpwuid(os.geteuid()).pw_dir
    expected = {
        "PATH": DEFAULT_PATH,
        "HOME": home,
        "LANG": "C.UTF-8",
        "CONTAINERS_STORAGE_CONF": "/etc/gf/storage.conf",
    }
    assert prepared.env == expected == podman_environment(rt)
    env_file = tmp_path / "spool" / f"{start.job_id}-1-0.env"
    assert prepared.env_file == env_file
    assert prepared.argv[prepared.argv.index("--env-file") + 1] == str(env_file)
    lines = prepared.env_text.splitlines()
    assert {"LD_PRELOAD=/tmp/evil.so", "CONTAINERS_CONF=/tmp/evil.conf", "PATH=/evil", "FOO=a b=c"} <= set(lines)
    assert {"CUDA_VISIBLE_DEVICES=GPU-1", f"GPUFLEET_JOB_ID={start.job_id}", "NODE_RANK=0"} <= set(lines)
    assert "/tmp/evil" not in " ".join(prepared.argv)


@pytest.mark.parametrize("value", ["two\nlines", "cr\r", '"quoted"', "'quoted'"])
def test_what_an_env_file_cannot_carry_is_refused(value: str) -> None:
    assert env_file_text({"A": "ok", "B": 'in"side'}) == 'A=ok\nB=in"side\n'
    with pytest.raises(CannotStart, match="cannot have the variable X"):
        env_file_text({"X": value})


def fake_podman(tmp_path: Path) -> tuple[ProcessExecutor, Path]:
    """An executor whose podman records its environment, its env file and that file's mode."""
    seen = tmp_path / "seen"
    seen.mkdir()
    podman = tmp_path / "podman"
    podman.write_text(
        f"""#!/bin/sh
env > {seen}/env
prev=
for arg; do
  if [ "$prev" = --env-file ]; then cp "$arg" {seen}/env-file; stat -c %a "$arg" > {seen}/mode; fi
  prev=$arg
done
"""
    )
    podman.chmod(0o755)
    executor = ProcessExecutor(tmp_path / "spool", min_uid=0, grace_s=GRACE_S, containers=Containers(str(podman)))
    return executor, seen


def test_a_container_jobs_variables_reach_podman_only_through_a_private_env_file(tmp_path: Path) -> None:
    executor, seen = fake_podman(tmp_path)
    start = launch(container=IMAGE, argv=["true"], env={"LD_PRELOAD": "/tmp/evil.so", "SECRET": "s3"})

    ran = run(executor, start)

    assert ran.result == RankResult("completed", 0, ""), ran.chunks
    podman_env = (seen / "env").read_text()
    assert "evil" not in podman_env
    assert "s3" not in podman_env
    assert {"LD_PRELOAD=/tmp/evil.so", "SECRET=s3"} <= set((seen / "env-file").read_text().splitlines())
    assert (seen / "mode").read_text().strip() == "600"
    assert not (tmp_path / "spool" / f"{start.job_id}-1-0.env").exists()  # removed once the rank ended


def test_a_container_workdir_the_user_cannot_enter_is_refused(tmp_path: Path, open_dir: Path) -> None:
    executor, seen = fake_podman(tmp_path)

    missing = run(executor, launch(container=IMAGE, argv=["true"], workdir=str(tmp_path / "missing")))

    assert missing.result.outcome == "error"
    assert "cannot enter it" in missing.result.message
    need_root()
    inner = tmp_path / "inner"  # open itself, but below pytest's directory, which is root's alone
    inner.mkdir(mode=0o777)

    closed = run(executor, launch(container=IMAGE, user="nobody", argv=["true"], workdir=str(inner)))

    assert closed.result == RankResult(
        "error", message=f"the workdir {inner} does not exist on this node or nobody cannot enter it"
    )
    assert closed.started == 0
    assert not (seen / "env").exists()  # podman never ran
    opened = run(executor, launch(container=IMAGE, user="nobody", argv=["true"], workdir=str(open_dir)))
    assert opened.result.outcome == "completed", opened.result


def test_leftovers_of_an_earlier_agent_are_ended(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("gpufleet.agent.jobs.process.KILL_WAIT_S", 0.5)
    leftover = subprocess.Popen(["sleep", "300"], start_new_session=True)
    cgroup = tmp_path / "cgroup" / "gpufleet"
    (cgroup / "job-7-1-0").mkdir(parents=True)
    (cgroup / "job-7-1-0" / "cgroup.procs").write_text(f"{leftover.pid}\n")
    (cgroup / "other").mkdir()
    calls = tmp_path / "calls"
    podman = tmp_path / "podman"
    podman.write_text(f"""#!/bin/sh
echo "$@" >> {calls}
[ "$1" = ps ] && printf 'gpufleet-7-1-0\\ngpufleet-8-2-1\\n'
exit 0
""")
    podman.chmod(0o755)
    executor = ProcessExecutor(tmp_path / "spool", cgroups=CgroupParent(cgroup), containers=Containers(str(podman)))

    found = asyncio.run(executor.reap_leftovers())

    assert found == 3
    assert leftover.wait(timeout=5) == -9
    assert calls.read_text().splitlines()[-1] == "rm --force --time 0 gpufleet-7-1-0 gpufleet-8-2-1"
    assert "name=^gpufleet-" in calls.read_text().splitlines()[0]
    assert asyncio.run(ProcessExecutor(tmp_path / "spool").reap_leftovers()) == 0  # nothing to look at


def test_the_bubblewrap_command(tmp_path: Path) -> None:
    rt = Containers(None, "/usr/bin/bwrap", dev_dir=fake_devices(tmp_path))
    start = launch(container="/srv/rootfs", script="echo hi", gpu_indexes=[1])

    argv = bwrap_command("/usr/bin/bwrap", "/srv/rootfs", rt, start, "/home/alice")

    assert argv[:4] == ["/usr/bin/bwrap", "--ro-bind", "/srv/rootfs", "/"]
    assert "--unshare-all --share-net --bind /home/alice /home/alice --chdir /home/alice" in " ".join(argv)
    assert argv[-4:] == ["--", "/bin/sh", "-c", "echo hi"]
    assert f"--dev-bind {tmp_path}/dev/nvidia1 {tmp_path}/dev/nvidia1" in " ".join(argv)


def test_no_container_runtime_is_an_error(executor: ProcessExecutor, tmp_path: Path) -> None:
    image = run(executor, launch(container=IMAGE, argv=["true"]))
    rootfs = run(executor, launch(container=str(tmp_path), argv=["true"]))

    for ran in (image, rootfs):
        assert ran.result == RankResult("error", message="no container runtime (podman or bubblewrap) on this node")
    only_bwrap = ProcessExecutor(tmp_path, min_uid=0, containers=Containers(None, "/usr/bin/bwrap"))
    assert "needs podman" in run(only_bwrap, launch(container=IMAGE, argv=["true"])).result.message


@dataclass(frozen=True)
class ContainerSetup:
    state: Path
    podman_env: dict[str, str]


@pytest.fixture(scope="session")
def container_setup() -> ContainerSetup:
    """podman, runc and bubblewrap installed, the busybox image imported: scripts/services/containers.sh."""
    with FileLock("/tmp/gpufleet-test-containers.lock"):
        result = subprocess.run(
            ["bash", str(ROOT / "scripts" / "services" / "containers.sh"), "install", "image"],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    if result.returncode != 0:
        reason = (result.stderr or result.stdout).strip().splitlines()
        need("podman and bubblewrap", reason[-1] if reason else "containers.sh failed")
    state = Path(result.stdout.strip().splitlines()[-1])
    env = dict(line.split("=", 1) for line in (state / "env").read_text().splitlines() if "=" in line)
    return ContainerSetup(state, env)


@pytest.fixture
def podman_executor(container_setup: ContainerSetup, tmp_path: Path) -> ProcessExecutor:
    rt = Containers.detect(container_setup.podman_env)
    if rt.podman is None:
        need("podman", "not on PATH after containers.sh install")
    return ProcessExecutor(tmp_path / "spool", min_uid=0, grace_s=GRACE_S, containers=rt, track_s=0.05)


def podman_names(setup: ContainerSetup) -> list[str]:
    listed = subprocess.run(
        ["podman", "ps", "-a", "--format", "{{.Names}}"],
        env={**os.environ, **setup.podman_env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return listed.stdout.split()


def test_podman_runs_an_image_as_the_user_with_the_jobs_environment(
    podman_executor: ProcessExecutor, container_setup: ContainerSetup, open_dir: Path
) -> None:
    need_root()
    work = open_dir
    script = 'id -u; pwd; echo "$FOO|$CUDA_VISIBLE_DEVICES|$NODE_RANK"; echo out > result; echo err >&2; exit 4'
    start = launch(
        container=IMAGE,
        user="nobody",
        script=script,
        workdir=str(work),
        env={"FOO": "secret value"},
        gpu_uuids=["GPU-1"],
    )

    ran = run(podman_executor, start)

    assert ran.result == RankResult("failed", 4, "exited with code 4"), ran.chunks
    assert ran.text().splitlines() == [str(pwd.getpwnam("nobody").pw_uid), str(work), "secret value|GPU-1|0"]
    assert ran.text("stderr") == "err\n"
    assert (work / "result").read_text() == "out\n"
    assert f"gpufleet-{start.job_id}-1-0" not in podman_names(container_setup)


def test_podman_cancel_and_time_limit_stop_the_container(
    podman_executor: ProcessExecutor, container_setup: ContainerSetup, open_dir: Path
) -> None:
    need_root()
    marker = open_dir / "up"
    start = launch(container=IMAGE, script=f"echo up > {marker}; trap '' TERM; sleep 300", workdir=str(open_dir))

    limited = launch(container=IMAGE, argv=["sleep", "300"], time_limit_s=1)

    cancelled = run(podman_executor, start, cancel_when=marker)
    timed_out = run(podman_executor, limited)

    assert cancelled.result.outcome == "cancelled"
    assert timed_out.result.outcome == "timeout"
    assert cancelled.seconds < 1 + GRACE_S + 10
    # Only this test's containers: the other xdist worker may be running its own in the same storage.
    names = podman_names(container_setup)
    assert not [n for n in names if n.startswith((f"gpufleet-{start.job_id}-", f"gpufleet-{limited.job_id}-"))]


def test_podman_failing_to_start_a_container_is_an_error(podman_executor: ProcessExecutor) -> None:
    need_root()
    # podman refuses the name at once (a missing image would first be looked for in registries)
    ran = run(podman_executor, launch(container="localhost/gpufleet/Not-A-Valid-Name", argv=["true"]))

    assert ran.result.outcome == "error"
    assert "podman could not run the container" in ran.result.message


def test_bubblewrap_runs_a_root_file_system_as_the_user(
    container_setup: ContainerSetup, tmp_path: Path, open_dir: Path
) -> None:
    need_root()
    bwrap = require_tool("bwrap")
    executor = ProcessExecutor(
        tmp_path / "spool", min_uid=0, grace_s=GRACE_S, containers=Containers(None, bwrap), track_s=0.05
    )
    work = open_dir / "work"
    work.mkdir(mode=0o777)
    work.chmod(0o777)
    rootfs = str(container_setup.state / "rootfs")

    ran = run(
        executor,
        launch(container=rootfs, user="nobody", script="id -u; pwd; ls /bin/busybox; echo x > f", workdir=str(work)),
    )
    pids = open_dir / "pids"
    cancelled = run(
        executor,
        launch(container=rootfs, script=f"echo $$ > {pids}; sleep 300", workdir=str(open_dir)),
        cancel_when=pids,
    )

    assert ran.result.outcome == "completed", ran.chunks
    assert ran.text().splitlines() == [str(pwd.getpwnam("nobody").pw_uid), str(work), "/bin/busybox"]
    assert (work / "f").stat().st_uid == pwd.getpwnam("nobody").pw_uid
    assert cancelled.result.outcome == "cancelled"
    missing = run(executor, launch(container=str(tmp_path / "no-rootfs"), argv=["true"]))
    assert "does not exist" in missing.result.message
