"""Maintenance campaigns over a database with the leader's pass driven by hand: real images synced by the
real rsync, jobs placed by the real scheduler and ended as their agents would report, fake time."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.auth.audit import AuditRecord
from gpufleet.core.clock import FakeClock, to_datetime
from gpufleet.core.credentials import head_box
from gpufleet.core.db import transaction
from gpufleet.core.errors import Conflict, GpufleetError, InvalidInput, NotFound
from gpufleet.inventory import categories
from gpufleet.jobs import service as node_service
from gpufleet.jobs.models import JobState
from gpufleet.lifecycle import burnin, campaign_actions, campaigns
from gpufleet.lifecycle.campaign_schemas import CampaignIn
from gpufleet.lifecycle.models import BurnIn, Campaign
from gpufleet.power import service as power
from gpufleet.power.ports import BmcTarget, PowerState
from gpufleet.protocol.burnin import StepResult
from gpufleet.tasks import service as tasks_service
from gpufleet.tasks.models import Task
from gpufleet.tasks.runner import TaskRunner, Work
from tests.conftest import need
from tests.jobs import helpers
from tests.lifecycle.campaign_helpers import ACTOR, Fleet, busy, hold_for_burnin, make_fleet, where
from tests.lifecycle.test_burnin import answer_running, healthy
from tests.power.conftest import FakeFleet

pytestmark = [pytest.mark.rsync, pytest.mark.requires_tool("rsync")]


@pytest.fixture
def fleet(sessions: sessionmaker[Session], clock: FakeClock, tmp_path: Path) -> Fleet:
    return make_fleet(sessions, clock, tmp_path)


def audit_actions(fleet: Fleet) -> list[tuple[str, str]]:
    with transaction(fleet.sessions, readonly=True) as s:
        rows = s.scalars(select(AuditRecord).order_by(AuditRecord.id))
        return [(r.action, r.target) for r in rows if r.action.startswith("maintenance.")]


def campaign_count(fleet: Fleet) -> int:
    with transaction(fleet.sessions, readonly=True) as s:
        return int(s.scalar(select(func.count()).select_from(Campaign)) or 0)


def test_max_unavailable_as_a_number_or_a_percentage() -> None:
    assert [campaigns.limit_of(text, 16) for text in ("2", "25%", "1%", "100%", "10%")] == [2, 4, 1, 16, 1]
    for bad in ("0", "0%", "150%", "-1", "x%"):
        with pytest.raises(InvalidInput, match="max-unavailable"):
            campaigns.limit_of(bad, 16)
    with pytest.raises(InvalidInput, match=r"a number of nodes \(1 or more\) or a percentage such as 25%"):
        campaigns.limit_of("two", 16)
    with pytest.raises(ValidationError):
        CampaignIn(name="x", nodes="n1", actions=["reboot"], max_unavailable="123456789")


def test_action_syntax() -> None:
    playbook = "- hosts: all\n  tasks: []\n"
    parsed = campaign_actions.parse_all(
        [
            "sync-image:base@3",
            "sync-image:base",
            "packages:upgrade:nvidia-driver-550,cuda-toolkit=12.4.1-1",
            "ansible:site.yml",
            "reboot",
            "power-cycle",
            "burn-in:quick",
        ],
        {"site.yml": playbook},
    )
    assert [campaign_actions.describe(a) for a in parsed] == [
        "sync-image:base@3",
        "sync-image:base",
        "packages:upgrade:nvidia-driver-550,cuda-toolkit=12.4.1-1",
        "ansible:site.yml",
        "reboot",
        "power-cycle",
        "burn-in:quick",
    ]
    assert parsed[3]["_playbook"] == playbook
    assert "state: latest" in campaign_actions.packages_playbook("upgrade", ["nvidia-driver-550"])
    refused = {
        "upgrade-firmware": "unknown action",
        "reboot:now": "takes no argument",
        "sync-image": "needs an argument",
        "sync-image:base@0": "revisions start at 1",
        "sync-image:base@x": "sync-image:IMAGE@REVISION",
        "packages:remove:vim": "packages:install",
        "packages:install:--force-yes": "not a package name",
        "ansible:other.yml": "was not sent",
        "burn-in:Quick": "profile's name",
    }
    for text, message in refused.items():
        with pytest.raises(InvalidInput, match=message):
            campaign_actions.parse_all([text], {"site.yml": playbook} if "ansible" in text else {})
    with pytest.raises(InvalidInput, match="no ansible: action names it"):
        campaign_actions.parse_all(["reboot"], {"site.yml": playbook})


def test_bad_campaigns_are_refused_whole_and_record_nothing(fleet: Fleet) -> None:
    cases: list[tuple[dict[str, Any], type[GpufleetError], str]] = [
        ({"nodes": "n[1-9]"}, NotFound, "no such node: n\\[7-9\\]"),
        ({"nodes": None, "category": "nosuch"}, NotFound, "nosuch"),
        ({"nodes": "n1", "category": "gpu"}, InvalidInput, "not both"),
        ({"actions": ["flash-bios"]}, InvalidInput, "unknown action"),
        ({"actions": ["sync-image:nosuch"]}, NotFound, "nosuch"),
        ({"actions": ["sync-image:base@2"]}, InvalidInput, "at revision 1"),
        ({"actions": ["reboot"]}, Conflict, "no BMC set for n\\[1-6\\]"),
        ({"actions": ["burn-in:nosuch"]}, InvalidInput, "no burn-in profile .nosuch."),
        ({"max_unavailable": "0%"}, InvalidInput, "1% to 100%"),
    ]
    for spec, error, message in cases:
        with pytest.raises(error, match=message):
            fleet.create(**spec)
    with transaction(fleet.sessions) as s:
        categories.create_category(s, fleet.clock, "other", settings={"software_image": "other"})
        node = s.scalars(select(campaigns.Node).where(campaigns.Node.name == "n6")).one()
        node.category = "other"
    with pytest.raises(InvalidInput, match="software_image of n6 is not base"):
        fleet.create()
    assert campaign_count(fleet) == 0

    fleet.create(nodes="n[1-3]")
    with pytest.raises(Conflict, match="exists already"):
        fleet.create(nodes="n5")
    with pytest.raises(Conflict, match="n3 \\(upgrade\\)"):
        fleet.create(name="again", nodes="n[3-5]")
    assert campaign_count(fleet) == 1


def test_a_rolling_sync_never_has_more_out_than_allowed_and_never_kills_a_job(fleet: Fleet) -> None:
    (movable,) = busy(fleet, 1, requeue=True)  # n1: taken with n2 right after the canary
    kept = busy(fleet, 3)  # not requeueable: only their end frees the node
    busy_nodes = {where(fleet, j) for j in [*kept, movable]}
    idle = sorted({f"n{i}" for i in range(1, 7)} - busy_nodes)
    shown = fleet.create(max_unavailable="2", wait_jobs_s=30)
    assert next(n.node for n in shown.nodes if n.canary) == idle[0]  # the first node that costs no wait

    fleet.until(lambda c: any(n.phase == "waiting" for n in c.nodes) and c.nodes[0].phase != "pending")
    canary_done = fleet.until(lambda c: next(n for n in c.nodes if n.canary).phase == "done")
    assert all(n.phase in ("pending", "done") or n.canary is False for n in canary_done.nodes)

    # Nodes wait for their jobs; past 30 s the requeueable one is requeued, the others wait on, saying so.
    waited = fleet.until(lambda c: any("not requeueable" in n.detail for n in c.nodes), tick_s=5)
    assert helpers.job(fleet.sessions, movable).state is JobState.PENDING
    assert "maintenance campaign upgrade needs node" in helpers.job(fleet.sessions, movable).reason
    stuck = next(n for n in waited.nodes if "not requeueable" in n.detail)
    assert stuck.phase == "waiting"
    requeued = next(n for n in waited.nodes if n.node == where(fleet, movable))
    assert requeued.detail == f"requeued job(s) {movable}; waits for them to stop"
    helpers.report(fleet.sessions, fleet.clock, movable, outcome="cancelled")  # its agent stopped the rank
    for job_id in kept:  # the jobs end on their own, as their agents report
        helpers.report(fleet.sessions, fleet.clock, job_id)
    done = fleet.until(lambda c: c.state == "completed", tick_s=5)

    assert max(h["out"] for h in fleet.history) == 2
    assert all(h["out"] <= 2 for h in fleet.history)
    assert [n.phase for n in done.nodes] == ["done"] * 6
    assert {n.results["0"]["revision"] for n in done.nodes} == {1}
    assert done.actions == ["sync-image:base@1"]  # the canary's revision is the campaign's
    for name in (f"n{i}" for i in range(1, 7)):
        node = fleet.node(name)
        assert (node.hold, node.drained_at) == (None, None)
        assert (fleet.target(name) / "etc" / "os-release").read_text().startswith("PRETTY_NAME")
    for job_id in kept:
        assert helpers.job(fleet.sessions, job_id).state is JobState.COMPLETED
        assert all(r.cancel is None for r in helpers.ranks(fleet.sessions, job_id))
    actions = [a for a, _ in audit_actions(fleet)]
    assert actions.count("maintenance.take") == 6
    assert actions.count("maintenance.return") == 6
    assert "maintenance.requeue" in actions
    assert actions[-1] == "maintenance.complete"
    with transaction(fleet.sessions, readonly=True) as s:
        kinds = {t.kind for t in s.scalars(select(Task))}
        assert kinds == {"image.sync"}
        assert {t.params["campaign"] for t in s.scalars(select(Task))} == {"upgrade"}


def _break_the_image(fleet: Fleet) -> None:
    """A bad revision: /home becomes a link, which no node whose /home holds users' files can take."""
    (fleet.image_tree / "home").symlink_to("/srv/home")
    for i in range(1, 7):
        notes = fleet.target(f"n{i}") / "home" / "alice" / "notes"
        notes.parent.mkdir(parents=True)
        notes.write_text("mine\n")


def test_a_failed_canary_stops_the_campaign_with_every_other_node_untouched(fleet: Fleet) -> None:
    _break_the_image(fleet)
    fleet.create(max_unavailable="2")
    stopped = fleet.until(lambda c: c.state == "stopped")
    canary = next(n for n in stopped.nodes if n.canary)
    assert (canary.phase, "rsync exited with status 23" in canary.detail) == ("failed", True), canary.detail
    assert stopped.reason.startswith(f"the canary {canary.node} failed")
    assert [n.phase for n in stopped.nodes if not n.canary] == ["pending"] * 5
    others = [n.node for n in stopped.nodes if not n.canary]
    assert all(h["serving"][name] for h in fleet.history for name in others)  # never taken out
    for name in others:
        assert not (fleet.target(name) / "etc").exists()
    held = fleet.node(canary.node)
    assert (held.hold, held.drained_at is not None) == ("maintenance", True)
    for _ in range(3):  # stopped stays stopped
        assert fleet.step().state == "stopped"

    (fleet.image_tree / "home").unlink()
    (fleet.image_tree / "home").mkdir()  # the fix: a new revision (recorded at the next sync)
    with transaction(fleet.sessions) as s:
        campaigns.resume(s, fleet.clock, "upgrade", ACTOR)
    done = fleet.until(lambda c: c.state == "completed")
    assert [n.phase for n in done.nodes] == ["done"] * 6
    assert done.actions == ["sync-image:base@3"]  # 2: the broken tree, 3: the fixed one
    assert {n.results["0"]["revision"] for n in done.nodes} == {3}
    for i in range(1, 7):
        assert (fleet.target(f"n{i}") / "home" / "alice" / "notes").read_text() == "mine\n"
    assert fleet.node(canary.node).hold is None


def test_a_revision_changed_mid_campaign_fails_the_next_node_instead_of_mixing(fleet: Fleet) -> None:
    fleet.create(failure_budget=1, max_unavailable="1")
    fleet.until(lambda c: next(n for n in c.nodes if n.canary).phase == "done")
    (fleet.image_tree / "etc" / "motd").write_text("changed by hand\n")
    stopped = fleet.until(lambda c: c.state == "stopped")
    failed = [n for n in stopped.nodes if n.phase == "failed"]
    assert len(failed) == 1
    assert "image base is at revision 2, not revision 1 as asked" in failed[0].detail
    assert not (fleet.target(failed[0].node) / "etc").exists()  # refused before anything was written


def test_overdue_jobs_fail_the_node_untouched_and_the_budget_lets_the_rest_go_on(fleet: Fleet) -> None:
    (job,) = busy(fleet, 1)
    node = where(fleet, job)
    fleet.create(overdue="fail", wait_jobs_s=10, failure_budget=2, canary=False, max_unavailable="6")
    ended = fleet.until(lambda c: c.state != "running", tick_s=5)
    assert ended.state == "stopped"
    assert ended.reason.startswith(f"every node was tried; 1 failed: {node}")
    failed = next(n for n in ended.nodes if n.node == node)
    assert failed.phase == "failed"
    assert f"job(s) {job} (not requeueable) still ran past 10 s" in failed.detail
    assert (fleet.node(node).hold, fleet.node(node).drained_at) == (None, None)  # given back untouched
    assert helpers.job(fleet.sessions, job).state is JobState.RUNNING
    assert [n.phase for n in ended.nodes].count("done") == 5


def test_nodes_a_burn_in_holds_are_refused_at_create_with_the_way_out(fleet: Fleet) -> None:
    hold_for_burnin(fleet, "n2", burnin.HOLD)
    hold_for_burnin(fleet, "n3", burnin.HOLD_FAILED)
    refused = (
        r"nodes held by a burn-in: n2 \(a burn-in runs there\), n3 \(its burn-in failed\); let the burn-in "
        r"end or cancel it \(gpufleet burn-in cancel ID\), resume a node whose burn-in failed \(gpufleet node "
        r"resume NODE\) once it is fixed, or leave them out of the campaign"
    )
    for spec in ({"nodes": "n[1-4]"}, {"nodes": None, "category": "gpu"}):
        with pytest.raises(Conflict, match=refused):
            fleet.create(**spec)
    assert campaign_count(fleet) == 0
    shown = fleet.create(nodes="n[1,4-6]")  # left out: the campaign goes on without them
    assert [n.node for n in shown.nodes] == ["n1", "n4", "n5", "n6"]


def test_a_node_held_by_a_burn_in_after_the_start_fails_instead_of_waiting_forever(fleet: Fleet) -> None:
    fleet.create(nodes="n[1-3]", canary=False, max_unavailable="2", failure_budget=2)
    hold_for_burnin(fleet, "n2", burnin.HOLD_FAILED)  # a burn-in failed there after the campaign began
    ended = fleet.until(lambda c: c.state != "running")
    assert (ended.state, ended.reason) == (
        "stopped",
        "every node was tried; 1 failed: n2; resume retries them, cancel gives them back",
    )
    by_node = {n.node: n for n in ended.nodes}
    assert [by_node[n].phase for n in ("n1", "n2", "n3")] == ["done", "failed", "done"]
    assert by_node["n2"].detail.startswith("not taken: its burn-in failed (hold burn-in-failed); ")
    assert "then resume the campaign to try it again" in by_node["n2"].detail
    assert fleet.node("n2").hold == burnin.HOLD_FAILED  # never the campaign's: burn-in's hold stays as it was
    assert not (fleet.target("n2") / "etc").exists()

    with transaction(fleet.sessions) as s:  # fixed: a person resumes the node, then the campaign
        node_service.resume(s, fleet.workload, "n2", ACTOR)
        campaigns.resume(s, fleet.clock, "upgrade", ACTOR)
    done = fleet.until(lambda c: c.state == "completed")
    assert [n.phase for n in done.nodes] == ["done"] * 3
    assert (fleet.node("n2").hold, fleet.node("n2").drained_at) == (None, None)


def test_failed_nodes_that_fill_max_unavailable_stop_the_campaign_below_its_budget(fleet: Fleet) -> None:
    _break_the_image(fleet)
    fleet.create(canary=False, max_unavailable="1", failure_budget=2)
    stopped = fleet.until(lambda c: c.state != "running")
    assert (stopped.state, stopped.failures) == ("stopped", 1)  # the budget (2) was never reached
    assert stopped.reason == (
        "1 failed node(s) (n1) fill all 1 slot(s) of max-unavailable: no other node can be taken; "
        "resume retries the failed nodes, cancel gives them back"
    )
    assert [n.phase for n in stopped.nodes] == ["failed"] + ["pending"] * 5
    assert ("maintenance.stop", f"upgrade: {stopped.reason.split(';')[0]}") in audit_actions(fleet)
    for _ in range(3):  # stopped stays stopped
        assert fleet.step().state == "stopped"

    (fleet.image_tree / "home").unlink()
    (fleet.image_tree / "home").mkdir()
    with transaction(fleet.sessions) as s:
        campaigns.resume(s, fleet.clock, "upgrade", ACTOR)
    done = fleet.until(lambda c: c.state == "completed")
    assert [n.phase for n in done.nodes] == ["done"] * 6
    assert max(h["out"] for h in fleet.history) == 1


def test_keep_leaves_enough_nodes_of_each_category_in_service(fleet: Fleet) -> None:
    fleet.create(nodes="n[1-3]", keep=4, max_unavailable="3", canary=False)  # 6 serve: 2 may go at once
    done = fleet.until(lambda c: c.state == "completed")
    assert max(h["out"] for h in fleet.history) == 2
    assert [n.phase for n in done.nodes] == ["done"] * 3


def test_pause_gives_waiting_nodes_back_and_cancel_skips_the_rest(fleet: Fleet) -> None:
    busy(fleet, 6)
    fleet.create(canary=False, max_unavailable="2")
    waiting = fleet.step()
    assert [n.phase for n in waiting.nodes].count("waiting") == 2
    with transaction(fleet.sessions) as s:
        campaigns.pause(s, fleet.clock, "upgrade", ACTOR)
    paused = fleet.step()
    assert (paused.state, [n.phase for n in paused.nodes]) == ("paused", ["pending"] * 6)
    assert paused.unavailable == 0
    assert all(n.detail.startswith("given back untouched") for n in paused.nodes[:2])
    with transaction(fleet.sessions) as s, pytest.raises(Conflict, match="not running"):
        campaigns.pause(s, fleet.clock, "upgrade", ACTOR)
    with transaction(fleet.sessions) as s:
        campaigns.resume(s, fleet.clock, "upgrade", ACTOR)
    assert [n.phase for n in fleet.step().nodes].count("waiting") == 2
    with transaction(fleet.sessions) as s:
        campaigns.cancel(s, fleet.clock, fleet.workload, "upgrade", ACTOR)
    cancelled = fleet.step()
    assert cancelled.state == "cancelled"
    assert [n.phase for n in cancelled.nodes] == ["skipped"] * 6
    assert cancelled.ended_at is not None
    assert cancelled.unavailable == 0
    with transaction(fleet.sessions) as s, pytest.raises(Conflict, match="only a paused or stopped one resumes"):
        campaigns.resume(s, fleet.clock, "upgrade", ACTOR)
    with transaction(fleet.sessions) as s, pytest.raises(Conflict, match="already ended"):
        campaigns.cancel(s, fleet.clock, fleet.workload, "upgrade", ACTOR)


def test_cancel_gives_failed_nodes_back_to_people(fleet: Fleet) -> None:
    _break_the_image(fleet)
    fleet.create()
    stopped = fleet.until(lambda c: c.state == "stopped")
    canary = next(n.node for n in stopped.nodes if n.canary)
    with transaction(fleet.sessions) as s:
        campaigns.cancel(s, fleet.clock, fleet.workload, "upgrade", ACTOR)
    node = fleet.node(canary)
    assert node.hold is None
    assert node.drain_reason is not None
    assert node.drain_reason.startswith("maintenance campaign upgrade failed here:")
    assert node.drain_reason.endswith("resume by hand")


class DeadHead(TaskRunner):
    """A head that records tasks and dies before running them."""

    def start(self, task_id: int, work: Work, params: dict[str, Any] | None = None) -> None:
        del task_id, work, params


def test_an_action_whose_head_stopped_runs_again(fleet: Fleet) -> None:
    fleet.create(nodes="n1")
    live = fleet.loops.tasks
    fleet.loops.tasks = DeadHead(fleet.sessions, fleet.clock)
    first = fleet.step()
    assert (first.nodes[0].phase, first.nodes[0].task_id) == ("acting", 1)
    fleet.loops.tasks = live
    fleet.clock.advance(5)
    assert fleet.step().nodes[0].task_id == 1  # not yet taken for lost: it may still be starting
    fleet.clock.advance(campaigns.TASK_LOST_AFTER_S)
    done = fleet.until(lambda c: c.state == "completed")
    assert done.nodes[0].results["0"]["attempts"] == 2
    assert any(a == "maintenance.retry" and "task 1 was lost" in t for a, t in audit_actions(fleet))
    with transaction(fleet.sessions, readonly=True) as s:
        lost = tasks_service.get(s, 1)  # given up before the retry: its head, if only stalled, acts no more
        assert lost.state == "interrupted"
        assert "tried again" in lost.summary


def test_a_power_cycle_waits_for_the_node_to_come_back(fleet: Fleet) -> None:
    bmcs = FakeFleet()
    box = head_box(fleet.settings)
    with transaction(fleet.sessions) as s:
        for i in (1, 2):
            bmcs.add(f"https://bmc{i}", state=PowerState.ON, lag=1)
            power.set_bmc(s, fleet.clock, box, f"n{i}", BmcTarget("redfish", f"https://bmc{i}", "admin", "secret"))
    fleet.loops.power_connect = bmcs.connect
    fleet.create(nodes="n[1-2]", actions=["power-cycle"], canary=False, max_unavailable="2", boot_timeout_s=60)
    fleet.step()  # both taken, their BMCs told
    waiting = fleet.step()
    assert all("waits for the node to come back up" in n.detail for n in waiting.nodes), waiting.nodes
    assert [bmcs.bmcs[f"https://bmc{i}"].actions() for i in (1, 2)] == [["power_cycle"], ["power_cycle"]]
    with transaction(fleet.sessions) as s:  # n1's agent is back: a heartbeat after the cycle
        node = s.scalars(select(campaigns.Node).where(campaigns.Node.name == "n1")).one()
        node.last_seen = to_datetime(fleet.clock.now() + 1)
    fleet.clock.advance(2)
    back = fleet.step()
    assert [n.phase for n in back.nodes] == ["done", "acting"]
    fleet.clock.advance(60)
    late = fleet.step()
    assert late.nodes[1].phase == "failed"
    assert "did not come back up within 60 s" in late.nodes[1].detail
    assert late.state == "stopped"


PROFILE = """name = "t"
description = "one compute step, for the campaign tests"

[[steps]]
name = "gemm"
kind = "gemm"
seconds = 10

[steps.threshold]
default = 600.0
"""


def test_a_burn_in_action_must_pass_and_pairs_nothing_with_a_node_alone(fleet: Fleet) -> None:
    (fleet.root / "burnin-profiles").mkdir()
    (fleet.root / "burnin-profiles" / "t.toml").write_text(PROFILE)
    fleet.create(nodes="n[1-3]", actions=["sync-image:base", "burn-in:t"], max_unavailable="2")

    def weak_n2(node: str, kind: str, rank: int) -> StepResult:
        result = healthy(node, kind, rank)
        return StepResult(kind=kind, value=300.0, unit="TFLOPS") if node == "n2" else result

    for _ in range(30):
        shown = fleet.step()
        with transaction(fleet.sessions) as s:
            burnin.advance(s, fleet.clock, fleet.workload, "root")
        answer_running(fleet.sessions, fleet.clock, weak_n2)
        if shown.state != "running":
            break
        fleet.clock.advance(1)
    assert shown.state == "stopped", shown
    by_node = {n.node: n for n in shown.nodes}
    assert by_node["n1"].phase == "done"
    assert by_node["n1"].results["1"]["detail"] == "passed"
    assert by_node["n2"].phase == "failed"
    assert by_node["n2"].detail.startswith("burn-in:t failed (run ")
    assert "300" in by_node["n2"].detail
    assert fleet.node("n2").hold == "maintenance"  # the campaign holds it, not burn-in: it reads the verdict
    assert fleet.node("n1").hold is None
    with transaction(fleet.sessions, readonly=True) as s:
        runs = list(s.scalars(select(BurnIn).order_by(BurnIn.id)))
        assert [(r.node, r.state, r.campaign_id, r.resume_on_pass) for r in runs][:2] == [
            ("n1", "passed", 1, False),
            ("n2", "failed", 1, False),
        ]


@pytest.mark.ansible
@pytest.mark.one_database  # Ansible is what is tested here
def test_a_playbook_action_runs_through_ansible_on_each_node(
    heavy: None, sessions: sessionmaker[Session], clock: FakeClock, tmp_path: Path
) -> None:
    if not (Path(sys.executable).parent / "ansible-playbook").exists() and shutil.which("ansible-playbook") is None:
        need("ansible", "ansible-playbook is not installed (pip install -e '.[server]' installs ansible-core)")
    fleet = make_fleet(sessions, clock, tmp_path, nodes=2, ansible_local_connection=True)
    with transaction(sessions) as s:
        for node in s.scalars(select(campaigns.Node)):
            # The nodes are this machine, and Ansible's modules run on this Python.
            node.labels = {"ansible/connection": "local", "ansible/python-interpreter": sys.executable}
    out = tmp_path / "marks"
    out.mkdir()
    playbook = (
        f"- hosts: all\n  gather_facts: false\n  tasks:\n    - ansible.builtin.file:\n"
        f"        path: '{out}/{{{{ inventory_hostname }}}}'\n        state: touch\n"
    )
    fleet.create(nodes="n[1-2]", actions=["ansible:mark.yml"], playbooks={"mark.yml": playbook}, max_unavailable="2")
    done = fleet.until(lambda c: c.state != "running")
    assert done.state == "completed", done.reason
    assert sorted(p.name for p in out.iterdir()) == ["n1", "n2"]
    with transaction(sessions, readonly=True) as s:
        runs = list(s.scalars(select(Task).order_by(Task.id)))
        assert [(t.kind, [x.target for x in t.targets], t.params["playbook"]) for t in runs] == [
            ("ansible.run", ["n1"], "mark.yml"),
            ("ansible.run", ["n2"], "mark.yml"),
        ]


def test_a_packages_action_is_an_ansible_run_of_the_package_module(fleet: Fleet) -> None:
    action = campaign_actions.parse("packages:upgrade:nvidia-driver-550,nvidia-utils-550", {})
    with transaction(fleet.sessions) as s:
        node = s.scalars(select(campaigns.Node).where(campaigns.Node.name == "n1")).one()
        launch, run_id = campaign_actions.start(
            s, fleet.loops.env(), campaign="drv", campaign_id=1, actor=ACTOR, action=action, index=0, node=node
        )
    assert launch is not None
    assert run_id is None
    with transaction(fleet.sessions, readonly=True) as s:
        task = s.get(Task, launch.task_id)
        assert task is not None
        assert (task.kind, task.params["playbook"], task.params["campaign"], task.params["hosts"]) == (
            "ansible.run",
            "packages-upgrade.yml",
            "drv",
            "n1",
        )
