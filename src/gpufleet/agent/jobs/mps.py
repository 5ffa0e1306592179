"""The CUDA Multi-Process Service control daemon, started on demand for ranks on MPS replicas.

A node whose `gpu_sharing` is `mps:N` runs its replicas' ranks as MPS clients (protocol.sharing): the head
sends each rank CUDA_MPS_ACTIVE_THREAD_PERCENTAGE and CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, which mean
something only while `nvidia-cuda-mps-control -d` runs. The agent (root) starts it the first time such a
rank comes, with NVIDIA's default pipe and log directories, so the clients find it without any variable
of their own. Without the daemon CUDA ignores those variables and the GPU is simply time-sliced: the
rank still runs, and its result says why its limits did not hold.

The control daemon starts one MPS server per user at a time: ranks of a second user wait until the
first user's clients are gone (NVIDIA's rule since Volta; docs/sharing.md).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from pathlib import Path

log = logging.getLogger(__name__)

PROGRAM = "nvidia-cuda-mps-control"
PIPE_DIR = Path("/tmp/nvidia-mps")  # noqa: S108 - NVIDIA's default: the clients look there unless told otherwise
LOG_DIR = Path("/var/log/nvidia-mps")
START_TIMEOUT_S = 30.0
MPS_VARIABLE = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"  # what marks a rank as an MPS client


class MpsDaemon:
    """Starts the control daemon once; `program` None: not installed here."""

    def __init__(
        self, program: str | None = None, pipe_dir: Path = PIPE_DIR, log_dir: Path = LOG_DIR, *, detect: bool = True
    ) -> None:
        self.program = program if program is not None or not detect else shutil.which(PROGRAM)
        self.pipe_dir = pipe_dir
        self.log_dir = log_dir
        self._lock = asyncio.Lock()

    def running(self) -> bool:
        """Whether a control daemon listens: it made its control pipe in the pipe directory."""
        return (self.pipe_dir / "control").exists()

    async def ensure(self) -> str | None:
        """Start the daemon unless it runs; None when it runs, else why it does not (said in the rank's
        result: its MPS limits do not hold)."""
        async with self._lock:  # two ranks starting at once start one daemon
            if self.running():
                return None
            if self.program is None:
                return f"MPS limits not applied: {PROGRAM} is not installed on this node (the GPU is time-sliced)"
            self.pipe_dir.mkdir(parents=True, exist_ok=True)
            self.log_dir.mkdir(parents=True, exist_ok=True)
            env = {
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir),
                "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir),
            }
            try:
                proc = await asyncio.create_subprocess_exec(
                    self.program, "-d", env=env, stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
                )  # fmt: skip
                _, err = await asyncio.wait_for(proc.communicate(), START_TIMEOUT_S)
            except (OSError, TimeoutError) as exc:
                return f"MPS limits not applied: {PROGRAM} -d failed: {exc or 'timed out'}"
            if proc.returncode != 0:
                said = (err or b"").decode(errors="replace").strip()[:200]
                return f"MPS limits not applied: {PROGRAM} -d exited with {proc.returncode}: {said}"
            log.info("started the MPS control daemon (%s -d)", self.program)
            return None
