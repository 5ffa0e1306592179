"""A finished Slurm job's end, from `sacct` (slurmdbd, or `sacct -c` over jobcomp). Pure parsing.

Only needed for a job that left Slurm's queue before gpufleet saw its end (the head was away for longer
than MinJobAge); every other end is read from `squeue`.
"""

from __future__ import annotations

from datetime import UTC, datetime

from gpufleet.jobs.models import JobState
from gpufleet.jobs.slurm.queue import SLURM_STATES


def parse_sacct_end(output: str, slurm_id: str) -> tuple[JobState, str, int | None, datetime | None] | None:
    """From `sacct -n -P -X -j ID -o JobID,State,ExitCode,End`: (state, Slurm's word, exit code, end) of
    that job, or None when sacct lists it not at all or not yet ended."""
    for line in output.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 4 or parts[0] != slurm_id:
            continue
        word = parts[1].split()[0].upper() if parts[1].strip() else ""  # "CANCELLED by 0"
        state = SLURM_STATES.get(word)
        if state is None or state == JobState.PENDING:
            return None
        code: int | None = None
        exit_text, _, signal_text = parts[2].partition(":")  # "exit:signal"
        if exit_text.isdigit():
            code = 128 + int(signal_text) if signal_text.isdigit() and int(signal_text) else int(exit_text)
        try:
            ended = datetime.fromisoformat(parts[3]).replace(tzinfo=UTC) if parts[3][:1].isdigit() else None
        except ValueError:
            ended = None
        return state, word.lower(), code, ended
    return None
