"""Under Slurm, burn-in and maintenance campaigns drain and resume nodes through Slurm, as the other drains do:
the lifecycle passes driven with SlurmWorkloadManager over a scripted Slurm that keeps each node's drain
(what `scontrol update` set is what the next `sinfo` reads), every scontrol call recorded."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.core.clock import FakeClock
from gpufleet.core.db import transaction
from gpufleet.inventory.models import Node
from gpufleet.jobs.slurm.commands import Completed, SlurmCommands
from gpufleet.jobs.slurm.manager import SlurmWorkloadManager
from gpufleet.lifecycle import burnin
from gpufleet.protocol.burnin import StepResult
from tests.jobs import helpers
from tests.lifecycle.campaign_helpers import make_fleet
from tests.lifecycle.test_burnin import SINGLE, answer_running, healthy, node_row, runs

pytestmark = pytest.mark.one_database


class ScriptedSlurm:
    """Slurm's view of the nodes: drained with a reason or idle, as scontrol last set them; sinfo in text."""

    def __init__(self, names: Sequence[str]) -> None:
        self.reasons: dict[str, str | None] = dict.fromkeys(names)
        self.updates: list[list[str]] = []
        self.most_drained = 0

    def __call__(self, argv: Sequence[str], *, env: Mapping[str, str], timeout_s: float) -> Completed:
        del env, timeout_s
        if argv[0] == "sinfo":
            return Completed(tuple(argv), 0, "".join(self._line(n, r) for n, r in self.reasons.items()), "")
        assert list(argv[:2]) == ["scontrol", "update"], argv
        self.updates.append(list(argv))
        fields = dict(a.split("=", 1) for a in argv[2:])
        name = fields["nodename"]
        assert name in self.reasons, argv
        self.reasons[name] = fields["reason"] if fields["state"] == "drain" else None
        self.most_drained = max(self.most_drained, len(self.drained))
        return Completed(tuple(argv), 0, "", "")

    @staticmethod
    def _line(name: str, reason: str | None) -> str:
        if reason is None:
            return f"{name}|idle|Unknown|Unknown|gpu:fake:8|gpu:fake:0(IDX:N/A)|none\n"
        return f"{name}|idle+drain|root|2026-11-30T07:40:38|gpu:fake:8|gpu:fake:0(IDX:N/A)|{reason}\n"

    @property
    def drained(self) -> dict[str, str]:
        return {n: r for n, r in self.reasons.items() if r is not None}

    def calls_for(self, name: str) -> list[str]:
        """Each scontrol update of `name`: "drain: REASON" or "resume"."""
        return [
            f"drain: {u[4].removeprefix('reason=')}" if u[3] == "state=drain" else u[3].removeprefix("state=")
            for u in self.updates
            if u[2] == f"nodename={name}"
        ]


def manager(slurm: ScriptedSlurm, clock: FakeClock) -> SlurmWorkloadManager:
    return SlurmWorkloadManager(SlurmCommands("/x/slurm.conf", runner=slurm), clock, json_output=False)


def weak_n2(node: str, kind: str, rank: int) -> StepResult:
    if node == "n2" and kind == "gemm":
        return StepResult(kind=kind, value=480.0, unit="TFLOPS", per_gpu={"0": 480.0})
    return healthy(node, kind, rank)


def test_a_burn_in_drains_in_slurm_resumes_a_pass_there_and_leaves_a_failure_drained(
    sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    helpers.cluster(sessions, clock, nodes=2)
    slurm = ScriptedSlurm(["n1", "n2"])
    wlm = manager(slurm, clock)
    with transaction(sessions) as s:
        nodes = list(s.scalars(select(Node).where(Node.name.in_(["n1", "n2"])).order_by(Node.name)))
        burnin.start(s, clock, wlm, nodes, SINGLE, "user:admin")
    assert set(slurm.drained) == {"n1", "n2"}
    assert all(r.startswith("gpufleet: burn-in") for r in slurm.drained.values()), slurm.drained

    for _ in range(40):
        with transaction(sessions) as s:
            burnin.advance(s, clock, wlm, "root")
        if not answer_running(sessions, clock, weak_n2) and all(
            r.state in ("passed", "failed") for r in runs(sessions).values()
        ):
            break
    ended = runs(sessions)
    assert (ended["n1"].state, ended["n2"].state) == ("passed", "failed")

    # The pass is resumed in Slurm; the failure stays drained there, its reason naming step and value.
    assert slurm.calls_for("n1")[-1] == "resume"
    assert "n1" not in slurm.drained
    assert slurm.drained["n2"].startswith("gpufleet: burn-in failed: gemm: 480"), slurm.drained
    assert "resume" not in slurm.calls_for("n2")
    row = node_row(sessions, "n2")
    assert (row.hold, row.drain_reason) == ("burn-in-failed", slurm.drained["n2"])
    assert (node_row(sessions, "n1").hold, node_row(sessions, "n1").drained_at) == (None, None)


@pytest.mark.rsync
@pytest.mark.requires_tool("rsync")
def test_a_campaign_drains_and_resumes_each_node_in_slurm_never_more_than_allowed(
    sessions: sessionmaker[Session], clock: FakeClock, tmp_path: Path
) -> None:
    fleet = make_fleet(sessions, clock, tmp_path, nodes=4)
    slurm = ScriptedSlurm([f"n{i}" for i in range(1, 5)])
    fleet.loops.workload = manager(slurm, clock)
    fleet.create(nodes="n[1-4]", max_unavailable="2")
    done = fleet.until(lambda c: c.state == "completed")

    assert [n.phase for n in done.nodes] == ["done"] * 4
    reason = "gpufleet: maintenance campaign upgrade"
    for name in ("n1", "n2", "n3", "n4"):
        assert slurm.calls_for(name) == [f"drain: {reason}", "resume"], slurm.updates
    assert slurm.drained == {}
    assert slurm.most_drained == 2  # the canary alone, then two at a time, as Slurm saw it
    assert max(h["out"] for h in fleet.history) <= 2
