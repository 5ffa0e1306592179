"""Metric anomalies: a GPU's temperature, power or SM clock far from its own usual value at that load.

A fixed threshold (`GpuTemperatureHigh` at 85 C) catches a GPU that is hot. It misses one that runs
15 C hotter than it did last week at the same work (a fan, dust, a pump), and a clock that sags while
the load does not. So every GPU series is also compared with its own robust baseline, kept per
(node, GPU, metric, load band of 10 % utilization), because temperature, power and clocks follow the
load: an idle GPU and a busy one are different baselines, not an anomaly.

The baseline is an exponentially weighted mean and mean absolute deviation (EWMA/EWMAD): constant
work per sample and a few floats per series, on the monitoring thread, for every sample of 1,000
nodes. After `WARMUP` samples in a band, a value more than `K` deviations (and more than the metric's
floor) from the mean, in the metric's bad direction, is anomalous; `CONSECUTIVE` anomalous samples in
a row fire the metric's alert, and the first normal one resolves it. Anomalous values are not folded
into the baseline, so a fault does not become the new normal while it lasts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpufleet.monitoring.checks import Entities
from gpufleet.monitoring.thresholds import ThresholdRule, Transition

ALPHA = 0.01  # weight of a new sample once warm: the baseline remembers the last few hundred samples
K = 5.0  # deviations (EWMAD; about 0.8 standard deviations each for normal noise)
WARMUP = 60  # samples in a band before it is judged
CONSECUTIVE = 3
BAND_PCT = 10.0  # load bands of 10 % utilization: within one, temperature moves ~3 C, under the floor


@dataclass(frozen=True)
class Watched:
    rule: ThresholdRule  # carries the alert's name and severity (and the metric)
    direction: int  # +1: too high is bad, -1: too low is bad, 0: both
    floor: float  # the smallest departure worth an alert, in the metric's unit
    floor_share: float  # ... or this share of the baseline, whichever is larger
    unit: str
    label: str


def _rule(name: str, metric: str) -> ThresholdRule:
    return ThresholdRule(name, metric, "gpu", "!=", 0, 0, "warning", builtin=True)


WATCHED: tuple[Watched, ...] = (
    Watched(_rule("GpuTemperatureAnomaly", "gpu_temp_c"), +1, 8.0, 0.0, "C", "temperature"),
    Watched(_rule("GpuPowerAnomaly", "power_w"), 0, 30.0, 0.2, "W", "power draw"),
    Watched(_rule("GpuClockAnomaly", "sm_clock_mhz"), -1, 100.0, 0.1, "MHz", "SM clock"),
)


@dataclass
class Baseline:
    mean: float
    dev: float = 0.0
    count: int = 1
    bad_in_a_row: int = 0


def band(util: float | None) -> int:
    """The load band of a sample: 0 (0-10 %) to 10 (100 %); -1 when the sample has no utilization."""
    if util is None:
        return -1
    return int(min(max(util, 0.0), 100.0) // BAND_PCT)


@dataclass
class AnomalyWatch:
    """Every watched GPU series' baseline and which alerts fire. Not thread-safe (the judge's thread)."""

    baselines: dict[tuple[int, str, str, int], Baseline] = field(default_factory=dict)
    firing: set[tuple[str, int, str]] = field(default_factory=set)  # (rule, node, entity)

    def observe(self, node_id: int, samples: list[tuple[float, Entities]]) -> list[Transition]:
        """Feed a node's new samples (oldest first); returns the alerts to fire and to resolve."""
        out: list[Transition] = []
        for _ts, entities in samples:
            for entity, values in entities.items():
                if not entity.startswith("gpu:"):
                    continue
                load = band(values.get("gpu_util"))
                for watched in WATCHED:
                    value = values.get(watched.rule.metric)
                    if value is not None:
                        out += self._one(node_id, entity, load, watched, value)
        return out

    def forget(self, node_id: int) -> None:
        """A node was removed: drop its series."""
        self.baselines = {k: v for k, v in self.baselines.items() if k[0] != node_id}
        self.firing = {k for k in self.firing if k[1] != node_id}

    def _one(self, node_id: int, entity: str, load: int, watched: Watched, value: float) -> list[Transition]:
        key = (node_id, entity, watched.rule.metric, load)
        base = self.baselines.get(key)
        if base is None:
            self.baselines[key] = Baseline(mean=value)
            return []
        departure = value - base.mean
        allowed = max(K * base.dev, watched.floor, watched.floor_share * abs(base.mean))
        bad_way = watched.direction == 0 or departure * watched.direction > 0
        anomalous = base.count >= WARMUP and bad_way and abs(departure) > allowed
        alert_key = (watched.rule.name, node_id, entity)
        if anomalous:
            base.bad_in_a_row += 1
            if base.bad_in_a_row >= CONSECUTIVE and alert_key not in self.firing:
                self.firing.add(alert_key)
                summary = (
                    f"{entity.replace('gpu:', 'GPU ')} {watched.label} {value:.0f} {watched.unit}, usually "
                    f"{base.mean:.0f} {watched.unit} (\u00b1{base.dev:.1f}) at this load"
                )
                return [Transition(watched.rule, node_id, entity, True, summary)]
            return []
        base.bad_in_a_row = 0
        base.count += 1
        weight = max(ALPHA, 1.0 / base.count)  # a plain average while young, so the first value does not linger
        base.mean += weight * departure
        base.dev += weight * (abs(departure) - base.dev)
        if alert_key in self.firing:
            self.firing.discard(alert_key)
            return [Transition(watched.rule, node_id, entity, False)]
        return []
