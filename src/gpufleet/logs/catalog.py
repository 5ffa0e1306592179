"""The Xid table (data: xid_catalog.csv beside this module) and the per-Xid policy admins override.

Pure and dependency-free: the agent classifies its own kernel log with it, the CLI classifies files
offline, and the head's health checks decide verdicts by it.
"""

from __future__ import annotations

import csv
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Literal, get_args

from gpufleet.protocol.metrics import XidAction

Action = XidAction
Severity = Literal["info", "warning", "critical"]
ACTIONS: tuple[str, ...] = get_args(Action)
# Actions that take the GPU (and so the node) out of service: the node becomes `failed` and is drained.
REMOVING: frozenset[str] = frozenset({"drain", "reset_gpu", "reboot"})
UNKNOWN_XID_ACTION: Action = "warn"  # a code the table does not know: worth a look, not a drain


def severity_of(action: Action) -> Severity:
    if action in REMOVING:
        return "critical"
    return "warning" if action == "warn" else "info"


@dataclass(frozen=True)
class XidInfo:
    code: int
    name: str
    category: str
    action: Action
    meaning: str


@functools.cache
def xid_table() -> Mapping[int, XidInfo]:
    """The shipped table, read once. A malformed row is a packaging bug: it raises ValueError."""
    text = resources.files("gpufleet.logs").joinpath("xid_catalog.csv").read_text(encoding="utf-8")
    rows = csv.DictReader(line for line in text.splitlines() if line and not line.startswith("#"))
    table: dict[int, XidInfo] = {}
    for row in rows:
        action = row["action"]
        if action not in ACTIONS:
            raise ValueError(f"xid_catalog.csv: Xid {row['code']}: unknown action {action!r}")
        info = XidInfo(int(row["code"]), row["name"], row["category"], action, row["meaning"])  # type: ignore[arg-type]
        table[info.code] = info
    return table


@dataclass(frozen=True)
class XidPolicy:
    """What to do about each Xid: the table's default, or the admin's override (a category's health
    policy's `xid_actions`, or `--xid-action` on the command line)."""

    overrides: Mapping[int, Action] = field(default_factory=dict)

    @classmethod
    def from_setting(cls, value: Mapping[str, str] | Mapping[int, str]) -> XidPolicy:
        """From `{"13": "ignore", "31": "drain"}`. Raises ValueError naming the bad code or action."""
        overrides: dict[int, Action] = {}
        for raw_code, action in value.items():
            try:
                code = int(raw_code)
            except ValueError:
                raise ValueError(f"{raw_code!r} is not an Xid number") from None
            if code < 0:
                raise ValueError(f"{raw_code!r} is not an Xid number")
            if action not in ACTIONS:
                raise ValueError(f"Xid {code}: {action!r} is not one of {', '.join(ACTIONS)}")
            overrides[code] = action  # type: ignore[assignment]
        return cls(overrides)

    def action(self, code: int, suggested: Action | None = None) -> Action:
        """The action for Xid `code`. `suggested` is what the line itself says (Xid 154 names the
        recovery, NVLink Xids say Fatal or Nonfatal); an admin's override beats both."""
        if code in self.overrides:
            return self.overrides[code]
        if suggested is not None:
            return suggested
        info = xid_table().get(code)
        return info.action if info is not None else UNKNOWN_XID_ACTION

    def removes(self, code: int) -> bool:
        """Whether Xid `code` takes the node out of service (drain, reset or reboot)."""
        return self.action(code) in REMOVING


DEFAULT_POLICY = XidPolicy()
