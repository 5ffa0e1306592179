"""What an Ansible run said of each host, read from ansible-runner's output (pure): the play recap's
counts (`results_from`) and the first failure a host's task events gave (`failure_of`), in words an
admin can act on: a loop's first failed item and a failed command's own stderr rather than Ansible's
"One or more items failed" and "non-zero return code".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

_STATS = (("ok", "ok"), ("changed", "changed"), ("failures", "failed"), ("dark", "unreachable"))
_MORE_STATS = (("skipped", "skipped"), ("rescued", "rescued"), ("ignored", "ignored"))


@dataclass
class HostResult:
    """One host's counts from the play recap, and the first failure Ansible reported for it."""

    counts: dict[str, int] = field(default_factory=dict)
    failure: str = ""

    @property
    def failed(self) -> bool:
        return bool(self.counts.get("failed") or self.counts.get("unreachable"))

    def detail(self) -> str:
        shown = ", ".join(f"{k}={self.counts.get(k, 0)}" for k in ("ok", "changed", "failed", "unreachable", "skipped"))
        # a failure that a block rescued is in the events, but the host did not fail
        return f"{self.failure} ({shown})" if self.failure and self.failed else shown


def results_from(stats: Mapping[str, Mapping[str, int]] | None, failures: Mapping[str, str]) -> dict[str, HostResult]:
    """Per-host results from ansible-runner's `stats` (the play recap) and the failures seen in its
    events (pure). Hosts no play reached are absent."""
    out: dict[str, HostResult] = {}
    recap = stats or {}
    for host in set(recap.get("processed", {})) | set(failures):
        counts = {name: int(recap.get(key, {}).get(host, 0)) for key, name in (*_STATS, *_MORE_STATS)}
        if not stats:  # no recap (the run was stopped): a failure seen is the host's result
            counts["failed"] = 1
        out[host] = HostResult(counts, failures.get(host, ""))
    return out


def failure_of(event: Mapping[str, Any]) -> tuple[str, str] | None:
    """(host, message) of a failed or unreachable task event (not one that was ignored)."""
    kind = event.get("event")
    data = event.get("event_data") or {}
    if kind not in ("runner_on_failed", "runner_on_unreachable") or data.get("ignore_errors"):
        return None
    res = data.get("res") or {}
    items = [r for r in res.get("results") or () if isinstance(r, dict) and (r.get("failed") or r.get("unreachable"))]
    if items:  # a loop: its first failed item says why ("One or more items failed" does not)
        res = items[0]
    said = res.get("msg")
    if said == "non-zero return code" and res.get("stderr"):  # a command: its own words on stderr
        said = res["stderr"]
    message = str(said or res.get("stderr") or res.get("reason") or "").strip().splitlines()
    what = "unreachable" if kind == "runner_on_unreachable" else f"task {data.get('task') or '?'!r} failed"
    text = f"{what}: {message[0][:300]}" if message else what
    return str(data.get("host")), text
