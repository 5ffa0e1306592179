"""The agent's side of Slurm: the prolog and epilog gpufleet ships (`prolog.sh`, `epilog.sh`, package
data) and the reader of the job map they write (`mapping`)."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path
from typing import Literal


def script_path(which: Literal["prolog", "epilog"]) -> Path:
    """Where the installed package keeps the prolog or epilog, for an admin to copy into /etc/slurm."""
    return Path(str(files(__name__).joinpath(f"{which}.sh")))
