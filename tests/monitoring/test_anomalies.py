"""Metric anomalies: each GPU series against its own baseline at the same load, never against a
fixed number; load changes are not anomalies, lasting faults stay visible."""

import random
import re

from gpufleet.monitoring.anomalies import CONSECUTIVE, WARMUP, AnomalyWatch
from gpufleet.monitoring.thresholds import Transition

RNG_SEED = 7


def gpu(util: float, temp: float, power: float, clock: float) -> dict[str, dict[str, float]]:
    return {"gpu:3": {"gpu_util": util, "gpu_temp_c": temp, "power_w": power, "sm_clock_mhz": clock}}


class Node:
    """Feeds one GPU's samples, with a little noise as real sensors have."""

    def __init__(self) -> None:
        self.watch = AnomalyWatch()
        self.rng = random.Random(RNG_SEED)
        self.ts = 0.0

    def feed(self, n: int, util: float, temp: float, power: float, clock: float) -> list[Transition]:
        out: list[Transition] = []
        for _ in range(n):
            self.ts += 5
            noisy = gpu(
                util,
                temp + self.rng.uniform(-1, 1),
                power * self.rng.uniform(0.98, 1.02),
                clock + self.rng.choice((-15.0, 0.0, 15.0)),
            )
            out += self.watch.observe(1, [(self.ts, noisy)])
        return out


def fired(transitions: list[Transition]) -> list[tuple[str, bool]]:
    return [(t.rule.name, t.firing) for t in transitions]


def test_steady_work_and_load_changes_raise_nothing() -> None:
    node = Node()
    assert node.feed(200, 0, 38, 70, 345) == []  # idle
    assert node.feed(300, 98, 71, 690, 1755) == []  # a job starts: another band, its own baseline
    assert node.feed(100, 0, 39, 72, 345) == []  # and ends
    assert node.feed(50, 98, 72, 700, 1770) == []


def test_a_gpu_hotter_than_usual_at_the_same_load_fires_and_resolves() -> None:
    node = Node()
    node.feed(WARMUP + 40, 98, 71, 690, 1755)
    hot = node.feed(CONSECUTIVE, 98, 86, 690, 1755)  # 15 C over its own normal at the same load
    assert fired(hot) == [("GpuTemperatureAnomaly", True)]
    assert hot[0].entity == "gpu:3"
    assert re.fullmatch(r"GPU 3 temperature 8[5-7] C, usually 71 C \(±0\.\d\) at this load", hot[0].summary)
    assert node.feed(100, 98, 86, 690, 1755) == []  # a lasting fault stays firing: it is not learnt as normal
    assert fired(node.feed(1, 98, 71, 690, 1755)) == [("GpuTemperatureAnomaly", False)]


def test_cooler_faster_or_brief_departures_are_not_alerts() -> None:
    node = Node()
    node.feed(WARMUP + 40, 98, 71, 690, 1755)
    assert node.feed(10, 98, 55, 690, 1755) == []  # cooler than usual is good news
    assert node.feed(10, 98, 71, 690, 1980) == []  # a faster clock too
    assert node.feed(CONSECUTIVE - 1, 98, 90, 690, 1755) == []  # too brief
    assert node.feed(5, 98, 71, 690, 1755) == []


def test_a_sagging_clock_or_an_odd_power_draw_under_the_same_load_fires() -> None:
    node = Node()
    node.feed(WARMUP + 40, 98, 71, 690, 1755)
    assert fired(node.feed(CONSECUTIVE, 98, 71, 690, 1200)) == [("GpuClockAnomaly", True)]
    assert fired(node.feed(1, 98, 71, 690, 1755)) == [("GpuClockAnomaly", False)]
    assert fired(node.feed(CONSECUTIVE, 98, 71, 420, 1755)) == [("GpuPowerAnomaly", True)]  # a power brake


def test_nothing_is_judged_before_the_baseline_has_warmed_up() -> None:
    node = Node()
    assert node.feed(WARMUP - 10, 98, 71, 690, 1755) == []
    assert node.feed(CONSECUTIVE, 98, 95, 690, 1755) == []


def test_a_removed_node_is_forgotten() -> None:
    node = Node()
    node.feed(WARMUP + 5, 98, 71, 690, 1755)
    node.feed(CONSECUTIVE, 98, 90, 690, 1755)
    assert node.watch.firing
    node.watch.forget(1)
    assert (node.watch.baselines, node.watch.firing) == ({}, set())
