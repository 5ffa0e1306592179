"""Threshold rules: fire only after the condition held for the rule's duration, per entity."""

from gpufleet.monitoring.thresholds import ThresholdRule, ThresholdState

HOT = ThresholdRule("GpuHot", "gpu_temp_c", "gpu", ">=", 85, 60, "warning")
FULL = ThresholdRule("DiskFull", "disk_used_pct", "disk", ">", 90, 0, "critical")


def sample(**gpu_temps: float) -> dict[str, dict[str, float]]:
    return {f"gpu:{k[1:]}": {"gpu_temp_c": v} for k, v in gpu_temps.items()} | {"host": {"cpu_util": 1.0}}


def test_fires_after_the_duration_and_resolves_at_once() -> None:
    state = ThresholdState()
    assert state.observe(1, [(0.0, sample(g0=90, g1=40))], [HOT]) == []
    assert state.observe(1, [(30.0, sample(g0=91, g1=40))], [HOT]) == []
    fired = state.observe(1, [(60.0, sample(g0=92, g1=40))], [HOT])
    assert [(t.rule.name, t.entity, t.firing, t.gpu) for t in fired] == [("GpuHot", "gpu:0", True, 0)]
    assert fired[0].summary == "gpu:0 gpu_temp_c = 92 (>= 85 for 60 s)"
    assert state.observe(1, [(65.0, sample(g0=93, g1=40))], [HOT]) == []  # already firing: no repeat
    resolved = state.observe(1, [(70.0, sample(g0=80, g1=40))], [HOT])
    assert [(t.entity, t.firing) for t in resolved] == [("gpu:0", False)]


def test_a_dip_restarts_the_clock() -> None:
    state = ThresholdState()
    state.observe(1, [(0.0, sample(g0=90))], [HOT])
    state.observe(1, [(40.0, sample(g0=70))], [HOT])
    assert state.observe(1, [(80.0, sample(g0=90)), (120.0, sample(g0=90))], [HOT]) == []
    assert [t.firing for t in state.observe(1, [(140.0, sample(g0=90))], [HOT])] == [True]


def test_other_entity_kinds_and_a_removed_rule() -> None:
    state = ThresholdState()
    fired = state.observe(
        2, [(0.0, {"disk:/scratch": {"disk_used_pct": 95.0}, "disk:/": {"disk_used_pct": 10.0}})], [FULL]
    )
    assert [(t.entity, t.gpu) for t in fired] == [("disk:/scratch", None)]
    assert state.forget_rule("DiskFull") == [(2, "disk:/scratch")]
    assert state.firing == set()
