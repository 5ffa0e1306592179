"""Lighter GPU sharing than MIG: time-slicing and MPS, a node setting (`gpu_sharing`), and the replicas
the scheduler hands out.

A node whose `gpu_sharing` is `time-slicing:N` or `mps:N` offers each of its whole GPUs (not those in MIG
mode) as N *replicas*; jobs ask for them as the profile `shared` (`--gpus shared:1`). Time-slicing is the
driver's own: contexts on one GPU take turns, with no memory or fault isolation (one job can take all the
memory, and an Xid in one kills the others). MPS (the CUDA Multi-Process Service) runs the jobs' kernels
side by side; gpufleet caps each at 100/N % of the SMs (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE) and at 1/N of
the memory (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT), but a fault still hits every client of the GPU. MIG is the
only one that isolates; these are for notebooks and small inference that waste a whole GPU.

A replica is named `<GPU UUID>@<mode>:<k>/<N>` in the head's records (a rank's gpu_uuids), so the
scheduler never gives one replica twice and the accounts know each is 1/N of a GPU; the agent is sent
the GPU's own UUID, and for MPS the limits.
"""

from __future__ import annotations

import re
from typing import Literal

SHARED_PROFILE = "shared"
MPS_PIPE_ROOT = "/tmp"  # noqa: S108 - beside NVIDIA's default /tmp/nvidia-mps, where MPS users look for it
MPS_VARIABLES = "CUDA_MPS_"  # what gpufleet sets for MPS replicas; a job may not set them itself
MAX_REPLICAS = 48  # MPS serves at most 48 clients per GPU; time-slicing more gains nothing
SharingMode = Literal["exclusive", "time-slicing", "mps"]

_SETTING = re.compile(r"^(?:exclusive|(?P<mode>time-slicing|mps):(?P<n>\d{1,2}))$")
_REPLICA = re.compile(r"^(?P<uuid>GPU-[^@]{1,80})@(?P<mode>time-slicing|mps):(?P<k>\d{1,2})/(?P<n>\d{1,2})$")


def parse_sharing(text: str) -> tuple[SharingMode, int]:
    """(mode, replicas per GPU) of a gpu_sharing value; ("exclusive", 1) for whole GPUs. Raises ValueError."""
    match = _SETTING.match(text.strip())
    if match is None:
        raise ValueError(f"{text!r}: use exclusive, time-slicing:N or mps:N (N from 2 to {MAX_REPLICAS})")
    if match["mode"] is None:
        return "exclusive", 1
    replicas = int(match["n"])
    if not 2 <= replicas <= MAX_REPLICAS:
        raise ValueError(f"{text!r}: N is the replicas per GPU, from 2 to {MAX_REPLICAS}")
    mode: SharingMode = "mps" if match["mode"] == "mps" else "time-slicing"
    return mode, replicas


def replica_key(gpu_uuid: str, mode: SharingMode, k: int, replicas: int) -> str:
    return f"{gpu_uuid}@{mode}:{k}/{replicas}"


def parse_replica(key: str) -> tuple[str, SharingMode, int] | None:
    """(GPU UUID, mode, replicas) of a replica key; None for anything else (a GPU or MIG UUID)."""
    match = _REPLICA.match(key)
    if match is None:
        return None
    mode: SharingMode = "mps" if match["mode"] == "mps" else "time-slicing"
    return match["uuid"], mode, int(match["n"])


def device_uuid(key: str) -> str:
    """What CUDA_VISIBLE_DEVICES names for a rank's GPU entry: the GPU of a replica, else the entry."""
    found = parse_replica(key)
    return found[0] if found is not None else key


def share_of(key: str) -> float:
    """What one entry of a rank's gpu_uuids counts as in quotas and accounts: 1/N for a replica, else 1."""
    found = parse_replica(key)
    return 1.0 / found[2] if found is not None else 1.0


def mps_pipe_directory(gpu_uuid: str) -> str:
    """Where the MPS control daemon of one GPU listens: one daemon per GPU (agent.jobs.mps), so a node's
    other GPUs and their jobs never become MPS clients."""
    return f"{MPS_PIPE_ROOT}/nvidia-mps-{gpu_uuid}"


def mps_environment(keys: list[str], memory_mib: dict[str, int]) -> dict[str, str]:
    """What a rank on an MPS replica is given (none unless one of `keys` is an MPS replica): its GPU's
    daemon, and its share of the SMs and of the memory (`memory_mib`: a GPU's memory by its UUID). A job of
    replicas has one (submission refuses more), so the limits are for device 0."""
    found = [f for f in (parse_replica(k) for k in keys) if f is not None and f[1] == "mps"]
    if not found:
        return {}
    gpu, _, replicas = found[0]
    env = {
        "CUDA_MPS_PIPE_DIRECTORY": mps_pipe_directory(gpu),
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(max(1, 100 // replicas)),
    }
    if gpu in memory_mib:
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={memory_mib[gpu] // replicas}M"
    return env
