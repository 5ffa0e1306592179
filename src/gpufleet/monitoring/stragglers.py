"""Stragglers: a GPU of a running multi-GPU job that works well below its peers in the same job.

In data-parallel training every step waits for the slowest rank, so one slow GPU (a thermal or power
brake, a degraded link, a noisy neighbour) slows the whole job without failing anything. The leader's
attribution pass (every 10 s) already reads every GPU a running job holds with its newest sample; this
compares each GPU with the median of its peers in the same job:

- a GPU is *suspect* when its peers are busy (median utilization at least `BUSY_PCT`) and its own
  utilization, or its power draw, is below `SHARE` of the peers' median;
- suspect on `CONFIRM_PASSES` passes in a row (20 s), it raises `GpuStraggler` naming the job and the
  GPU; the alert resolves once the GPU keeps up again or the job ends.

The median of the *others* is robust to the straggler itself and works for a two-GPU job.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpufleet.core.clock import Clock
from gpufleet.inventory.models import Node
from gpufleet.monitoring import alerts
from gpufleet.monitoring.attribution import HeldGpu
from gpufleet.monitoring.models import Alert

RULE = "GpuStraggler"
BUSY_PCT = 30.0  # below this the job is not computing hard enough for a laggard to matter
SHARE = 0.5  # of the peers' median: "well below"
CONFIRM_PASSES = 2

Key = tuple[int, str, int]  # job id, node, GPU index


@dataclass(frozen=True)
class Straggler:
    job_id: int
    job_name: str
    node: str
    index: int
    util: float
    peers_util: float
    power_w: float | None
    peers_power_w: float | None

    @property
    def key(self) -> Key:
        return (self.job_id, self.node, self.index)

    def summary(self) -> str:
        text = (
            f"GPU {self.index} of job {self.job_id} ({self.job_name}) at {self.util:.0f} % utilization; "
            f"its peers' median {self.peers_util:.0f} %"
        )
        if self.power_w is not None and self.peers_power_w is not None:
            text += f", {self.power_w:.0f} W against {self.peers_power_w:.0f} W"
        return text


def find(held: Iterable[HeldGpu]) -> list[Straggler]:
    """The GPUs working well below their peers in the same job, now (one pass, no confirmation)."""
    by_job: dict[int, list[HeldGpu]] = defaultdict(list)
    for gpu in held:
        by_job[gpu.job.id].append(gpu)
    found = []
    for gpus in by_job.values():
        if len(gpus) < 2:
            continue
        for i, gpu in enumerate(gpus):
            peers = gpus[:i] + gpus[i + 1 :]
            peers_util = statistics.median(p.util for p in peers)
            if peers_util < BUSY_PCT:
                continue
            powers = [p.power_w for p in peers if p.power_w is not None]
            peers_power = statistics.median(powers) if powers else None
            slow = gpu.util < SHARE * peers_util
            weak = gpu.power_w is not None and peers_power is not None and gpu.power_w < SHARE * peers_power
            if slow or weak:
                found.append(
                    Straggler(
                        gpu.job.id, gpu.job.name, gpu.node, gpu.index, gpu.util, peers_util, gpu.power_w, peers_power
                    )
                )
    return found


@dataclass
class StragglerWatch:
    """The leader's memory of suspects between passes; the alerts are the state everyone sees."""

    suspects: dict[Key, int] = field(default_factory=dict)  # passes in a row

    def check(self, session: Session, clock: Clock, held: list[HeldGpu]) -> list[Alert]:
        """One pass over every GPU running jobs hold (`attribution.held_gpus`): fire for confirmed
        stragglers, resolve the ones that keep up again. Returns the alerts that changed (to notify)."""
        current = {s.key: s for s in find(held)}
        self.suspects = {key: self.suspects.get(key, 0) + 1 for key in current}
        confirmed = {key: s for key, s in current.items() if self.suspects[key] >= CONFIRM_PASSES}
        changed: list[Alert] = []
        node_ids = dict(session.execute(select(Node.name, Node.id)).all()) if confirmed else {}
        for straggler in confirmed.values():
            fired = alerts.fire(
                session,
                clock,
                RULE,
                node_ids.get(straggler.node),
                straggler.node,
                straggler.summary(),
                straggler.index,
                entity=_entity(straggler),
            )
            if fired is not None:
                changed.append(fired)
        kept = {alerts.fingerprint(RULE, s.node, s.index, _entity(s)) for s in confirmed.values()}
        for alert in list(session.scalars(select(Alert).where(Alert.rule == RULE, Alert.status == "firing"))):
            if alert.fingerprint not in kept:  # keeps up again, or its job ended
                changed.append(alerts.end(clock, alert))
        return changed


def _entity(s: Straggler) -> str:
    return f"job:{s.job_id}/gpu:{s.index}"
