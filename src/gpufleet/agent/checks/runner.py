"""One round of every node-side check: custom executables and required services a few at a time, then mounts.

Each check is isolated: one that crashes, hangs or cannot start gives its own status-2 result and
the others still run. The results must travel in the first part of a sample (the head keeps the
latest sample's checks), so they are kept under CHECKS_BUDGET_BYTES of JSON.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

from gpufleet.agent.checks.executables import CustomChecks
from gpufleet.agent.checks.mounts import MOUNTINFO, Mount, check_mounts, mount_check_name
from gpufleet.agent.checks.ports import MAX_CHECKS, WARN, result, valid_name
from gpufleet.agent.checks.services import check_service, service_check_name
from gpufleet.protocol.metrics import CheckResult

log = logging.getLogger(__name__)

DEFAULT_CONCURRENCY = 4


class MountJudge(Protocol):
    """Gives a mounted required path a verdict of its own (agent.storage.checks.StorageChecks)."""

    def judge(self, path: str, mount: Mount) -> CheckResult | None: ...


CHECKS_BUDGET_BYTES = 32 * 1024  # half a channel message, leaving the rest for the sample's entities
SHORT_MESSAGE_CHARS = 64


class HostChecks:
    """The node's checks as configured (`checks_dir`, `required_services`, `required_mounts`): the
    agent's CheckSource. `run` blocks for the round; the daemon calls it in a worker thread."""

    def __init__(
        self,
        checks_dir: Path,
        *,
        timeout_s: float = 10.0,
        services: Sequence[str] = (),
        mounts: Sequence[str] = (),
        concurrency: int = DEFAULT_CONCURRENCY,
        enforce_owner: bool | None = None,
        systemctl: str = "systemctl",
        mountinfo: Path = MOUNTINFO,
        storage: MountJudge | None = None,
    ) -> None:
        self.custom = CustomChecks(checks_dir, timeout_s=timeout_s, enforce_owner=enforce_owner)
        self.timeout_s = timeout_s
        # The settings validate both; a name the protocol would refuse is dropped here all the same, so
        # that `run` can never raise on one.
        self.services = _nameable(services, service_check_name)
        self.mounts = _nameable(mounts, mount_check_name)
        self.concurrency = concurrency
        self.systemctl = systemctl
        self.mountinfo = mountinfo
        self.storage = storage  # judges required shared mounts by probing them (agent.storage.checks)

    def run(self) -> list[CheckResult]:
        """Every check once: custom checks by name, then services and mounts in the order configured.
        Raises nothing."""
        found, results = self.custom.find()
        jobs: list[tuple[str, Callable[[], CheckResult]]] = [
            (check.name, functools.partial(self.custom.run_one, check)) for check in found
        ]
        jobs += [(service_check_name(unit), functools.partial(self._service, unit)) for unit in self.services]
        if jobs:
            with ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="gpufleet-check") as pool:
                futures = [(name, pool.submit(job)) for name, job in jobs]
                for name, future in futures:
                    try:
                        results.append(future.result())
                    except Exception as exc:  # a bug in one check's handling must not cost the others
                        log.exception("check %s could not be judged", name)
                        results.append(result(name, WARN, f"check crashed: {type(exc).__name__}: {exc}"))
        results += check_mounts(self.mounts, self.mountinfo, self.storage.judge if self.storage else None)
        return fit(unique(results))

    def _service(self, unit: str) -> CheckResult:
        return check_service(unit, timeout_s=self.timeout_s, systemctl=self.systemctl)


def _nameable(items: Sequence[str], name: Callable[[str], str]) -> list[str]:
    kept = []
    for item in dict.fromkeys(items):
        if valid_name(name(item)):
            kept.append(item)
        else:
            log.warning("checks: %.80r cannot be a check name; left out", name(item))
    return kept


def unique(results: list[CheckResult]) -> list[CheckResult]:
    """The first result of each name (`/a/b` and `/a-b` are both `mount:a-b`); later ones logged, dropped."""
    seen: dict[str, CheckResult] = {}
    for item in results:
        if item.name in seen:
            log.warning("checks: a second check named %s is left out", item.name)
            continue
        seen[item.name] = item
    return list(seen.values())


def _size(results: list[CheckResult]) -> int:
    return sum(len(r.model_dump_json().encode()) + 1 for r in results)


def fit(results: list[CheckResult], budget: int = CHECKS_BUDGET_BYTES) -> list[CheckResult]:
    """At most MAX_CHECKS results within `budget` bytes of JSON, losing the least first: the messages of
    passing checks, then the length of every other message, then passing checks, then the rest in
    order (failures and warnings are kept before passes)."""
    ordered = sorted(results, key=lambda r: r.status == 0)  # stable: failures and warnings first
    if len(ordered) <= MAX_CHECKS and _size(ordered) <= budget:
        return results
    log.warning("checks: %d results exceed what a sample carries; shortening them", len(results))
    ordered = [r.model_copy(update={"message": ""}) if r.status == 0 else r for r in ordered]
    if _size(ordered) > budget:
        ordered = [r.model_copy(update={"message": r.message[:SHORT_MESSAGE_CHARS]}) for r in ordered]
    kept: list[CheckResult] = []
    used = 0
    for item in ordered:
        size = len(item.model_dump_json().encode()) + 1
        if len(kept) >= MAX_CHECKS or used + size > budget:
            break
        kept.append(item)
        used += size
    return kept
