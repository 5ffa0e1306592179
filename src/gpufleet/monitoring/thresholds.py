"""Threshold alert rules: a metric compared with a value, held for a while.

A rule applies to every entity of its kind (every GPU, every disk ...). It fires for an entity once
the comparison has held on every sample for `for_s` seconds, and resolves at the first sample where
it does not. The clock for `for_s` is the samples' own times, so a late batch is judged by when it
was measured. Evaluation is pure bookkeeping in memory; only firing and resolving touch the database.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass, field

from gpufleet.monitoring.checks import Entities

OPS: dict[str, Callable[[float, float], bool]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
}
ENTITY_KINDS = ("host", "gpu", "disk", "nic", "ib")


@dataclass(frozen=True)
class ThresholdRule:
    name: str
    metric: str
    entity_kind: str
    op: str
    threshold: float
    for_s: float
    severity: str
    builtin: bool = False

    def holds(self, value: float) -> bool:
        return OPS[self.op](value, self.threshold)

    def describe(self, entity: str, value: float) -> str:
        return f"{entity} {self.metric} = {value:g} ({self.op} {self.threshold:g} for {self.for_s:g} s)"


# Shipped with gpufleet: what every GPU cluster wants to hear about. Admins add their own.
BUILTIN_RULES: tuple[ThresholdRule, ...] = (
    ThresholdRule("GpuTemperatureHigh", "gpu_temp_c", "gpu", ">=", 85, 120, "warning", builtin=True),
    ThresholdRule("GpuMemoryTemperatureHigh", "mem_temp_c", "gpu", ">=", 95, 120, "warning", builtin=True),
    ThresholdRule("GpuRowRemapFailure", "remapped_rows_failure", "gpu", ">", 0, 0, "critical", builtin=True),
    ThresholdRule("DiskAlmostFull", "disk_used_pct", "disk", ">=", 90, 300, "warning", builtin=True),
    ThresholdRule("HostMemoryExhausted", "mem_used_pct", "host", ">=", 97, 120, "warning", builtin=True),
)


@dataclass(frozen=True)
class Transition:
    rule: ThresholdRule
    node_id: int
    entity: str
    firing: bool  # True: fire; False: resolve
    summary: str = ""

    @property
    def gpu(self) -> int | None:
        return int(self.entity[4:]) if self.entity.startswith("gpu:") else None


@dataclass
class ThresholdState:
    """Per (rule, node, entity): since when the comparison has held, and whether it fired."""

    held_since: dict[tuple[str, int, str], float] = field(default_factory=dict)
    firing: set[tuple[str, int, str]] = field(default_factory=set)

    def observe(
        self, node_id: int, samples: list[tuple[float, Entities]], rules: list[ThresholdRule]
    ) -> list[Transition]:
        """Feed a node's new samples (oldest first); returns the alerts to fire and to resolve."""
        out: list[Transition] = []
        for ts, entities in samples:
            for rule in rules:
                prefix = rule.entity_kind if rule.entity_kind == "host" else rule.entity_kind + ":"
                for entity, values in entities.items():
                    if not entity.startswith(prefix):
                        continue
                    value = values.get(rule.metric)
                    key = (rule.name, node_id, entity)
                    if value is not None and rule.holds(value):
                        since = self.held_since.setdefault(key, ts)
                        if key not in self.firing and ts - since >= rule.for_s:
                            self.firing.add(key)
                            out.append(Transition(rule, node_id, entity, True, rule.describe(entity, value)))
                    else:
                        self.held_since.pop(key, None)
                        if key in self.firing:
                            self.firing.discard(key)
                            out.append(Transition(rule, node_id, entity, False))
        return out

    def forget_rule(self, name: str) -> list[tuple[int, str]]:
        """A rule was removed: drop its state; returns the (node, entity) pairs it had firing."""
        firing = [(n, e) for r, n, e in self.firing if r == name]
        self.firing = {k for k in self.firing if k[0] != name}
        self.held_since = {k: v for k, v in self.held_since.items() if k[0] != name}
        return firing
