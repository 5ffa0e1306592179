"""A simulated node's own checks: whatever a test or benchmark sets, since a simulated node has no host to check."""

from __future__ import annotations

import threading
from collections.abc import Iterable

from gpufleet.agent.checks.ports import CheckSource
from gpufleet.protocol.metrics import CheckResult


class SimulatedChecks:
    """A CheckSource that answers the results last `set` (none at first: nothing to report), then those of
    `real` (the node's required shared mounts judged by the agent's own StorageChecks), if given."""

    def __init__(self, real: CheckSource | None = None) -> None:
        self._lock = threading.Lock()  # `run` is called from a worker thread, `set` from anywhere
        self._results: list[CheckResult] = []
        self.real = real

    def set(self, results: Iterable[CheckResult]) -> None:
        """What the next rounds report, e.g. `[CheckResult(name="nhc", status=1, message="no /scratch")]`."""
        with self._lock:
            self._results = list(results)

    def run(self) -> list[CheckResult]:
        with self._lock:
            results = list(self._results)
        if self.real is not None:
            set_names = {r.name for r in results}
            results += [r for r in self.real.run() if r.name not in set_names]
        return results
