"""How the long-running processes log: one format, set once per process (the head, each of its `workers`
processes, the agent, the simulator)."""

from __future__ import annotations

import logging

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure(level: str) -> None:
    """Send this process's records at `level` and above to stderr in gpufleet's format."""
    logging.basicConfig(level=level.upper(), format=FORMAT)
