"""The MPS control daemon is started once, on demand, with NVIDIA's directories; where it cannot be, the
reason is given (the rank then runs time-sliced)."""

from __future__ import annotations

import asyncio
import stat
from pathlib import Path

from gpufleet.agent.jobs.mps import MpsDaemon


def _fake_control(tmp_path: Path, exit_code: int = 0) -> Path:
    """A stand-in for nvidia-cuda-mps-control: records its call and, like the daemon, makes its pipe."""
    program = tmp_path / "nvidia-cuda-mps-control"
    program.write_text(
        "#!/bin/sh\n"
        f'echo "$@ $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY" >> {tmp_path}/calls\n'
        f'[ {exit_code} -eq 0 ] && : > "$CUDA_MPS_PIPE_DIRECTORY/control"\n'
        f'[ {exit_code} -eq 0 ] || echo "cannot open the driver" >&2\n'
        f"exit {exit_code}\n"
    )
    program.chmod(program.stat().st_mode | stat.S_IXUSR)
    return program


def test_the_daemon_starts_once_for_ranks_arriving_together(tmp_path: Path) -> None:
    daemon = MpsDaemon(str(_fake_control(tmp_path)), tmp_path / "pipe", tmp_path / "log")

    async def two() -> list[str | None]:
        return list(await asyncio.gather(daemon.ensure(), daemon.ensure()))

    assert asyncio.run(two()) == [None, None]
    assert asyncio.run(daemon.ensure()) is None
    assert (tmp_path / "calls").read_text().splitlines() == [f"-d {tmp_path}/pipe {tmp_path}/log"]
    assert daemon.running()


def test_without_the_program_or_when_it_fails_the_reason_is_given(tmp_path: Path) -> None:
    missing = MpsDaemon(None, tmp_path / "pipe", tmp_path / "log", detect=False)
    failing = MpsDaemon(str(_fake_control(tmp_path, exit_code=1)), tmp_path / "pipe2", tmp_path / "log")

    assert "not installed" in (asyncio.run(missing.ensure()) or "")
    said = asyncio.run(failing.ensure()) or ""
    assert "exited with 1" in said
    assert "cannot open the driver" in said
    assert not failing.running()
