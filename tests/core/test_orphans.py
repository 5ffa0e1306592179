"""A child that asked to end with its parent ends when the parent is killed with SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import alive

# The parent: starts a child the way uvicorn's supervisor does (multiprocessing, spawn), prints its pid,
# and waits. The child asks to end with its parent, says so, and would otherwise sleep for a minute.
PARENT = """
import multiprocessing, sys, time

def child(ask):
    from gpufleet.core import orphans
    if ask:
        orphans.end_with_parent()
    print("asked", flush=True)
    time.sleep(60)

if __name__ == "__main__":
    process = multiprocessing.get_context("spawn").Process(target=child, args=(sys.argv[1] == "ask",))
    process.start()
    print(process.pid, flush=True)
    process.join()
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("ask", [True, False])
def test_a_child_ends_with_its_killed_parent_only_if_it_asked(ask: bool, tmp_path: Path) -> None:
    script = tmp_path / "parent.py"  # a file: a spawned child imports its parent's main module
    script.write_text(PARENT)
    parent = subprocess.Popen([sys.executable, str(script), "ask" if ask else "no"], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    try:
        assert parent.stdout.readline().strip() == "asked"
        parent.kill()
        parent.wait(10)
        deadline = time.monotonic() + (10 if ask else 1.5)  # an orphan that lives: seen soon enough
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert alive(child) is not ask  # without the request, the orphan lives on
    finally:
        if alive(child):
            os.kill(child, signal.SIGKILL)
