"""A simulated node's own checks: whatever a test or benchmark sets, since a simulated node has no host to check."""

from __future__ import annotations

import threading
from collections.abc import Iterable

from gpufleet.protocol.metrics import CheckResult


class SimulatedChecks:
    """A CheckSource that answers the results last `set` (none at first: nothing to report)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # `run` is called from a worker thread, `set` from anywhere
        self._results: list[CheckResult] = []

    def set(self, results: Iterable[CheckResult]) -> None:
        """What the next rounds report, e.g. `[CheckResult(name="nhc", status=1, message="no /scratch")]`."""
        with self._lock:
            self._results = list(results)

    def run(self) -> list[CheckResult]:
        with self._lock:
            return list(self._results)
