"""Log templates: the kinds of line a node category writes, mined with drain3, and the two signals
they give: a template never seen before, and a template written far more often than it usually is.

The classifier (`classify`) knows the lines NVIDIA and the kernel document. Templates catch the rest:
a driver or firmware update that starts printing something new, a daemon that suddenly logs a line
a thousand times a minute. drain3 groups lines into templates by their fixed words; the masks below
first turn what differs between GPUs, NICs and runs (PCI addresses, UUIDs, MACs, IPs, numbers) into
placeholders, so "the same line on another GPU" is the same template.

A category's miner is a plain object here; `mining` keeps its state in the database. Rates are counted
per template in windows of `window_s`; a window's count is compared with the template's baseline, an
exponentially weighted mean of its past windows (zeros included, so a rare template has a low one).
A burst needs the count to be at least `min_count` and `factor` times the baseline, after the
template has `warmup` windows of history. Bursting windows are not folded into the baseline, so a
storm does not become the new normal while it lasts.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field

from drain3 import TemplateMiner
from drain3.masking import MaskingInstruction
from drain3.persistence_handler import PersistenceHandler
from drain3.template_miner_config import TemplateMinerConfig

MAX_TEMPLATES = 2000  # per category; beyond it drain3 forgets the least recently seen
MAX_QUIET_WINDOWS = 60  # windows without a pass (the head was down) counted as zeros, at most
_MASKS = (
    (r"\b[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?\b", "PCI"),  # 0000:91:00.0, PCI:0000:91:00
    (r"\b(?:GPU-|MIG-)?[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b", "UUID"),
    (r"\b(?:[0-9a-fA-F]{2}:){5,19}[0-9a-fA-F]{2}\b", "MAC"),  # Ethernet and 20-byte InfiniBand addresses
    (r"\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?\b", "IP"),
    (r"\b0x[0-9a-fA-F]+\b", "HEX"),
    # Last, digits anywhere: nvswitch3 and nvswitch11, eth0 and eth1 are one device kind. drain3's own
    # numeric rule only reaches whole tokens, and short lines would split on the rest.
    (r"\d+", "NUM"),
)


def _config() -> TemplateMinerConfig:
    config = TemplateMinerConfig()
    config.masking_instructions = [MaskingInstruction(pattern, name) for pattern, name in _MASKS]
    config.drain_max_clusters = MAX_TEMPLATES
    config.drain_sim_th = 0.4
    config.drain_depth = 4
    config.parametrize_numeric_tokens = True  # any other token with a digit in it is a parameter
    config.snapshot_compress_state = True
    return config


class _Held(PersistenceHandler):  # type: ignore[misc]
    """Hands drain3 a saved state, or takes the one it saves: the database holds it (see `mining`)."""

    def __init__(self, state: bytes | None = None) -> None:
        self.state = state

    def save_state(self, state: bytes) -> None:
        self.state = state

    def load_state(self) -> bytes | None:
        return self.state


@dataclass(frozen=True)
class Mined:
    template_id: int  # drain3's cluster id, stable within its category
    template: str
    new: bool


class TemplateSet:
    """One category's templates."""

    def __init__(self, state: bytes | None = None) -> None:
        self._miner = TemplateMiner(_Held(state), _config())
        # Loaded: from here on the state is taken when the caller commits (`snapshot`), not by drain3
        # on every new template, which would serialize the whole tree each time.
        self._miner.persistence_handler = None

    def add(self, message: str) -> Mined:
        result = self._miner.add_log_message(message.strip())
        return Mined(result["cluster_id"], result["template_mined"], result["change_type"] == "cluster_created")

    def template(self, template_id: int) -> str:
        cluster = self._miner.drain.id_to_cluster.get(template_id)
        return cluster.get_template() if cluster is not None else ""

    def ids(self) -> set[int]:
        return set(self._miner.drain.id_to_cluster.keys())

    def __len__(self) -> int:
        return len(self._miner.drain.clusters)

    def snapshot(self) -> bytes:
        held = _Held()
        self._miner.persistence_handler = held
        try:
            self._miner.save_state("commit")
        finally:
            self._miner.persistence_handler = None
        return held.state or b""


@dataclass
class Rate:
    baseline: float = 0.0
    windows: int = 0  # windows judged since the template was first counted
    bursting: bool = False
    node: int = 0  # while bursting: the node named in its alert


@dataclass(frozen=True)
class Burst:
    template_id: int
    count: int  # lines in the window
    baseline: float
    top_node: int  # the node that wrote most of them (when it ended: the node its alert named)
    top_count: int
    firing: bool  # False: the burst is over


@dataclass
class BurstDetector:
    """Per-template line counts in fixed windows, judged against each template's own baseline."""

    window_s: float = 60.0
    factor: float = 10.0
    min_count: int = 50
    warmup: int = 10
    alpha: float = 0.1
    rates: dict[int, Rate] = field(default_factory=dict)
    window: int | None = None  # the open window's index (time // window_s)
    _counts: dict[int, Counter[int]] = field(default_factory=dict)

    def count(self, template_id: int, node_id: int) -> None:
        self._counts.setdefault(template_id, Counter())[node_id] += 1
        self.rates.setdefault(template_id, Rate())

    def advance(self, now: float) -> list[Burst]:
        """Close the open window if `now` is past it; return the bursts that start or end with it."""
        index = int(now // self.window_s)
        if self.window is None:
            self.window = index
        if index <= self.window:
            return []
        changes = self._close()
        # Windows nobody wrote in (the head was down, a quiet spell) count as zeros, a few of them:
        # enough to let a baseline decay, not a loop over a month of absence.
        for _ in range(min(index - self.window - 1, MAX_QUIET_WINDOWS)):
            changes += self._close()
        self.window = index
        return changes

    def _close(self) -> list[Burst]:
        counts, self._counts = self._counts, {}
        changes = []
        for template_id, rate in self.rates.items():
            by_node = counts.get(template_id, Counter())
            n = sum(by_node.values())
            burst = rate.windows >= self.warmup and n >= self.min_count and n >= self.factor * rate.baseline
            if burst != rate.bursting:
                top, top_n = by_node.most_common(1)[0] if burst else (rate.node, by_node[rate.node])
                changes.append(Burst(template_id, n, rate.baseline, top, top_n, burst))
                rate.bursting, rate.node = burst, top
            if not burst:
                rate.baseline = n if rate.windows == 0 else rate.baseline + self.alpha * (n - rate.baseline)
            rate.windows += 1
        return changes

    def dumps(self) -> str:
        return json.dumps(
            {
                "window": self.window,
                "rates": {str(t): [r.baseline, r.windows, r.bursting, r.node] for t, r in self.rates.items()},
            }
        )

    def loads(self, text: str) -> None:
        """Restore baselines; the open window's counts are not kept (a new leader starts a window)."""
        data = json.loads(text)
        self.window = data["window"]
        self.rates = {int(t): Rate(*values) for t, values in data["rates"].items()}
        self._counts = {}

    def forget(self, keep: set[int]) -> None:
        """Drop the rates of templates drain3 no longer holds."""
        self.rates = {t: r for t, r in self.rates.items() if t in keep}
