"""Who runs a rank, and with what: the job's user as this node knows it (`identity`), the clean
environment the rank gets (`job_environment`, with what the allocation fixes in `allocation_environment`:
`CUDA_VISIBLE_DEVICES`, `GPUFLEET_*` and torchrun's rendezvous), its workdir and its command.

Separate from the executor so the container runtimes (`containers`) build their argv from the same
answers, and so these rules can be read and tested as plain functions over a `JobStart`. `CannotStart`
lives here because these are the first things that can make a rank impossible to start.
"""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass

from gpufleet.protocol.jobs import DEFAULT_PATH, JobStart


class CannotStart(Exception):
    """The rank cannot start; the message says why and becomes the result's message."""


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


# Jobs never run as a system account (root, daemon, ...): a cluster user named like one on the head
# must not become it on the nodes. Cluster users get uids from 1000 up (auth.users).
DEFAULT_MIN_UID = 1000


def identity(user: str, min_uid: int = DEFAULT_MIN_UID) -> Identity:
    """`user` as this node's passwd and group databases know them. Raises CannotStart when the user
    does not exist, is a system account (uid below `min_uid`), or the agent, not being root, cannot
    become them."""
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise CannotStart(f"user {user} does not exist on this node") from None
    if entry.pw_uid < min_uid:
        raise CannotStart(
            f"refusing to run a job as {user}: uid {entry.pw_uid} is a system account (job_min_uid is {min_uid})"
        )
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
