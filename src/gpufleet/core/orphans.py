"""A child process that ends when its parent does, however the parent ends.

A head process started by the supervisor (`gpufleet server --workers N`) holds the listening socket and
may hold the leader lease. If the supervisor is killed with SIGKILL (or crashes), it cannot stop its
processes, and an orphan would go on serving a socket and leading a fleet that nobody supervises; a
restarted head could not bind its address. Linux sends a chosen signal to a process whose parent dies
(`prctl(PR_SET_PDEATHSIG)`); under systemd the unit's cgroup is stopped as a whole anyway, this covers
containers, shells and tests.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import signal
import sys

log = logging.getLogger(__name__)
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def end_with_parent(sig: signal.Signals = signal.SIGTERM) -> bool:
    """Ask the kernel for `sig` when this process's parent dies; send it now if the parent is already
    gone. Returns False where the kernel has no such request (not Linux) or refused it."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            log.warning("cannot ask to end with the parent process: %s", os.strerror(ctypes.get_errno()))
            return False
    except (OSError, AttributeError) as exc:
        log.warning("cannot ask to end with the parent process: %s", exc)
        return False
    parent = multiprocessing.parent_process()
    expected = parent.pid if parent is not None else None
    if expected is not None and os.getppid() != expected:
        os.kill(os.getpid(), sig)  # the parent died before the request was made: it will never come
    return True
