"""The burn-in controller over a database, with the agents played by hand: each step job is answered with
the result line a node would print (protocol.burnin), through the job system's own report path."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.core.clock import FakeClock, to_datetime
from gpufleet.core.db import transaction
from gpufleet.core.errors import Conflict
from gpufleet.inventory.models import Node
from gpufleet.inventory.states import NodeState
from gpufleet.jobs import output
from gpufleet.jobs.builtin import BuiltinWorkloadManager
from gpufleet.jobs.models import Job, JobRank, JobState
from gpufleet.lifecycle import burnin, pairing
from gpufleet.lifecycle.models import BurnIn
from gpufleet.lifecycle.profiles import Profile, Step
from gpufleet.protocol.burnin import StepResult, format_result
from gpufleet.protocol.jobs import JobOutput
from tests.jobs import helpers

# One database: admission logic (test_campaigns runs the lifecycle tables on both).
pytestmark = pytest.mark.one_database

H200 = {"h200": 600.0}
SINGLE = Profile("t", "test", (Step("gemm", "gemm", 10, {}, H200), Step("disk", "disk", 10, {}, {"default": 50.0})))
PAIRED = Profile(
    "p", "test", (Step("gemm", "gemm", 10, {}, H200), Step("network", "network", 10, {}, {"default": 100.0}))
)

Answer = Callable[[str, str, int], StepResult]  # (node, step kind, rank) -> what that rank prints


def healthy(node: str, kind: str, rank: int) -> StepResult:
    del node, rank
    if kind == "gemm":
        return StepResult(kind=kind, value=700.0, unit="TFLOPS", per_gpu={str(i): 700.0 + i for i in range(8)})
    if kind == "disk":
        return StepResult(kind=kind, value=900.0, unit="MB/s")
    return StepResult(kind=kind, value=380.0, unit="Gbit/s")


def start(sessions: sessionmaker[Session], clock: FakeClock, names: list[str], profile: Profile) -> list[int]:
    with transaction(sessions) as s:
        nodes = [s.scalars(select(Node).where(Node.name == n)).one() for n in names]
        runs = burnin.start(s, clock, BuiltinWorkloadManager(clock), nodes, profile, "user:admin")
        return [r.id for r in runs]


def advance(sessions: sessionmaker[Session], clock: FakeClock) -> list[burnin.Ended]:
    with transaction(sessions) as s:
        return burnin.advance(s, clock, BuiltinWorkloadManager(clock), "root")


def answer_running(sessions: sessionmaker[Session], clock: FakeClock, answer: Answer) -> int:
    """Every burn-in job running now prints its result and ends, as an agent would report it."""
    with transaction(sessions, readonly=True) as s:
        running = [
            (j.id, j.argv[1], [(r.rank, r.node) for r in j.ranks])
            for j in s.scalars(select(Job).where(Job.state == JobState.RUNNING))
        ]
    for job_id, kind, ranks in running:
        for rank, node in ranks:
            line = format_result(answer(node, kind, rank))
            chunk = JobOutput(job_id=job_id, run=1, rank=rank, stream="stdout", offset=0, data="working\n" + line)
            with transaction(sessions) as s:
                output.store(s, clock, [(helpers.node_id(sessions, node), chunk)], 1 << 20)
            helpers.report(sessions, clock, job_id, rank=rank, node=node)
    return len(running)


def run_to_end(sessions: sessionmaker[Session], clock: FakeClock, answer: Answer = healthy) -> None:
    for _ in range(40):
        advance(sessions, clock)
        if not answer_running(sessions, clock, answer):
            with transaction(sessions, readonly=True) as s:
                if not s.scalars(select(BurnIn).where(BurnIn.state.in_(["queued", "running"]))).first():
                    return
    raise AssertionError("burn-in did not end")


def runs(sessions: sessionmaker[Session]) -> dict[str, BurnIn]:
    with transaction(sessions, readonly=True) as s:
        found = {r.node: r for r in s.scalars(select(BurnIn).order_by(BurnIn.id))}
        for r in found.values():
            _ = r.steps
        s.expunge_all()
        return found


def node_row(sessions: sessionmaker[Session], name: str) -> Node:
    with transaction(sessions, readonly=True) as s:
        found = s.scalars(select(Node).where(Node.name == name)).one()
        s.expunge_all()
        return found


def test_a_node_held_for_burn_in_passes_and_is_resumed(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    helpers.cluster(sessions, clock, nodes=1)
    start(sessions, clock, ["n1"], SINGLE)
    held = node_row(sessions, "n1")
    assert held.hold == "burn-in"
    assert held.drained_at is not None
    advance(sessions, clock)
    with transaction(sessions, readonly=True) as s:
        job = s.scalars(select(Job)).one()
        rank = s.scalars(select(JobRank)).one()
        assert job.argv[:2] == ["gpufleet-burnin", "gemm"]
        assert job.user == "root"
        assert rank.node == "n1"
        assert rank.gpu_indexes == list(range(8))
    run_to_end(sessions, clock)
    run = runs(sessions)["n1"]
    assert run.state == "passed"
    assert run.gpu_model == "NVIDIA H200"
    assert [(s.name, s.state, s.value, s.threshold) for s in run.steps] == [
        ("gemm", "passed", 700.0, 600.0),
        ("disk", "passed", 900.0, 50.0),
    ]
    assert run.steps[0].evidence["per_gpu"]["7"] == 707.0
    back = node_row(sessions, "n1")
    assert back.hold is None
    assert back.drained_at is None


def test_a_step_under_its_threshold_fails_the_run_naming_step_value_threshold_and_gpu(
    sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    helpers.cluster(sessions, clock, nodes=1)
    start(sessions, clock, ["n1"], SINGLE)

    def weak(node: str, kind: str, rank: int) -> StepResult:
        if kind == "gemm":
            return StepResult(kind=kind, value=390.0, unit="TFLOPS", per_gpu={"0": 700.0, "3": 390.0})
        return healthy(node, kind, rank)

    run_to_end(sessions, clock, weak)
    run = runs(sessions)["n1"]
    assert run.state == "failed"
    assert run.reason == "gemm: 390 TFLOPS under threshold 600 (GPU 3)"
    assert [s.state for s in run.steps] == ["failed", "skipped"]
    held = node_row(sessions, "n1")
    assert held.hold == "burn-in-failed"
    assert held.drain_reason is not None
    assert "390 TFLOPS" in held.drain_reason


def test_a_wrong_result_fails_whatever_the_value(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    helpers.cluster(sessions, clock, nodes=1)
    start(sessions, clock, ["n1"], SINGLE)

    def wrong(node: str, kind: str, rank: int) -> StepResult:
        if kind == "gemm":
            return StepResult(kind=kind, value=710.0, unit="TFLOPS", ok=False, detail="GPU 5: checksum mismatch")
        return healthy(node, kind, rank)

    run_to_end(sessions, clock, wrong)
    assert runs(sessions)["n1"].reason == "gemm: GPU 5: checksum mismatch"


def test_a_step_that_prints_no_result_fails_with_why(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    helpers.cluster(sessions, clock, nodes=1)
    start(sessions, clock, ["n1"], SINGLE)
    advance(sessions, clock)
    job_id = runs(sessions)["n1"].steps[0].job_id
    assert job_id is not None
    helpers.report(sessions, clock, job_id, outcome="failed", exit_code=127)
    advance(sessions, clock)
    run = runs(sessions)["n1"]
    assert run.state == "failed"
    assert "ended failed" in run.reason
    assert str(job_id) in run.reason


def test_gpu_steps_are_skipped_on_a_node_without_gpus(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    helpers.cluster(sessions, clock, nodes=1, gpus=0)
    start(sessions, clock, ["n1"], SINGLE)
    run_to_end(sessions, clock)
    run = runs(sessions)["n1"]
    assert run.state == "passed"
    assert [s.state for s in run.steps] == ["skipped", "passed"]


def test_a_step_waits_for_the_nodes_running_job(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    helpers.cluster(sessions, clock, nodes=1)
    helpers.users(sessions, clock, "alice")
    job_id = helpers.submit(sessions, clock, gpus_per_node=1)
    helpers.tick(sessions, clock)
    start(sessions, clock, ["n1"], SINGLE)
    advance(sessions, clock)
    assert runs(sessions)["n1"].state == "queued"  # the user's job still holds a GPU
    helpers.report(sessions, clock, job_id)
    advance(sessions, clock)
    assert runs(sessions)["n1"].state == "running"


def test_a_node_cannot_run_two_burn_ins_and_cancel_keeps_it_out(
    sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    helpers.cluster(sessions, clock, nodes=1)
    (run_id,) = start(sessions, clock, ["n1"], SINGLE)
    with pytest.raises(Conflict, match="already queued or running on n1"):
        start(sessions, clock, ["n1"], SINGLE)
    advance(sessions, clock)
    with transaction(sessions) as s:
        burnin.cancel(s, clock, BuiltinWorkloadManager(clock), run_id, "user:admin")
    run = runs(sessions)["n1"]
    assert run.state == "cancelled"
    with transaction(sessions, readonly=True) as s:
        assert s.get(Job, run.steps[0].job_id).state == JobState.CANCELLED  # type: ignore[union-attr]
    out = node_row(sessions, "n1")
    assert out.hold is None
    assert out.drained_at is not None
    assert not (out.drain_reason or "").startswith("gpufleet:")


def test_a_weak_link_is_told_from_its_partner_by_pairing_again(
    sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    helpers.cluster(sessions, clock, nodes=4)
    start(sessions, clock, ["n1", "n2", "n3", "n4"], PAIRED)

    def weak_n2(node: str, kind: str, rank: int) -> StepResult:
        if kind == "network" and node == "n2":
            return StepResult(kind=kind, value=90.0, unit="Gbit/s")
        return healthy(node, kind, rank)

    run_to_end(sessions, clock, weak_n2)
    done = runs(sessions)
    assert {n: r.state for n, r in done.items()} == {"n1": "passed", "n2": "failed", "n3": "passed", "n4": "passed"}
    net = done["n2"].steps[1]
    assert net.attempts == 2
    assert "a node that passed this step" in net.detail
    assert done["n2"].reason.startswith("network: 90 Gbit/s under threshold 100 with ")
    # n2's weak link made n1 (its first partner) try again, with a node that had passed.
    first = done["n1"].steps[1]
    assert first.attempts == 2
    assert first.partner in {"n3", "n4"}
    assert first.evidence["partners"][0] == "n2"
    assert node_row(sessions, "n1").drained_at is None
    assert node_row(sessions, "n2").hold == "burn-in-failed"


def test_pair_steps_wait_for_the_whole_batch(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    helpers.cluster(sessions, clock, nodes=2)
    start(sessions, clock, ["n1", "n2"], PAIRED)
    advance(sessions, clock)  # both start gemm
    with transaction(sessions, readonly=True) as s:
        jobs = list(s.scalars(select(Job).order_by(Job.id)))
    helpers.report(sessions, clock, jobs[0].id)  # n1's gemm ends with no result: it fails
    advance(sessions, clock)
    advance(sessions, clock)
    assert runs(sessions)["n1"].state == "failed"
    # n2 is alone at the pair step once its gemm passes: nobody to pair with, so the step is skipped.
    answer_running(sessions, clock, healthy)
    run_to_end(sessions, clock)
    alone = runs(sessions)["n2"]
    assert alone.state == "passed"
    assert alone.steps[1].state == "skipped"
    assert "no partner" in alone.steps[1].detail


def test_admission_holds_new_nodes_in_one_batch(
    sessions: sessionmaker[Session], clock: FakeClock, tmp_path: Path
) -> None:
    helpers.cluster(sessions, clock, nodes=3)
    (tmp_path / "p.toml").write_text(PAIRED_TOML)
    with transaction(sessions) as s:
        for name in ("n1", "n2"):
            node = s.scalars(select(Node).where(Node.name == name)).one()
            node.state = NodeState.NEW  # never heard from: a first join
            assert burnin.admit_on_join(s, clock, BuiltinWorkloadManager(clock), node, "p", [tmp_path]) is not None
        up = s.scalars(select(Node).where(Node.name == "n3")).one()
        assert burnin.admit_on_join(s, clock, BuiltinWorkloadManager(clock), up, "p", [tmp_path]) is None
    found = runs(sessions)
    assert {r.batch for r in found.values()} == {"admission:p"}
    with transaction(sessions) as s:
        for node in s.scalars(select(Node).where(Node.name.in_(["n1", "n2"]))):
            node.state = NodeState.UP
    run_to_end(sessions, clock)
    assert [r.steps[1].partner for r in runs(sessions).values()] == ["n2", "n1"]
    # A node that burned in once is not admitted again when it rejoins.
    with transaction(sessions) as s:
        node = s.scalars(select(Node).where(Node.name == "n1")).one()
        node.state = NodeState.NEW
        assert burnin.admit_on_join(s, clock, BuiltinWorkloadManager(clock), node, "p", [tmp_path]) is None


def test_an_unusable_admission_profile_still_holds_the_node(
    sessions: sessionmaker[Session], clock: FakeClock, tmp_path: Path
) -> None:
    helpers.cluster(sessions, clock, nodes=1)
    (tmp_path / "p.toml").write_text("name = 'p'\n[[steps]]\nkind = 'nope'\n")
    with transaction(sessions) as s:
        node = s.scalars(select(Node).where(Node.name == "n1")).one()
        node.state = NodeState.NEW
        assert burnin.admit_on_join(s, clock, BuiltinWorkloadManager(clock), node, "p", [tmp_path]) is None
    held = node_row(sessions, "n1")
    assert held.hold == "burn-in-failed"  # no run to wait for: `node resume` is the way out
    assert "admission profile unusable" in (held.drain_reason or "")


PAIRED_TOML = """
name = "p"
description = "gemm then the network in pairs"
[[steps]]
kind = "gemm"
seconds = 10
threshold = { "H200" = 600.0 }
[[steps]]
kind = "network"
seconds = 10
threshold = { default = 100.0 }
"""


def test_a_node_a_health_check_drained_goes_back_to_service_only_through_burn_in(
    sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    helpers.cluster(sessions, clock, nodes=1)
    with transaction(sessions) as s:
        node = s.scalars(select(Node).where(Node.name == "n1")).one()
        BuiltinWorkloadManager(clock).drain(s, node, "gpufleet: GPU 3: Xid 79 (GPU has fallen off the bus)", "gpufleet")
    start(sessions, clock, ["n1"], SINGLE)
    held = node_row(sessions, "n1")
    assert held.hold == "burn-in"
    assert (held.drain_reason or "").startswith("gpufleet: burn-in")  # the drain is burn-in's now
    run_to_end(sessions, clock)
    back = node_row(sessions, "n1")
    assert back.drained_at is None
    assert back.hold is None


def test_a_node_down_too_long_fails_its_run_and_frees_its_batch(
    sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    helpers.cluster(sessions, clock, nodes=3)
    start(sessions, clock, ["n1", "n2", "n3"], PAIRED)
    advance(sessions, clock)
    answer_running(sessions, clock, healthy)  # every gemm passes; all three wait at the pair step
    with transaction(sessions) as s:
        dead = s.scalars(select(Node).where(Node.name == "n3")).one()
        dead.state = NodeState.DOWN
        dead.state_since = to_datetime(clock.now())
    clock.advance(burnin.DOWN_GRACE_S / 2)
    advance(sessions, clock)
    assert runs(sessions)["n3"].state == "running"  # a reboot's worth of downtime is waited for
    clock.advance(burnin.DOWN_GRACE_S)
    run_to_end(sessions, clock)
    done = runs(sessions)
    assert done["n3"].state == "failed"
    assert done["n3"].reason == "the node went down during burn-in"
    assert done["n1"].state == "passed"
    assert done["n2"].state == "passed"


def test_a_gpu_step_that_could_not_use_the_gpus_fails(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    helpers.cluster(sessions, clock, nodes=2)
    start(sessions, clock, ["n1", "n2"], SINGLE)

    def broken(node: str, kind: str, rank: int) -> StepResult:
        if kind == "gemm" and node == "n1":  # torch missing, or CUDA unusable: a broken driver
            return StepResult(kind=kind, value=0.0, unit="TFLOPS", skipped=True, detail="no GPU visible")
        if kind == "gemm":  # measured 2 of its 8 GPUs
            return StepResult(kind=kind, value=700.0, unit="TFLOPS", per_gpu={"0": 700.0, "1": 701.0})
        return healthy(node, kind, rank)

    run_to_end(sessions, clock, broken)
    done = runs(sessions)
    assert done["n1"].reason == "gemm: could not run on the node's 8 GPU(s): no GPU visible"
    assert done["n2"].reason == "gemm: measured 2 of the 8 GPUs it was given"


def test_a_node_that_lost_its_gpus_fails_the_gpu_steps(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    helpers.cluster(sessions, clock, nodes=1, gpus=0)
    with transaction(sessions) as s:
        s.scalars(select(Node).where(Node.name == "n1")).one().expected_gpus = 8
    start(sessions, clock, ["n1"], SINGLE)
    run_to_end(sessions, clock)
    assert runs(sessions)["n1"].reason == "gemm: the node reports no GPU where 8 are expected"


def test_a_drain_someone_made_during_the_run_outlives_the_pass(
    sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    helpers.cluster(sessions, clock, nodes=1)
    start(sessions, clock, ["n1"], SINGLE)
    advance(sessions, clock)
    with transaction(sessions) as s:
        node = s.scalars(select(Node).where(Node.name == "n1")).one()
        BuiltinWorkloadManager(clock).drain(s, node, "reseating a cable", "user:bob")
    run_to_end(sessions, clock)
    after = node_row(sessions, "n1")
    assert runs(sessions)["n1"].state == "passed"
    assert after.hold is None
    assert (after.drain_reason, after.drained_by) == ("reseating a cable", "user:bob")


def test_admission_keeps_a_drain_the_node_had(
    sessions: sessionmaker[Session], clock: FakeClock, tmp_path: Path
) -> None:
    helpers.cluster(sessions, clock, nodes=1)
    (tmp_path / "t.toml").write_text(SINGLE_TOML)
    with transaction(sessions) as s:
        node = s.scalars(select(Node).where(Node.name == "n1")).one()
        BuiltinWorkloadManager(clock).drain(s, node, "RMA pending", "slurm:root")
        node.state = NodeState.NEW
        assert burnin.admit_on_join(s, clock, BuiltinWorkloadManager(clock), node, "t", [tmp_path]) is not None
        node.state = NodeState.UP
    run_to_end(sessions, clock)
    after = node_row(sessions, "n1")
    assert runs(sessions)["n1"].state == "passed"
    assert (after.drain_reason, after.hold) == ("RMA pending", None)


def test_a_node_held_by_a_campaign_is_not_burned_in_beside_it(
    sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    helpers.cluster(sessions, clock, nodes=1)
    with transaction(sessions) as s:
        s.scalars(select(Node).where(Node.name == "n1")).one().hold = "maintenance"
    with pytest.raises(Conflict, match="held by a maintenance campaign"):
        start(sessions, clock, ["n1"], SINGLE)


def test_a_step_waits_while_slurm_runs_work_on_the_node(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    helpers.cluster(sessions, clock, nodes=1)
    with transaction(sessions) as s:
        s.scalars(select(Node).where(Node.name == "n1")).one().wlm_state = "mixed"
    start(sessions, clock, ["n1"], SINGLE)
    advance(sessions, clock)
    assert runs(sessions)["n1"].state == "queued"  # a Slurm job still runs there, drained or not
    with transaction(sessions) as s:
        s.scalars(select(Node).where(Node.name == "n1")).one().wlm_state = "drained"
    advance(sessions, clock)
    assert runs(sessions)["n1"].state == "running"


def test_a_pair_step_left_without_a_partner_fails_rather_than_passing_untested(
    sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    helpers.cluster(sessions, clock, nodes=2)
    run_ids = start(sessions, clock, ["n1", "n2"], PAIRED)
    advance(sessions, clock)
    answer_running(sessions, clock, healthy)  # both pass gemm
    advance(sessions, clock)  # the pair's network job starts
    with transaction(sessions) as s:  # n2's run ends while the pair measures: n1 is left alone, unmeasured
        burnin.cancel(s, clock, BuiltinWorkloadManager(clock), run_ids[1], "user:admin")
    run_to_end(sessions, clock)
    alone = runs(sessions)["n1"]
    assert alone.state == "failed"
    assert alone.reason.startswith("network: the step's job ")
    assert alone.reason.endswith("no other partner to tell which side is weak")


def test_a_result_line_a_node_poisoned_fails_its_step_only(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    helpers.cluster(sessions, clock, nodes=2)
    start(sessions, clock, ["n1", "n2"], SINGLE)
    advance(sessions, clock)
    with transaction(sessions, readonly=True) as s:
        first = s.scalars(select(Job).order_by(Job.id)).first()
        assert first is not None
        job_id, node_name = first.id, first.ranks[0].node
    deep = (
        "GPUFLEET-BURNIN-RESULT "
        + '{"kind":"gemm","value":1,"unit":"x","evidence":{"a":'
        + "[" * 20000
        + "]" * 20000
        + "}}\n"
    )
    node_id = helpers.node_id(sessions, node_name)
    for offset in range(0, len(deep), 16000):  # as the agent sends it: chunks of at most 16 KiB
        chunk = JobOutput(
            job_id=job_id, run=1, rank=0, stream="stdout", offset=offset, data=deep[offset : offset + 16000]
        )
        with transaction(sessions) as s:
            output.store(s, clock, [(node_id, chunk)], 1 << 20)
    helpers.report(sessions, clock, job_id, node=node_name)
    run_to_end(sessions, clock)
    done = runs(sessions)
    assert done[node_name].state == "failed"
    assert "cannot be read" in done[node_name].reason or "nested too deep" in done[node_name].reason
    other = "n2" if node_name == "n1" else "n1"
    assert done[other].state == "passed"


SINGLE_TOML = """
name = "t"
description = "gemm and disk"
[[steps]]
kind = "gemm"
seconds = 10
threshold = { "H200" = 600.0 }
[[steps]]
kind = "disk"
seconds = 10
threshold = { default = 50.0 }
"""


def test_nodes_at_a_pair_step_wait_for_a_slow_batch_member_but_not_for_ever(
    sessions: sessionmaker[Session], clock: FakeClock
) -> None:
    helpers.cluster(sessions, clock, nodes=3)
    start(sessions, clock, ["n1", "n2", "n3"], PAIRED)
    advance(sessions, clock)

    with transaction(sessions, readonly=True) as s:
        gemm_n3 = next(j.id for j in s.scalars(select(Job)) if j.ranks[0].node == "n3")
    # n1 and n2 pass gemm; n3's gemm still runs (a long step, a slow node).
    with transaction(sessions, readonly=True) as s:
        others = [j.id for j in s.scalars(select(Job)) if j.id != gemm_n3]
    for job_id in others:
        with transaction(sessions, readonly=True) as s:
            node = s.get(Job, job_id).ranks[0].node  # type: ignore[union-attr]
        line = format_result(healthy(node, "gemm", 0))
        with transaction(sessions) as s:
            chunk = JobOutput(job_id=job_id, run=1, rank=0, stream="stdout", offset=0, data=line)
            output.store(s, clock, [(helpers.node_id(sessions, node), chunk)], 1 << 20)
        helpers.report(sessions, clock, job_id, node=node)
    advance(sessions, clock)
    with transaction(sessions, readonly=True) as s:
        assert s.scalars(select(Job).where(Job.state == JobState.RUNNING)).all()[0].id == gemm_n3  # they wait
    clock.advance(pairing.PAIR_WAIT_S + 1)
    advance(sessions, clock)
    with transaction(sessions, readonly=True) as s:
        pair = [j for j in s.scalars(select(Job).where(Job.state == JobState.RUNNING)) if j.id != gemm_n3]
        assert [sorted(r.node for r in j.ranks) for j in pair] == [["n1", "n2"]]  # no longer held back
