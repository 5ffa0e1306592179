"""A Slurm job's output, read from the file Slurm writes (`slurm_output_dir/gpufleet-JOBID.out`).

The head reads it only when that directory is shared with the nodes (and configured): Slurm writes a
batch job's stdout and stderr there, together, from the node that runs the script. The page has the
shape of the built-in jobs' output: the cursor (`after`, `next_after`, a chunk's `id`) is the byte
offset in the file, so a client follows a Slurm job exactly as it follows any other.
"""

from __future__ import annotations

from pathlib import Path

from gpufleet.core.errors import NotFound
from gpufleet.jobs.models import FINAL_STATES, Job
from gpufleet.jobs.schemas import OutputChunk, OutputPage
from gpufleet.jobs.slurm.batch import output_path

PAGE_BYTES = 256 * 1024


def read(job: Job, output_dir: Path | None, after: int = 0, limit_bytes: int = PAGE_BYTES) -> OutputPage:
    """Output after byte `after`. Raises NotFound when the head cannot see the file (with the reason)."""
    if output_dir is None:
        raise NotFound(
            f"job {job.id} runs in Slurm, which writes its output on the node: set slurm_output_dir to a "
            "directory the head and the nodes share to read it here"
        )
    if job.external_id is None:
        return OutputPage(chunks=[], next_after=after, done=job.state in FINAL_STATES, state=job.state)
    path = output_path(output_dir, job.external_id)
    try:
        with path.open("rb") as stream:
            stream.seek(after)
            data = stream.read(limit_bytes)
            at_end = not stream.read(1)
    except FileNotFoundError:
        if job.started_at is None:  # not started: Slurm has not created it yet
            return OutputPage(chunks=[], next_after=after, done=job.state in FINAL_STATES, state=job.state)
        raise NotFound(f"job {job.id}'s output file {path} is not there (or not shared with the head)") from None
    except OSError as exc:
        raise NotFound(f"cannot read job {job.id}'s output file {path}: {exc.strerror or exc}") from None
    if not at_end:  # a page ends on a whole character: keep a split UTF-8 sequence for the next page
        cut = len(data)
        while cut > 0 and (data[cut - 1] & 0xC0) == 0x80:
            cut -= 1
        if cut > 0 and data[cut - 1] >= 0xC0:
            data = data[: cut - 1]
    text = data.decode("utf-8", errors="replace").replace("\x00", "\ufffd")
    next_after = after + len(data)
    chunks = [OutputChunk(id=next_after, run=max(job.run, 1), rank=0, stream="stdout", data=text)] if data else []
    return OutputPage(chunks=chunks, next_after=next_after, done=job.state in FINAL_STATES and at_end, state=job.state)
