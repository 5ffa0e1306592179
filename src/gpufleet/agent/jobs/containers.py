"""The container runtimes a rank may run in, and their command lines.

An image name runs with podman (`podman run --network host`, the job's user, no capabilities and
no-new-privileges, `--memory`/`--cpus`, the workdir mounted, the GPUs as CDI devices where an NVIDIA CDI
spec exists, else their /dev/nvidia* files; without CDI the image must bring user-space driver libraries
matching the node's driver); a directory (a root file system) runs with bubblewrap, read-only, the
workdir bound, the network shared.
Building the argv is kept apart from running it, so what would run can be shown and tested as is.

podman runs as the agent (root): its own process environment is fixed (`podman_environment`: PATH, the
agent's HOME, LANG and the configured `podman_env`), never the job's, so a job cannot hand root's podman
LD_PRELOAD or CONTAINERS_CONF. The job's variables reach the container through `--env-file`, a file only
root reads (`env_file_text`). bubblewrap is started by a child that has already become the job's user,
so it runs with no more rights than the job itself.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.agent.jobs.identity import CannotStart, Identity, command_for
from gpufleet.protocol.jobs import DEFAULT_PATH, JobStart

PODMAN_INIT = Path("/usr/libexec/podman/catatonit")  # what `podman run --init` runs
NVIDIA_CONTROL_DEVICES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")
CONTAINER_PREFIX = "gpufleet-"  # every rank's container is named so (`container_name`)
PODMAN_LANG = "C.UTF-8"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


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
    return f"{CONTAINER_PREFIX}{launch.job_id}-{launch.run}-{launch.rank}"


def podman_environment(rt: Containers, home: str | None = None) -> dict[str, str]:
    """podman's own process environment: fixed, whatever the job asks. `home` is the agent's home
    (looked up from the passwd database when None, not taken from the agent's environment)."""
    if home is None:
        try:
            home = pwd.getpwuid(os.geteuid()).pw_dir
        except KeyError:
            home = "/root"
    return {"PATH": DEFAULT_PATH, "HOME": home, "LANG": PODMAN_LANG, **rt.podman_env}


def env_file_text(env: Mapping[str, str]) -> str:
    """The job's variables as podman's `--env-file` reads them, one `NAME=value` a line. Raises
    CannotStart for what such a file cannot carry faithfully: a line break, a NUL, or a value that
    begins with a quote (newer podman versions read quoted values as their contents)."""
    lines = []
    for name, value in env.items():
        if not _ENV_NAME.fullmatch(name):
            raise CannotStart(f"a container job cannot have the variable {name!r}: not a valid name")
        if any(char in value for char in "\n\r\0") or value[:1] in {'"', "'"}:
            raise CannotStart(
                f"a container job cannot have the variable {name} as given: podman's --env-file cannot carry "
                "a value with a line break or NUL, or one that begins with a quote"
            )
        lines.append(f"{name}={value}\n")
    return "".join(lines)


def podman_command(
    podman: str, image: str, rt: Containers, launch: JobStart, who: Identity, workdir: str, env_file: str
) -> list[str]:
    """`podman run` for a rank. The job's variables come from `env_file` (see `env_file_text`), so no
    value shows on a command line nor enters podman's own environment (see `podman_environment`)."""
    argv = [podman, "run", "--rm", "--replace", "--name", container_name(launch), "--network", "host"]
    argv += ["--log-driver", "passthrough"]  # output straight to our pipes, no copy in podman's storage
    if rt.podman_init:
        argv.append("--init")
    argv += ["--user", f"{who.uid}:{who.gid}"]
    for gid in who.groups:
        if gid != who.gid:
            argv += ["--group-add", str(gid)]
    argv += ["--security-opt", "no-new-privileges", "--cap-drop=all"]
    argv += ["--env-file", env_file]
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
    every namespace new but the network's, the workdir and the GPUs' device files bound in. It is meant
    to be started as the job's user (child_setup), with the job's environment, which passes on inside."""
    # / is the read-only root file system, so the job's /tmp is a fresh tmpfs of its own.
    argv = [bwrap, "--ro-bind", rootfs, "/", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]  # noqa: S108
    argv += ["--unshare-all", "--share-net"]
    if workdir != "/":
        argv += ["--bind", workdir, workdir]
    argv += ["--chdir", workdir]
    for device in rt.gpu_device_files(launch.gpu_indexes):
        argv += ["--dev-bind", device, device]
    return [*argv, "--", *command_for(launch)]
