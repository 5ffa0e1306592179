"""Run one rank of a job as real processes on this node: `ProcessExecutor`.

What a rank gets:

- **Its user.** The agent runs as root and starts the rank as `launch.user` (uid, gid and the user's
  groups, looked up on this node). An agent that is not root runs only its own user's jobs.
- **A clean environment**, not the agent's: HOME, USER, LOGNAME, SHELL, a standard PATH, the job's own
  variables, then what the allocation fixes and the job cannot override (`allocation_environment`):
  `CUDA_VISIBLE_DEVICES` (the GPUs' UUIDs, empty without GPUs so such a job sees none), `GPUFLEET_*`,
  and the rendezvous for torchrun: `MASTER_ADDR`, `MASTER_PORT`, `WORLD_SIZE` (the number of nodes)
  and `NODE_RANK` (this node's rank). torchrun sets `RANK`, `LOCAL_RANK` and a per-process `WORLD_SIZE`
  itself, so none is set here for its workers; its own options read `PET_<OPTION>` variables, which are
  set too (`PET_NNODES`, `PET_NODE_RANK`, `PET_MASTER_ADDR`, `PET_MASTER_PORT`), so a plain
  `torchrun --nproc-per-node=8 train.py` joins the right rendezvous; spelling the options out as
  `--nnodes=$WORLD_SIZE --node-rank=$NODE_RANK --master-addr=$MASTER_ADDR --master-port=$MASTER_PORT`
  works as well.
- **Its own session**, and a process tree that is ended as a whole: on cancel, at the time limit, and
  after the main process exits (leftover background processes would hold the GPUs). The tree is every
  process in the rank's session, every descendant of those (which catches children that called
  setsid while their parent lives), every process seen in an earlier look (psutil, every `track_s`,
  which catches them after their parent died) and, where a cgroup holds the rank, everything in it.
  SIGTERM first, SIGKILL after `grace_s`, and `run` returns only once none of them is left. Without a
  cgroup, one gap remains: a process that calls setsid and whose parent exits before the next look.
- **cgroup limits where the node allows them**: with a cgroup v2 hierarchy that offers the cpu and
  memory controllers (`CgroupParent.detect`), each rank gets a child cgroup with `memory.max` and
  `cpu.max`, entered by the child itself before it runs the job (so nothing it forks escapes), and
  `cgroup.kill` at the end. Elsewhere (cgroup v1 or a hybrid hierarchy) the limits are not enforced
  and the result says so. (RLIMIT_AS is no substitute: CUDA reserves far more address space than it uses.)
- **A container where asked**: an image name runs with podman (`podman run --network host`, the job's
  user, no capabilities and no-new-privileges, `--memory`/`--cpus`, the workdir mounted once a child that
  became the user could enter it, the GPUs as CDI devices where an NVIDIA CDI spec
  exists, else their /dev/nvidia* files; without CDI the image must bring user-space driver libraries
  matching the node's driver); a directory (a root file system) runs with bubblewrap, read-only, the
  workdir bound, the network shared. podman runs as the agent (root), so its own environment is fixed
  and the job's variables reach the container through an `--env-file` only root reads
  (`<spool_dir>/<job>-<run>-<rank>.env`, removed once the rank ends); bubblewrap is started as the user.
- **Its GPU's MPS daemon where the head says so** (`launch.mps`: a rank on MPS replicas, protocol.sharing):
  started first if it is not running, stopped after the GPU's last MPS rank (`mps.MpsDaemons`); where it
  cannot be, the rank runs time-sliced and its result says so.
- **Its output** streamed to `on_output` as it comes (UTF-8, errors replaced, at most MAX_OUTPUT_CHUNK
  characters per call) and kept whole in `<spool_dir>/<job>-<run>-<rank>.out` and `.err`.

The parts live beside this module: `identity` (the user, environment, workdir and command), `cgroups`
(`CgroupParent` and the rank cgroups), `containers` (`Containers`, the podman and bubblewrap argv),
`tree` (`ProcessTree`) and `output` (the streams and their spool files). This module starts the rank,
waits for the first of its exit, a cancel and the time limit, and ends its tree.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from gpufleet.agent.jobs.cgroups import CgroupParent, cgroup_kill, cgroup_pids, cgroup_remove
from gpufleet.agent.jobs.containers import (
    CONTAINER_PREFIX,
    Containers,
    bwrap_command,
    container_name,
    env_file_text,
    podman_command,
    podman_environment,
)
from gpufleet.agent.jobs.identity import (
    DEFAULT_MIN_UID,
    CannotStart,
    Identity,
    allocation_environment,
    command_for,
    identity,
    job_environment,
    workdir_for,
)
from gpufleet.agent.jobs.mps import MpsDaemons
from gpufleet.agent.jobs.output import OutputStream, RankProtocol, spool_file
from gpufleet.agent.jobs.ports import OnOutput, OnStarted, RankResult
from gpufleet.agent.jobs.tree import ProcessTree
from gpufleet.protocol.jobs import DEFAULT_PATH, JobStart

log = logging.getLogger(__name__)

KILL_WAIT_S = 30.0  # after SIGKILL: a process stuck in the kernel (hung NFS) is given up on, and said so
PIPE_WAIT_S = 2.0  # after the tree is gone, for the last output to arrive
POLL_S = 0.05  # how often a stopping tree is looked at
PODMAN_CALL_S = 60.0  # for `podman kill` and `podman rm`
ENTER_CHECK_S = 30.0  # for a child to enter a container's workdir as the job's user


def child_setup(cgroup: Path | None, who: Identity, cwd: str) -> Callable[[], None] | None:
    """What the child does between fork and exec: enter the rank's cgroup, become the job's user, and
    (when it switched user) change to `cwd`; None when there is nothing to do.

    In this order and in the child: only root may move a process into the cgroup, and moving the child
    before it runs the job means nothing the job forks escapes the limits; subprocess's own user and
    group arguments would switch user before this runs. The directory is entered as the user, so a job
    cannot reach a workdir below a directory closed to it. The function makes system calls only (no
    locks, no imports), which is what makes it safe next to the agent's threads.
    """
    if cgroup is None and not who.switch:
        return None
    procs = str(cgroup / "cgroup.procs") if cgroup is not None else None
    groups, gid, uid, switch = list(who.groups), who.gid, who.uid, who.switch

    def setup() -> None:
        if procs is not None:
            fd = os.open(procs, os.O_WRONLY)
            try:
                os.write(fd, b"0")  # "0": the writing process itself
            finally:
                os.close(fd)
        if switch:
            os.setgroups(groups)
            os.setgid(gid)
            os.setuid(uid)
            os.chdir(cwd)

    return setup


@dataclass
class _Prepared:
    argv: list[str]
    env: dict[str, str]
    cwd: str | None  # None: child_setup enters it, as the job's user
    preexec: Callable[[], None] | None
    cgroup: Path | None
    podman_name: str | None
    where: str  # "as USER in WORKDIR", for messages
    env_file: Path | None = None  # podman's --env-file, written before the start and removed after
    env_text: str = ""
    enter: tuple[Identity, str] | None = None  # a directory the user must be able to enter first


class ProcessExecutor:
    """Runs each rank as real processes on this node (see the module's docstring).

    `spool_dir` keeps every rank's output; `grace_s` is how long a process tree has between SIGTERM and
    SIGKILL; `cgroups` is where rank cgroups go (None: limits not enforced); `containers` the runtimes;
    `track_s` how often the tree is looked at while it runs.
    """

    def __init__(
        self,
        spool_dir: Path,
        *,
        grace_s: float = 10.0,
        cgroups: CgroupParent | None = None,
        containers: Containers | None = None,
        track_s: float = 1.0,
        min_uid: int = DEFAULT_MIN_UID,
        mps: MpsDaemons | None = None,
    ) -> None:
        self.spool_dir = spool_dir
        self.min_uid = min_uid
        self.grace_s = grace_s
        self.cgroups = cgroups
        self.containers = containers or Containers()
        self.track_s = track_s
        self.mps = mps if mps is not None else MpsDaemons()

    @classmethod
    def on_this_node(
        cls,
        spool_dir: Path,
        grace_s: float = 10.0,
        podman_env: Mapping[str, str] | None = None,
        min_uid: int = DEFAULT_MIN_UID,
    ) -> ProcessExecutor:
        """An executor with the cgroups and container runtimes this node has (see Containers for `podman_env`)."""
        containers = Containers.detect(podman_env)
        cgroups = CgroupParent.detect()
        return cls(spool_dir, grace_s=grace_s, cgroups=cgroups, containers=containers, min_uid=min_uid)

    async def run(
        self, launch: JobStart, on_started: OnStarted, on_output: OnOutput, cancel: asyncio.Event
    ) -> RankResult:
        """Run one rank to its end; see JobExecutor.run. Never raises (but passes on its own cancellation,
        after the tree is gone)."""
        try:
            return await self._run(launch, on_started, on_output, cancel)
        except CannotStart as exc:
            return RankResult("error", message=str(exc))
        except Exception as exc:
            log.exception("job %d run %d rank %d failed in the agent", launch.job_id, launch.run, launch.rank)
            return RankResult("error", message=f"the agent failed to run the job: {exc}"[:512])

    def _prepare(self, launch: JobStart) -> _Prepared:
        who = identity(launch.user, self.min_uid)
        workdir = workdir_for(launch, who)
        key = f"{launch.job_id}-{launch.run}-{launch.rank}"
        env = job_environment(launch, who)
        rt = self.containers
        where = f"as {who.name} in {workdir}"
        if launch.container and not launch.container.startswith("/"):
            if rt.podman is None:
                raise CannotStart(_no_runtime(rt, f"the image {launch.container} needs podman"))
            env_text = env_file_text({**launch.env, **allocation_environment(launch)})
            env_file = self.spool_dir / f"{key}.env"
            argv = podman_command(rt.podman, launch.container, rt, launch, who, workdir, str(env_file))
            # podman runs as the agent (root) and switches user itself; the limits are its own. Its
            # environment is fixed: nothing of the job's (LD_PRELOAD, CONTAINERS_CONF) reaches root.
            name = container_name(launch)
            prepared = _Prepared(argv, podman_environment(rt), "/", None, None, name, where, env_file, env_text)
            prepared.enter = (who, workdir)
            return prepared
        if not os.path.isdir(workdir):
            raise CannotStart(f"the workdir {workdir} does not exist on this node")
        if launch.container:
            if rt.bwrap is None:
                raise CannotStart(_no_runtime(rt, f"the root file system {launch.container} needs bubblewrap"))
            if not os.path.isdir(launch.container):
                raise CannotStart(f"the container root file system {launch.container} does not exist on this node")
            # bwrap runs as the user (child_setup switches before it execs) and --chdir's itself; the
            # child entering the workdir first, as the user, is the same check as for a plain rank.
            argv, cwd = bwrap_command(rt.bwrap, launch.container, rt, launch, workdir), workdir
        else:
            argv, cwd = command_for(launch), workdir
        cgroup = self._cgroup(self.cgroups, f"job-{key}", launch) if self.cgroups else None
        preexec = child_setup(cgroup, who, cwd)
        return _Prepared(argv, env, None if who.switch else cwd, preexec, cgroup, None, where)

    @staticmethod
    def _cgroup(cgroups: CgroupParent, name: str, launch: JobStart) -> Path:
        try:
            return cgroups.create(name, launch.cpus, launch.mem_mib)
        except OSError as exc:
            raise CannotStart(f"cannot create the job's cgroup: {exc}") from exc

    async def _run(
        self, launch: JobStart, on_started: OnStarted, on_output: OnOutput, cancel: asyncio.Event
    ) -> RankResult:
        prepared = self._prepare(launch)
        if prepared.enter is not None:  # podman (root) mounts the workdir: only one the user may enter
            await enter_as(*prepared.enter)
        notes = []
        mps_gpus = list(launch.gpu_uuids) if launch.mps else []
        for gpu in mps_gpus:
            if (why := await self.mps.acquire(gpu)) is not None:
                notes.append(why)  # it runs all the same, time-sliced
        if (launch.cpus or launch.mem_mib) and prepared.cgroup is None and prepared.podman_name is None:
            notes.append("cpu and memory limits not enforced (no cgroup v2 with cpu and memory on this node)")
        try:
            self.spool_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            if prepared.env_file is not None:
                _write_private(prepared.env_file, prepared.env_text)
            return await self._spawn_and_wait(launch, prepared, on_started, on_output, cancel, notes)
        finally:
            if prepared.env_file is not None:
                with contextlib.suppress(OSError):
                    prepared.env_file.unlink()
            if prepared.cgroup is not None:
                cgroup_remove(prepared.cgroup)
            for gpu in mps_gpus:
                await asyncio.shield(self.mps.release(gpu))

    async def _spawn_and_wait(
        self,
        launch: JobStart,
        prepared: _Prepared,
        on_started: OnStarted,
        on_output: OnOutput,
        cancel: asyncio.Event,
        notes: list[str],
    ) -> RankResult:
        base = self.spool_dir / f"{launch.job_id}-{launch.run}-{launch.rank}"
        with spool_file(base.with_suffix(".out")) as out, spool_file(base.with_suffix(".err")) as err:
            outputs = {1: OutputStream("stdout", out, on_output), 2: OutputStream("stderr", err, on_output)}
            protocol = RankProtocol(outputs)
            loop = asyncio.get_running_loop()
            try:
                transport, _ = await loop.subprocess_exec(
                    lambda: protocol,
                    *prepared.argv,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                    cwd=prepared.cwd,
                    env=prepared.env,
                    start_new_session=True,  # its own session and process group, ended as a whole
                    preexec_fn=prepared.preexec,  # system calls only, see child_setup
                    umask=0o022,  # not the agent's
                )
            except (OSError, subprocess.SubprocessError) as exc:  # a failed child_setup is a SubprocessError
                return RankResult("error", message=f"cannot start {prepared.argv[0]} {prepared.where}: {exc}"[:512])
            tree = ProcessTree(transport.get_pid(), prepared.cgroup, follow=prepared.podman_name is None)
            tracker = asyncio.create_task(self._track(tree))
            stopped = False
            try:
                on_started()
                why = await _first_of(protocol.exited, cancel, launch.time_limit_s)
                # Podman's client exits once the container has (and --rm removed it): nothing to stop there.
                podman = prepared.podman_name if why != "exited" else None
                leftovers = await self._stop(tree, podman)
                stopped = True
                await _wait_all([protocol.exited, *(output.closed for output in outputs.values())], PIPE_WAIT_S)
            finally:
                tracker.cancel()
                if not stopped:  # cancelled ourselves, or a failure: nothing may outlive the rank
                    await asyncio.shield(self._stop(tree, prepared.podman_name))
                transport.close()
        if leftovers:
            notes.append(f"{leftovers} process(es) did not die when killed")
        return _result(why, transport.get_returncode(), launch, prepared.podman_name is not None, notes)

    async def _track(self, tree: ProcessTree) -> None:
        """Look at the tree now and then, so a process whose parent died is still known at the end."""
        while True:
            await asyncio.to_thread(tree.look)
            await asyncio.sleep(self.track_s)

    async def _stop(self, tree: ProcessTree, podman_name: str | None) -> int:
        """End the tree: SIGTERM, `grace_s`, SIGKILL; wait until none is left. Returns how many outlived
        KILL_WAIT_S after SIGKILL (0 normally)."""
        procs = await asyncio.to_thread(tree.look)
        if not procs and podman_name is None:
            return 0
        if podman_name is not None:
            await self._podman("kill", "--signal", "TERM", podman_name)
        tree.signal(procs, signal.SIGTERM)
        left = await _gone(tree, self.grace_s)
        if left:
            if tree.cgroup is not None:
                cgroup_kill(tree.cgroup)
            if podman_name is not None:
                await self._podman("rm", "--force", "--time", "0", podman_name)
            tree.signal(await asyncio.to_thread(tree.look), signal.SIGKILL)
            left = await _gone(tree, KILL_WAIT_S)
            if left:
                log.warning("%d process(es) of session %d outlived SIGKILL (stuck in the kernel?)", left, tree.sid)
        if podman_name is not None:
            await self._container_gone(podman_name)
        return left

    async def _container_gone(self, name: str) -> None:
        """Wait until the container is removed. Podman's client may exit before its --rm (or a racing
        `podman rm`) has finished, and a rank must not be reported ended while its container still exists."""
        deadline = time.monotonic() + KILL_WAIT_S
        while await self._podman_rc("container", "exists", name) == 0:
            if time.monotonic() > deadline:
                log.warning("container %s was not removed within %.0f s", name, KILL_WAIT_S)
                return
            await self._podman("rm", "--force", "--time", "0", name)
            await asyncio.sleep(POLL_S)

    async def _podman(self, *args: str) -> None:
        """A podman call that may fail (the container is already gone), bounded in time."""
        await self._podman_output(*args, stdout=False)

    async def _podman_output(self, *args: str, stdout: bool = True) -> str:
        """A podman call's standard output ("" when it failed or took over PODMAN_CALL_S)."""
        rc, out = await self._podman_call(args, stdout)
        return out if rc == 0 else ""

    async def _podman_rc(self, *args: str) -> int | None:
        """A podman call's exit status (None when it took over PODMAN_CALL_S)."""
        return (await self._podman_call(args, stdout=False))[0]

    async def _podman_call(self, args: tuple[str, ...], stdout: bool) -> tuple[int | None, str]:
        rt = self.containers
        proc = await asyncio.create_subprocess_exec(
            rt.podman or "podman", *args, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE if stdout else asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL, env=podman_environment(rt),
        )  # fmt: skip
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), PODMAN_CALL_S)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            log.warning("podman %s did not finish in %.0f s", " ".join(args), PODMAN_CALL_S)
            return None, ""
        return proc.returncode, (out or b"").decode(errors="replace")

    async def reap_leftovers(self) -> int:
        """End what ranks of an earlier agent left behind (it was killed, so it could not): every
        process in a rank cgroup (`job-*` under the cgroup parent) and every container named
        `gpufleet-*`. Meant to run once at the agent's start, before it tells the head which ranks it
        holds (none). Returns how many cgroups and containers it found. A rank run without a cgroup
        or container (no cgroup v2 here) cannot be found this way."""
        found = 0
        if self.cgroups is not None:
            for path in sorted(self.cgroups.path.glob("job-*")):
                if not path.is_dir():
                    continue
                found += 1
                pids = cgroup_pids(path)
                log.warning("ending leftover job cgroup %s (%d process(es))", path, len(pids))
                cgroup_kill(path)
                for pid in pids:  # where the kernel has no cgroup.kill
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
                deadline = time.monotonic() + KILL_WAIT_S
                while cgroup_pids(path) and time.monotonic() < deadline:
                    for pid in cgroup_pids(path):  # forked since
                        with contextlib.suppress(OSError):
                            os.kill(pid, signal.SIGKILL)
                    await asyncio.sleep(POLL_S)
                cgroup_remove(path)
        if self.containers.podman is not None:
            listed = await self._podman_output(
                "ps", "--all", "--filter", f"name=^{CONTAINER_PREFIX}", "--format", "{{.Names}}"
            )
            names = [name for name in listed.split() if name.startswith(CONTAINER_PREFIX)]
            if names:
                found += len(names)
                log.warning("removing leftover job container(s): %s", " ".join(names))
                await self._podman("rm", "--force", "--time", "0", *names)
        return found


async def enter_as(who: Identity, path: str) -> None:
    """Raise CannotStart unless `who` can enter the directory `path`: checked by a child that becomes
    the user and changes to it (child_setup, as a rank's own child does), so a directory below one closed
    to the user is refused as it is for a plain rank."""
    try:
        proc = await asyncio.create_subprocess_exec(
            "/bin/sh", "-c", ":", stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL, env={"PATH": DEFAULT_PATH}, cwd=None if who.switch else path,
            preexec_fn=child_setup(None, who, path),  # system calls only; None for the agent's own user
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):  # the chdir failed (child_setup's, or subprocess's)
        raise CannotStart(f"the workdir {path} does not exist on this node or {who.name} cannot enter it") from None
    try:
        code = await asyncio.wait_for(proc.wait(), ENTER_CHECK_S)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise CannotStart(f"{who.name} could not enter the workdir {path} within {ENTER_CHECK_S:g} s") from None
    if code != 0:
        raise CannotStart(f"could not check that {who.name} can enter the workdir {path} (exit code {code})")


def _write_private(path: Path, text: str) -> None:
    """Write `path` anew, readable by the agent's user only (never through a link left in its place)."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with open(fd, "w", encoding="utf-8") as file:
        file.write(text)


def _no_runtime(rt: Containers, what: str) -> str:
    if rt.podman is None and rt.bwrap is None:
        return "no container runtime (podman or bubblewrap) on this node"
    return f"{what}, which is not installed on this node"


async def _first_of(
    exited: asyncio.Event, cancel: asyncio.Event, limit_s: float
) -> Literal["exited", "cancel", "timeout"]:
    """What happens first: the main process exits, the rank is cancelled, or the time limit passes."""
    waits = {asyncio.ensure_future(exited.wait()), asyncio.ensure_future(cancel.wait())}
    try:
        await asyncio.wait(waits, timeout=limit_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
    if exited.is_set():  # an exit that came with the cancel or the deadline is reported as it was
        return "exited"
    return "cancel" if cancel.is_set() else "timeout"


async def _wait_all(events: list[asyncio.Event], timeout_s: float) -> None:
    """Wait until every event is set, or `timeout_s` passes."""
    waits = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, timeout=timeout_s)
    finally:
        for wait in waits:
            wait.cancel()


async def _gone(tree: ProcessTree, timeout_s: float) -> int:
    """Wait until the tree is empty or `timeout_s` passes; the number of processes left (0: all gone)."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = len(await asyncio.to_thread(tree.look))
        if not left or time.monotonic() >= deadline:
            return left
        await asyncio.sleep(POLL_S)


def _result(
    why: Literal["exited", "cancel", "timeout"], code: int | None, launch: JobStart, podman: bool, notes: list[str]
) -> RankResult:
    if why == "cancel":
        return RankResult("cancelled", code, "; ".join(["cancelled", *notes]))
    if why == "timeout":
        return RankResult("timeout", code, "; ".join([f"time limit of {launch.time_limit_s:g} s reached", *notes]))
    if code == 0:
        return RankResult("completed", 0, "; ".join(notes))
    if podman and code == 125:  # podman's own failure (no such image, bad option): see the rank's stderr
        return RankResult("error", code, "; ".join(["podman could not run the container (exit 125)", *notes]))
    if code is not None and code < 0:
        text = f"killed by {signal.Signals(-code).name}" if -code in signal.valid_signals() else f"signal {-code}"
    else:
        text = f"exited with code {code}"
    return RankResult("failed", code, "; ".join([text, *notes]))
