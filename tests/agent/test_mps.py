"""MPS control daemons, one per GPU: started on demand with that GPU alone visible and its own pipe
directory, shared by the GPU's MPS ranks, stopped after the last; where one cannot start, the reason is
given (the rank then runs time-sliced)."""

from __future__ import annotations

import asyncio
import stat
from pathlib import Path

from gpufleet.agent.jobs.mps import MpsDaemons

GPU_A = "GPU-aaaa"
GPU_B = "GPU-bbbb"


def _fake_control(tmp_path: Path, exit_code: int = 0) -> Path:
    """A stand-in for nvidia-cuda-mps-control: records each call; `-d` makes the control pipe, as the daemon
    does, and `quit` on its standard input removes it."""
    program = tmp_path / "nvidia-cuda-mps-control"
    program.write_text(
        "#!/bin/sh\n"
        f'[ {exit_code} -eq 0 ] || {{ echo "cannot open the driver" >&2; exit {exit_code}; }}\n'
        'if [ "$1" = "-d" ]; then\n'
        f'  echo "start $CUDA_VISIBLE_DEVICES $CUDA_MPS_PIPE_DIRECTORY" >> {tmp_path}/calls\n'
        '  : > "$CUDA_MPS_PIPE_DIRECTORY/control"\n'
        "else\n"
        f'  read command; echo "$command $CUDA_VISIBLE_DEVICES" >> {tmp_path}/calls\n'
        '  rm -f "$CUDA_MPS_PIPE_DIRECTORY/control"\n'
        "fi\n"
    )
    program.chmod(program.stat().st_mode | stat.S_IXUSR)
    return program


def _daemons(tmp_path: Path, program: str | None) -> MpsDaemons:
    return MpsDaemons(program, detect=False, pipe_dir=lambda uuid: tmp_path / "pipes" / uuid, log_root=tmp_path)


def test_one_daemon_per_gpu_started_once_and_stopped_after_its_last_rank(tmp_path: Path) -> None:
    daemons = _daemons(tmp_path, str(_fake_control(tmp_path)))

    async def scenario() -> list[str | None]:
        started = list(await asyncio.gather(daemons.acquire(GPU_A), daemons.acquire(GPU_A), daemons.acquire(GPU_B)))
        await daemons.release(GPU_A)
        assert daemons.running(GPU_A)  # one MPS rank of GPU A is still on it
        await daemons.release(GPU_A)
        return started

    assert asyncio.run(scenario()) == [None, None, None]
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls == [
        f"start {GPU_A} {tmp_path}/pipes/{GPU_A}",
        f"start {GPU_B} {tmp_path}/pipes/{GPU_B}",
        f"quit {GPU_A}",
    ]
    assert not daemons.running(GPU_A)
    assert daemons.running(GPU_B)


def test_without_the_program_or_when_it_fails_the_reason_is_given(tmp_path: Path) -> None:
    missing = _daemons(tmp_path, None)
    failing = _daemons(tmp_path, str(_fake_control(tmp_path, exit_code=1)))

    assert "not installed" in (asyncio.run(missing.acquire(GPU_A)) or "")
    said = asyncio.run(failing.acquire(GPU_A)) or ""
    assert "exited with 1" in said
    assert "cannot open the driver" in said
    assert not failing.running(GPU_A)
