"""What the pages and the API read of burn-in runs and campaigns (lifecycle.views): lists newest first and
filtered, a run's steps against their thresholds, the fleet view's outliers by median and MAD, held nodes
with why, campaigns with their nodes per phase."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.core.clock import FakeClock
from gpufleet.core.db import transaction
from gpufleet.core.errors import NotFound
from gpufleet.inventory import service as inventory
from gpufleet.inventory.models import Node
from gpufleet.inventory.schemas import NodeSettings
from gpufleet.lifecycle import views
from tests.lifecycle.seed import T0, S, add_campaign, add_run

# One database: views over stored rows (test_campaigns runs both).
pytestmark = pytest.mark.one_database


def _nodes(sessions: sessionmaker[Session], clock: FakeClock, expression: str) -> None:
    with transaction(sessions) as s:
        inventory.add_nodes(s, clock, [expression], NodeSettings())


def test_runs_newest_first_filtered_with_their_steps_counted(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    _nodes(sessions, clock, "gpu[01-03]")
    with transaction(sessions) as s:
        first = add_run(s, "gpu01", [S("gemm", value=650, threshold=600), S("dcgm", "skipped")])
        failed = add_run(
            s,
            "gpu02",
            [S("gemm", "failed", 410, 600), S("gpu-memory", "passed", 3900, 3400, "GB/s")],
            reason="gemm: 410 TFLOPS, under 600",
            at=T0 + timedelta(hours=1),
        )
        running = add_run(s, "gpu01", [S("gemm", "passed", 655, 600), S("thermal", "running")], state="running")
    with transaction(sessions, readonly=True) as s:
        runs = views.list_runs(s)
        assert [r.id for r in runs] == [running, failed, first]
        assert (runs[1].steps, runs[1].passed, runs[1].failed, runs[1].finished) == (2, 1, 1, 2)
        assert (runs[0].steps, runs[0].finished, runs[2].skipped) == (2, 1, 1)
        assert runs[1].reason == "gemm: 410 TFLOPS, under 600"
        assert [r.id for r in views.list_runs(s, node="gpu01")] == [running, first]
        assert [r.id for r in views.list_runs(s, state="failed")] == [failed]
        assert [r.id for r in views.list_runs(s, before=running, limit=1)] == [failed]
        assert views.list_runs(s, node="gpu03") == []


def test_a_run_shows_each_step_against_its_threshold(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    _nodes(sessions, clock, "gpu[01-02]")
    with transaction(sessions) as s:
        run_id = add_run(
            s,
            "gpu01",
            [
                S("gemm", "failed", 480.0, 600.0, job_id=17, attempts=2, evidence={"per_gpu": {"0": 480.0}}),
                S("thermal", "passed", 79.0, 87.0, "C", "lower"),
                S("network", "passed", 380.0, 320.0, "Gbit/s", partner="gpu02"),
                S("dcgm", "skipped", detail="dcgmi not installed"),
            ],
            reason="gemm: 480 TFLOPS under 600",
        )
        s.scalars(select(Node).where(Node.name == "gpu01")).one().hold = "burn-in-failed"
    with transaction(sessions, readonly=True) as s:
        detail = views.get_run(s, run_id)
        assert detail.hold == "burn-in-failed"
        assert detail.run.state == "failed"
        assert detail.run.node_exists
        gemm, thermal, network, dcgm = detail.steps
        assert (gemm.passed, gemm.value, gemm.threshold, gemm.job_id, gemm.attempts) == (False, 480.0, 600.0, 17, 2)
        assert gemm.margin_pct == pytest.approx(-20.0)
        assert gemm.evidence == {"per_gpu": {"0": 480.0}}
        # Lower is better for heat: 79 C under 87 C is headroom.
        assert thermal.passed is True
        assert thermal.margin_pct == pytest.approx(100 * 8 / 87)
        assert network.partner == "gpu02"
        assert (dcgm.passed, dcgm.margin_pct, dcgm.detail) == (None, None, "dcgmi not installed")
        with pytest.raises(NotFound):
            views.get_run(s, run_id + 100)


def test_a_slow_node_is_an_outlier_against_the_fleet_even_above_its_threshold(
    sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    """Sixteen H200 nodes within a few per cent, one 10 % slower (still over its threshold), one far under
    it; four A100 nodes compared only among themselves."""
    _nodes(sessions, clock, "h[01-16]")
    _nodes(sessions, clock, "a[01-04]")
    healthy = [700.0, 702.0, 698.0, 705.0, 695.0, 701.0, 699.0, 703.0, 697.0, 700.0, 704.0, 696.0, 700.0, 702.0]
    with transaction(sessions) as s:
        for i, value in enumerate(healthy, 1):
            add_run(s, f"h{i:02d}", [S("gemm", "passed", value, 600.0)])
        add_run(s, "h15", [S("gemm", "passed", 630.0, 600.0)])
        add_run(s, "h16", [S("gemm", "failed", 350.0, 600.0)])
        for i, value in enumerate((300.0, 305.0, 298.0, 200.0), 1):
            add_run(s, f"a{i:02d}", [S("gemm", "passed", value, 150.0)], gpu_model="NVIDIA A100-SXM4-80GB")
    with transaction(sessions, readonly=True) as s:
        metrics = views.fleet_metrics(s)
    assert [(m.step, m.gpu_model) for m in metrics] == [("gemm", "NVIDIA A100-SXM4-80GB"), ("gemm", "NVIDIA H200")]
    a100, h200 = metrics
    assert h200.median == pytest.approx(700.0)
    assert (h200.minimum, h200.maximum) == (350.0, 705.0)
    assert h200.judged
    assert h200.thresholds == (600.0,)
    assert h200.failed == 1
    assert [(v.node, v.outlier) for v in h200.outliers] == [("h16", "worse"), ("h15", "worse")]
    assert [v.node for v in h200.values[:2]] == ["h16", "h15"]  # worst first
    assert h200.values[0].deviation < h200.values[1].deviation < -views.OUTLIER_SPREADS
    # Four nodes are too few to call one an outlier, however far it lies.
    assert not a100.judged
    assert a100.outliers == []
    assert a100.minimum == 200.0


def test_outliers_follow_the_steps_direction_and_a_tight_fleet_has_a_noise_floor(
    sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    _nodes(sessions, clock, "n[01-08]")
    with transaction(sessions) as s:
        # Temperatures: lower is better, so the hot node is the worse one.
        for i, temp in enumerate((70.0, 71.0, 70.0, 69.0, 70.0, 71.0, 70.0, 84.0), 1):
            add_run(s, f"n{i:02d}", [S("thermal", "passed", temp, 87.0, "C", "lower")], batch="t")
        # Every node measures exactly the same but one 2 % off: within the noise floor (MAD is 0).
        for i in range(1, 9):
            add_run(s, f"n{i:02d}", [S("disk", "passed", 1000.0 if i != 3 else 980.0, 200.0, "MB/s")], batch="d")
    with transaction(sessions, readonly=True) as s:
        disk, thermal = views.fleet_metrics(s)
        assert [(v.node, v.outlier) for v in thermal.outliers] == [("n08", "worse")]
        assert disk.spread == pytest.approx(10.0)
        assert disk.outliers == []
        assert [m.step for m in views.fleet_metrics(s, step="disk")] == ["disk"]


def test_the_fleet_takes_each_nodes_newest_value_of_nodes_that_still_exist(
    sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    _nodes(sessions, clock, "g[01-06]")
    with transaction(sessions) as s:
        for i in range(1, 7):
            add_run(s, f"g{i:02d}", [S("gemm", "passed", 700.0, 600.0)])
        add_run(s, "g01", [S("gemm", "failed", 100.0, 600.0)], at=T0 + timedelta(hours=1))
        add_run(s, "g01", [S("gemm", "passed", 701.0, 600.0)], at=T0 + timedelta(hours=2))  # after repair
        add_run(s, "g01", [S("gemm", "pending")], state="cancelled", at=T0 + timedelta(hours=3))  # no value
        add_run(s, "g06", [S("gemm", "failed", 10.0, 600.0)])
    with transaction(sessions) as s:
        inventory.remove_nodes(s, ["g06"])
    with transaction(sessions, readonly=True) as s:
        (gemm,) = views.fleet_metrics(s)
        newest = {f"g{i:02d}": (701.0 if i == 1 else 700.0) for i in range(1, 6)}
        assert {v.node: v.value for v in gemm.values} == newest
        assert gemm.outliers == []
        # The removed node's runs stay as history.
        assert [r.node_exists for r in views.list_runs(s, node="g06")] == [False, False]


def test_held_nodes_show_their_hold_drain_and_latest_run(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    _nodes(sessions, clock, "gpu[01-03]")
    with transaction(sessions) as s:
        add_run(s, "gpu01", [S("gemm", "passed", 700, 600)])
        last = add_run(s, "gpu01", [S("gemm", "failed", 410, 600)], reason="gemm: 410 under 600", at=T0 + timedelta(1))
        add_run(s, "gpu02", [S("gemm", "running")], state="running")
        for name, hold in (("gpu01", "burn-in-failed"), ("gpu02", "burn-in")):
            node = s.scalars(select(Node).where(Node.name == name)).one()
            node.hold, node.drain_reason, node.drained_at = hold, f"gpufleet: {hold}", T0
    with transaction(sessions, readonly=True) as s:
        held = views.held_nodes(s)
        assert [(h.node, h.hold, h.drain_reason) for h in held] == [
            ("gpu01", "burn-in-failed", "gpufleet: burn-in-failed"),
            ("gpu02", "burn-in", "gpufleet: burn-in"),
        ]
        assert held[0].burnin is not None
        assert held[0].burnin.id == last
        assert held[0].burnin.reason == "gemm: 410 under 600"
        assert held[1].burnin is not None
        assert held[1].burnin.state == "running"
        node = s.scalars(select(Node).where(Node.name == "gpu01")).one()
        line = views.node_burnin(s, node)
        assert (line.hold, line.runs, line.latest.id if line.latest else None) == ("burn-in-failed", 2, last)
        fresh = views.node_burnin(s, s.scalars(select(Node).where(Node.name == "gpu03")).one())
        assert (fresh.hold, fresh.latest, fresh.runs) == (None, None, 0)


def test_campaigns_with_their_nodes_per_phase(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    _nodes(sessions, clock, "sim[001-006]")
    with transaction(sessions) as s:
        old = add_campaign(s, "driver-550", [("sim001", "done"), ("sim002", "done")], state="completed")
        add_campaign(
            s,
            "image-r3",
            [
                ("sim001", "failed"),
                ("sim002", "pending"),
                ("sim003", "waiting"),
                ("sim004", "acting"),
                ("sim005", "pending"),
                ("sim006", "pending"),
            ],
            state="stopped",
            actions=[{"kind": "sync-image", "image": "base", "revision": 3}, {"kind": "burn-in", "profile": "quick"}],
            reason="the canary sim001 failed: sync-image exited 23",
            failures=1,
            at=T0 + timedelta(hours=1),
        )
    with transaction(sessions, readonly=True) as s:
        campaigns = views.list_campaigns(s)
        assert [c.name for c in campaigns] == ["image-r3", "driver-550"]
        stopped = campaigns[0]
        assert stopped.phases == {"failed": 1, "pending": 3, "waiting": 1, "acting": 1}
        assert (stopped.total, stopped.finished, stopped.out) == (6, 1, 2)
        assert stopped.actions == ["sync-image:base@3", "burn-in:quick"]
        assert campaigns[1].id == old
        assert campaigns[1].phases == {"done": 2}
        assert [c.name for c in views.list_campaigns(s, state="stopped")] == ["image-r3"]

        detail = views.get_campaign(s, "image-r3")
        assert detail.campaign.reason == "the canary sim001 failed: sync-image exited 23"
        assert [(n.node, n.phase, n.canary) for n in detail.nodes[:2]] == [
            ("sim001", "failed", True),
            ("sim002", "pending", False),
        ]
        assert detail.nodes[0].action == "sync-image:base@3"
        with pytest.raises(NotFound):
            views.get_campaign(s, "nothing")


def test_actions_read_as_the_cli_writes_them() -> None:
    assert views.describe_action(
        {"kind": "packages", "mode": "install", "packages": ["nvidia-driver-550", "cuda"]}
    ) == ("packages:install:nvidia-driver-550,cuda")
    assert views.describe_action({"kind": "sync-image", "image": "base", "revision": 3}) == "sync-image:base@3"
    # A playbook's text (kept for the campaign to run) is never shown, only its name.
    assert views.describe_action({"kind": "ansible", "playbook": "fw.yml", "_playbook": "- hosts: all"}) == (
        "ansible:fw.yml"
    )
    assert views.describe_action({"kind": "reboot"}) == "reboot"
    assert views.describe_action("reboot") == "reboot"
