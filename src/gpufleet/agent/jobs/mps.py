"""CUDA Multi-Process Service control daemons, one per GPU, started for ranks on MPS replicas.

A node whose `gpu_sharing` is `mps:N` runs its replicas' ranks as MPS clients (protocol.sharing). The head
marks such a rank (`JobStart.mps`, never the job's own variables) and gives it its GPU's pipe directory and
limits (CUDA_MPS_PIPE_DIRECTORY, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT). The
agent (root) starts that GPU's control daemon (`nvidia-cuda-mps-control -d`, with CUDA_VISIBLE_DEVICES set
to the GPU and its own pipe directory) before the first such rank, and stops it (`quit`) once the GPU's
last MPS rank has ended: other GPUs, and jobs that never asked for MPS, never become MPS clients.

Without a daemon CUDA ignores the variables and the GPU is simply time-sliced: the rank still runs, and its
result says why its limits did not hold. The daemon serves one user's clients at a time: ranks of a second
user wait until the first user's are gone (NVIDIA's rule since Volta; docs/sharing.md).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from gpufleet.protocol.sharing import mps_pipe_directory

log = logging.getLogger(__name__)

PROGRAM = "nvidia-cuda-mps-control"
LOG_ROOT = Path("/var/log")
CALL_TIMEOUT_S = 30.0


class MpsDaemons:
    """The MPS control daemons of this node's GPUs; `program` None: not installed here. `pipe_dir` maps a
    GPU UUID to its pipe directory (the head's naming, protocol.sharing; tests point it elsewhere)."""

    def __init__(
        self,
        program: str | None = None,
        *,
        detect: bool = True,
        pipe_dir: Callable[[str], Path] | None = None,
        log_root: Path = LOG_ROOT,
    ) -> None:
        self.program = program if program is not None or not detect else shutil.which(PROGRAM)
        self._pipe_dir = pipe_dir or (lambda uuid: Path(mps_pipe_directory(uuid)))
        self.log_root = log_root
        self.users: Counter[str] = Counter()  # GPU UUID -> ranks using its daemon now
        self._lock = asyncio.Lock()

    def pipe_dir(self, gpu_uuid: str) -> Path:
        return self._pipe_dir(gpu_uuid)

    def running(self, gpu_uuid: str) -> bool:
        """Whether the GPU's control daemon listens: it made its control pipe in its directory."""
        return (self.pipe_dir(gpu_uuid) / "control").exists()

    async def acquire(self, gpu_uuid: str) -> str | None:
        """A rank will use the GPU's daemon: start it unless it runs. None when it runs, else why it does
        not (the rank runs time-sliced, and says so). Pair every call with `release`."""
        async with self._lock:  # two ranks starting at once start one daemon
            self.users[gpu_uuid] += 1
            if self.running(gpu_uuid):
                return None
            if self.program is None:
                return f"MPS limits not applied: {PROGRAM} is not installed on this node (the GPU is time-sliced)"
            why = await self._control(self.program, gpu_uuid, "-d")
            if why is None:
                log.info("started the MPS control daemon of GPU %s", gpu_uuid)
            return None if why is None else f"MPS limits not applied: {PROGRAM} -d {why}"

    async def release(self, gpu_uuid: str) -> None:
        """A rank stopped using the GPU's daemon; the last one out stops it."""
        async with self._lock:
            self.users[gpu_uuid] -= 1
            if self.users[gpu_uuid] > 0:
                return
            del self.users[gpu_uuid]
            if self.program is not None and self.running(gpu_uuid):
                why = await self._control(self.program, gpu_uuid, stdin=b"quit\n")
                if why is not None:
                    log.warning("the MPS control daemon of GPU %s did not quit: %s", gpu_uuid, why)

    async def _control(self, program: str, gpu_uuid: str, *args: str, stdin: bytes | None = None) -> str | None:
        """Run the control program for one GPU; None on success, else what went wrong."""
        pipe = self.pipe_dir(gpu_uuid)
        logs = self.log_root / f"nvidia-mps-{gpu_uuid}"
        pipe.mkdir(parents=True, exist_ok=True)
        logs.mkdir(parents=True, exist_ok=True)
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "CUDA_VISIBLE_DEVICES": gpu_uuid,
            "CUDA_MPS_PIPE_DIRECTORY": str(pipe),
            "CUDA_MPS_LOG_DIRECTORY": str(logs),
        }
        try:
            proc = await asyncio.create_subprocess_exec(
                program, *args, env=env,
                stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
            _, err = await asyncio.wait_for(proc.communicate(stdin), CALL_TIMEOUT_S)
        except (OSError, TimeoutError) as exc:
            return f"failed: {exc or 'timed out'}"
        if proc.returncode != 0:
            return f"exited with {proc.returncode}: {(err or b'').decode(errors='replace').strip()[:200]}"
        return None
