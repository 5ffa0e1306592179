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
  user, `--memory`/`--cpus`, the workdir mounted, the GPUs as CDI devices where an NVIDIA CDI spec
  exists, else their /dev/nvidia* files; without CDI the image must bring user-space driver libraries
  matching the node's driver); a directory (a root file system) runs with bubblewrap, read-only, the
  workdir bound, the network shared.
- **Its output** streamed to `on_output` as it comes (UTF-8, errors replaced, at most MAX_OUTPUT_CHUNK
  characters per call) and kept whole in `<spool_dir>/<job>-<run>-<rank>.out` and `.err`.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import logging
import os
import pwd
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Literal

import psutil

from gpufleet.agent.jobs.ports import OnOutput, OnStarted, RankResult
from gpufleet.protocol.jobs import MAX_OUTPUT_CHUNK, JobStart, Stream

log = logging.getLogger(__name__)

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
KILL_WAIT_S = 30.0  # after SIGKILL: a process stuck in the kernel (hung NFS) is given up on, and said so
PIPE_WAIT_S = 2.0  # after the tree is gone, for the last output to arrive
POLL_S = 0.05  # how often a stopping tree is looked at
PODMAN_CALL_S = 60.0  # for `podman kill` and `podman rm`
PODMAN_INIT = Path("/usr/libexec/podman/catatonit")  # what `podman run --init` runs
NVIDIA_CONTROL_DEVICES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")

# One look at a time: psutil's process cache is shared by every rank, and a tree by its tracker and its stop.
_scan_lock = threading.Lock()


class CannotStart(Exception):
    """The rank cannot start; the message says why and becomes the result's message."""


# -- who runs the job, and with what environment --------------------------------------------------


@dataclass(frozen=True)
class Identity:
    """A user as this node knows it; `switch` is whether the child must become that user."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str
    shell: str
    switch: bool


def identity(user: str) -> Identity:
    """`user` as this node's passwd and group databases know them. Raises CannotStart when the user
    does not exist or the agent, not being root, cannot become them."""
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise CannotStart(f"user {user} does not exist on this node") from None
    own = os.geteuid()
    if own not in (0, entry.pw_uid):
        raise CannotStart(f"the agent is not root, so it cannot run jobs as {user}")
    groups = tuple(os.getgrouplist(user, entry.pw_gid))
    return Identity(user, entry.pw_uid, entry.pw_gid, groups, entry.pw_dir, entry.pw_shell, entry.pw_uid != own)


def allocation_environment(launch: JobStart) -> dict[str, str]:
    """The variables the allocation fixes: the GPUs, the job's identity and torchrun's rendezvous."""
    master_addr = launch.master_addr or "127.0.0.1"  # a one-node job needs no head of the rendezvous
    return {
        "CUDA_VISIBLE_DEVICES": ",".join(launch.gpu_uuids),
        "GPUFLEET_JOB_ID": str(launch.job_id),
        "GPUFLEET_JOB_RUN": str(launch.run),
        "GPUFLEET_NODE_RANK": str(launch.rank),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(launch.master_port),
        "WORLD_SIZE": str(launch.world_size),
        "NODE_RANK": str(launch.rank),
        "PET_NNODES": str(launch.world_size),
        "PET_NODE_RANK": str(launch.rank),
        "PET_MASTER_ADDR": master_addr,
        "PET_MASTER_PORT": str(launch.master_port),
    }


def job_environment(launch: JobStart, who: Identity) -> dict[str, str]:
    """The whole environment of a rank run on the node: a login's basics, the job's, the allocation's."""
    env = {
        "HOME": who.home,
        "USER": who.name,
        "LOGNAME": who.name,
        "SHELL": who.shell or "/bin/sh",
        "PATH": DEFAULT_PATH,
    }
    env.update(launch.env)
    env.update(allocation_environment(launch))
    return env


def workdir_for(launch: JobStart, who: Identity) -> str:
    """The job's workdir, else the user's home where it exists, else /."""
    if launch.workdir:
        return launch.workdir
    return who.home if os.path.isdir(who.home) else "/"


def command_for(launch: JobStart) -> list[str]:
    """The argv to run: the job's, or its script given to /bin/sh. Raises CannotStart when there is neither."""
    if launch.argv:
        return list(launch.argv)
    if launch.script:
        return ["/bin/sh", "-c", launch.script]
    raise CannotStart("nothing to run: the job has neither argv nor script")


# -- cgroups ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CgroupParent:
    """A cgroup v2 directory whose children may use the cpu and memory controllers; one child per rank."""

    path: Path

    @classmethod
    def detect(cls, root: Path = Path("/sys/fs/cgroup"), name: str = "gpufleet") -> CgroupParent | None:
        """`root/name`, set up for rank cgroups, when `root` is a writable cgroup v2 hierarchy offering cpu
        and memory; None otherwise (cgroup v1, a hybrid hierarchy, not root), logged."""
        try:
            offered = (root / "cgroup.controllers").read_text().split()
        except OSError:
            log.info("no cgroup v2 hierarchy at %s: job cpu and memory limits are not enforced", root)
            return None
        if not {"cpu", "memory"} <= set(offered):
            log.info("cgroup v2 at %s lacks cpu or memory (%s): job limits are not enforced", root, " ".join(offered))
            return None
        parent = root / name
        try:
            # The root cgroup may hand controllers down although it holds processes; `parent` holds
            # none (only rank cgroups), so it may too.
            (root / "cgroup.subtree_control").write_text("+cpu +memory")
            parent.mkdir(exist_ok=True)
            (parent / "cgroup.subtree_control").write_text("+cpu +memory")
        except OSError as exc:
            log.info("cannot set up the cgroup %s (%s): job limits are not enforced", parent, exc)
            return None
        return cls(parent)

    def create(self, name: str, cpus: int, mem_mib: int) -> Path:
        """A child cgroup `name` limited to `cpus` CPUs and `mem_mib` MiB (0: no limit). Raises OSError."""
        path = self.path / name
        path.mkdir(exist_ok=True)
        if mem_mib:
            (path / "memory.max").write_text(str(mem_mib * 1024 * 1024))
        if cpus:
            period = 100_000  # microseconds; `cpus` full periods per period is `cpus` CPUs
            (path / "cpu.max").write_text(f"{cpus * period} {period}")
        return path


def cgroup_pids(path: Path | None) -> list[int]:
    """The processes in a cgroup (none when there is no cgroup or it is gone)."""
    if path is None:
        return []
    try:
        text = (path / "cgroup.procs").read_text()
    except OSError:
        return []
    return [int(word) for word in text.split() if word.isdigit() and int(word) > 1]


def cgroup_kill(path: Path) -> None:
    """Kill everything in the cgroup at once, where the kernel has cgroup.kill (5.14+)."""
    kill = path / "cgroup.kill"
    if kill.exists():
        with contextlib.suppress(OSError):
            kill.write_text("1")


def cgroup_remove(path: Path) -> None:
    """Remove an emptied rank cgroup; a failure is only logged (an empty cgroup costs little)."""
    try:
        path.rmdir()
    except OSError as exc:
        log.warning("could not remove the job cgroup %s: %s", path, exc)


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


# -- containers ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Containers:
    """The container runtimes on this node. `podman_env` is added to podman's own environment (e.g.
    CONTAINERS_CONF and CONTAINERS_STORAGE_CONF for a private configuration)."""

    podman: str | None = None
    bwrap: str | None = None
    podman_env: Mapping[str, str] = field(default_factory=dict)
    podman_init: bool = False  # `--init`: a small pid 1 that forwards signals and reaps zombies
    dev_dir: Path = Path("/dev")
    cdi_dirs: tuple[Path, ...] = (Path("/etc/cdi"), Path("/var/run/cdi"))

    @classmethod
    def detect(cls, podman_env: Mapping[str, str] | None = None) -> Containers:
        """What is installed here: podman and bubblewrap on PATH, podman's init."""
        return cls(shutil.which("podman"), shutil.which("bwrap"), dict(podman_env or {}), PODMAN_INIT.exists())

    def nvidia_cdi(self) -> bool:
        """Whether an NVIDIA CDI specification (nvidia-ctk cdi generate) names the GPUs for podman."""
        for directory in self.cdi_dirs:
            with contextlib.suppress(OSError):
                for spec in directory.iterdir():
                    if spec.suffix in {".json", ".yaml", ".yml"} and "nvidia.com/gpu" in spec.read_text():
                        return True
        return False

    def gpu_device_files(self, indexes: Iterable[int]) -> list[str]:
        """The /dev files of GPUs `indexes` and the driver's control devices, those that exist."""
        names = [f"nvidia{index}" for index in indexes]
        if names:
            names += NVIDIA_CONTROL_DEVICES
        return [str(self.dev_dir / name) for name in names if (self.dev_dir / name).exists()]


def container_name(launch: JobStart) -> str:
    return f"gpufleet-{launch.job_id}-{launch.run}-{launch.rank}"


def podman_command(
    podman: str,
    image: str,
    rt: Containers,
    launch: JobStart,
    who: Identity,
    workdir: str,
    job_env: Mapping[str, str],
    client_env: Mapping[str, str],
) -> list[str]:
    """`podman run` for a rank. Variables are passed by name (`-e NAME`), their values taken from
    podman's environment, so no value shows on a command line, except those podman's own environment
    must keep (PATH, HOME, its configuration), which are given inline."""
    argv = [podman, "run", "--rm", "--replace", "--name", container_name(launch), "--network", "host"]
    argv += ["--log-driver", "passthrough"]  # output straight to our pipes, no copy in podman's storage
    if rt.podman_init:
        argv.append("--init")
    argv += ["--user", f"{who.uid}:{who.gid}"]
    for gid in who.groups:
        if gid != who.gid:
            argv += ["--group-add", str(gid)]
    for name, value in job_env.items():
        argv += ["-e", f"{name}={value}" if name in client_env else name]
    if launch.mem_mib:
        argv += ["--memory", f"{launch.mem_mib}m"]
    if launch.cpus:
        argv += ["--cpus", str(launch.cpus)]
    if workdir != "/":
        argv += ["-v", f"{workdir}:{workdir}"]
    argv += ["-w", workdir]
    if launch.gpu_indexes and rt.nvidia_cdi():
        for index in launch.gpu_indexes:
            argv += ["--device", f"nvidia.com/gpu={index}"]
    else:
        for device in rt.gpu_device_files(launch.gpu_indexes):
            argv += ["--device", device]
    return [*argv, image, *command_for(launch)]


def bwrap_command(bwrap: str, rootfs: str, rt: Containers, launch: JobStart, workdir: str) -> list[str]:
    """bubblewrap over the root file system `rootfs`: read-only, fresh /proc, /dev and /tmp,
    every namespace new but the network's, the workdir and the GPUs' device files bound in."""
    # / is the read-only root file system, so the job's /tmp is a fresh tmpfs of its own.
    argv = [bwrap, "--ro-bind", rootfs, "/", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]  # noqa: S108
    argv += ["--unshare-all", "--share-net"]
    if workdir != "/":
        argv += ["--bind", workdir, workdir]
    argv += ["--chdir", workdir]
    for device in rt.gpu_device_files(launch.gpu_indexes):
        argv += ["--dev-bind", device, device]
    return [*argv, "--", *command_for(launch)]


# -- the process tree ------------------------------------------------------------------------------


class ProcessTree:
    """Every process of one rank that can be found (see the module's docstring), remembered between looks.

    With `follow` False only the session counts: podman's client is in it, while the container's
    processes run under conmon, which leaves the session (and is ended by podman, not by signals here).
    """

    def __init__(self, sid: int, cgroup: Path | None = None, *, follow: bool = True) -> None:
        self.sid = sid
        self.cgroup = cgroup
        self.follow = follow
        self._known: dict[int, psutil.Process] = {}

    def look(self) -> list[psutil.Process]:
        """Scan /proc (blocking: a few milliseconds) and return the rank's processes that still live."""
        with _scan_lock:
            return self._look()

    def _look(self) -> list[psutil.Process]:
        procs = {proc.pid: proc for proc in psutil.process_iter(["ppid", "status"])}
        children: dict[int, list[int]] = {}
        for proc in procs.values():
            children.setdefault(proc.info["ppid"], []).append(proc.pid)
        seeds = [pid for pid in procs if _session(pid) == self.sid]
        seeds += cgroup_pids(self.cgroup)
        # A remembered pid counts only while it is the same process (psutil compares creation times).
        seeds += [pid for pid, proc in self._known.items() if procs.get(pid) == proc]
        found: set[int] = set()
        while seeds:
            pid = seeds.pop()
            if pid not in found and pid in procs:
                found.add(pid)
                if self.follow:
                    seeds += children.get(pid, [])
        self._known = {pid: procs[pid] for pid in found if procs[pid].info["status"] != psutil.STATUS_ZOMBIE}
        return list(self._known.values())

    def signal(self, procs: Iterable[psutil.Process], signum: int) -> None:
        """Send `signum` to the rank's process group and to each of `procs`."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.sid, signum)
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signum)


def _session(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


# -- output ----------------------------------------------------------------------------------------


class _Output:
    """One stream: kept whole in a spool file, decoded incrementally, handed on in bounded chunks."""

    def __init__(self, stream: Stream, spool: BinaryIO, on_output: OnOutput) -> None:
        self.stream = stream
        self.spool: BinaryIO | None = spool
        self.on_output = on_output
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.closed = asyncio.Event()

    def feed(self, data: bytes, final: bool = False) -> None:
        if self.spool is not None:
            try:
                self.spool.write(data)
            except OSError as exc:  # a full disk must not stop the job nor its streamed output
                log.warning("job output spool %s: %s; no longer kept on the node", self.spool.name, exc)
                self.spool = None
        text = self.decoder.decode(data, final)
        for start in range(0, len(text), MAX_OUTPUT_CHUNK):
            try:
                self.on_output(self.stream, text[start : start + MAX_OUTPUT_CHUNK])
            except Exception:  # the reader must go on draining the pipe, whatever the consumer does
                log.exception("job output consumer failed")


class _RankProtocol(asyncio.SubprocessProtocol):
    """Output as it arrives, and the main process's exit as soon as it happens: Process.wait() would
    also wait for the pipes to close, which a leftover background process can delay forever."""

    def __init__(self, outputs: dict[int, _Output]) -> None:
        self.outputs = outputs
        self.exited = asyncio.Event()

    def pipe_data_received(self, fd: int, data: bytes | str) -> None:
        self.outputs[fd].feed(data.encode() if isinstance(data, str) else data)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        if fd in self.outputs:
            self.outputs[fd].feed(b"", final=True)
            self.outputs[fd].closed.set()

    def process_exited(self) -> None:
        self.exited.set()


# -- the executor ----------------------------------------------------------------------------------


@dataclass
class _Prepared:
    argv: list[str]
    env: dict[str, str]
    cwd: str | None  # None: child_setup enters it, as the job's user
    preexec: Callable[[], None] | None
    cgroup: Path | None
    podman_name: str | None
    where: str  # "as USER in WORKDIR", for messages


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
    ) -> None:
        self.spool_dir = spool_dir
        self.grace_s = grace_s
        self.cgroups = cgroups
        self.containers = containers or Containers()
        self.track_s = track_s

    @classmethod
    def on_this_node(
        cls, spool_dir: Path, grace_s: float = 10.0, podman_env: Mapping[str, str] | None = None
    ) -> ProcessExecutor:
        """An executor with the cgroups and container runtimes this node has (see Containers for `podman_env`)."""
        containers = Containers.detect(podman_env)
        return cls(spool_dir, grace_s=grace_s, cgroups=CgroupParent.detect(), containers=containers)

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
        who = identity(launch.user)
        workdir = workdir_for(launch, who)
        key = f"{launch.job_id}-{launch.run}-{launch.rank}"
        env = job_environment(launch, who)
        rt = self.containers
        where = f"as {who.name} in {workdir}"
        if launch.container and not launch.container.startswith("/"):
            if rt.podman is None:
                raise CannotStart(_no_runtime(rt, f"the image {launch.container} needs podman"))
            client = {"PATH": DEFAULT_PATH, "HOME": os.environ.get("HOME", "/root"), **rt.podman_env}
            job_env = {**launch.env, **allocation_environment(launch)}
            argv = podman_command(rt.podman, launch.container, rt, launch, who, workdir, job_env, client)
            # podman runs as the agent (root) and switches user itself; the limits are its own.
            return _Prepared(argv, {**job_env, **client}, "/", None, None, container_name(launch), where)
        if not os.path.isdir(workdir):
            raise CannotStart(f"the workdir {workdir} does not exist on this node")
        if launch.container:
            if rt.bwrap is None:
                raise CannotStart(_no_runtime(rt, f"the root file system {launch.container} needs bubblewrap"))
            if not os.path.isdir(launch.container):
                raise CannotStart(f"the container root file system {launch.container} does not exist on this node")
            argv, cwd = bwrap_command(rt.bwrap, launch.container, rt, launch, workdir), "/"  # bwrap --chdir
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
        notes = []
        if (launch.cpus or launch.mem_mib) and prepared.cgroup is None and prepared.podman_name is None:
            notes.append("cpu and memory limits not enforced (no cgroup v2 with cpu and memory on this node)")
        try:
            return await self._spawn_and_wait(launch, prepared, on_started, on_output, cancel, notes)
        finally:
            if prepared.cgroup is not None:
                cgroup_remove(prepared.cgroup)

    async def _spawn_and_wait(
        self,
        launch: JobStart,
        prepared: _Prepared,
        on_started: OnStarted,
        on_output: OnOutput,
        cancel: asyncio.Event,
        notes: list[str],
    ) -> RankResult:
        self.spool_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        base = self.spool_dir / f"{launch.job_id}-{launch.run}-{launch.rank}"
        with _spool(base.with_suffix(".out")) as out, _spool(base.with_suffix(".err")) as err:
            outputs = {1: _Output("stdout", out, on_output), 2: _Output("stderr", err, on_output)}
            protocol = _RankProtocol(outputs)
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
        if await _gone(tree, self.grace_s) == 0:
            return 0
        if tree.cgroup is not None:
            cgroup_kill(tree.cgroup)
        if podman_name is not None:
            await self._podman("rm", "--force", "--time", "0", podman_name)
        tree.signal(await asyncio.to_thread(tree.look), signal.SIGKILL)
        left = await _gone(tree, KILL_WAIT_S)
        if left:
            log.warning("%d process(es) of session %d outlived SIGKILL (stuck in the kernel?)", left, tree.sid)
        return left

    async def _podman(self, *args: str) -> None:
        """A podman call that may fail (the container is already gone), bounded in time."""
        rt = self.containers
        env = {"PATH": DEFAULT_PATH, "HOME": os.environ.get("HOME", "/root"), **rt.podman_env}
        proc = await asyncio.create_subprocess_exec(
            rt.podman or "podman", *args, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL, env=env,
        )  # fmt: skip
        try:
            await asyncio.wait_for(proc.wait(), PODMAN_CALL_S)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            log.warning("podman %s did not finish in %.0f s", " ".join(args), PODMAN_CALL_S)


def _no_runtime(rt: Containers, what: str) -> str:
    if rt.podman is None and rt.bwrap is None:
        return "no container runtime (podman or bubblewrap) on this node"
    return f"{what}, which is not installed on this node"


@contextlib.contextmanager
def _spool(path: Path) -> Iterator[BinaryIO]:
    """A spool file only root reads, emptied first: a rank run again on this node starts a new file."""
    with open(path, "wb", buffering=0, opener=lambda name, flags: os.open(name, flags, 0o600)) as file:
        yield file


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
