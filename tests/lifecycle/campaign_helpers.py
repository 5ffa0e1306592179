"""A small fleet for the maintenance campaign tests: nodes up with GPUs in one category whose software image
is a real tree (made by the real tar), synced by the real rsync into directories standing in for the nodes,
jobs placed by the real scheduler, and the leader's pass driven by hand on a real task runner."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.core.clock import FakeClock
from gpufleet.core.config import Settings, load_settings
from gpufleet.core.db import transaction
from gpufleet.inventory import categories
from gpufleet.inventory.models import Node
from gpufleet.jobs.builtin import BuiltinWorkloadManager
from gpufleet.jobs.ports import OWN_DRAIN_PREFIX
from gpufleet.lifecycle import campaigns
from gpufleet.lifecycle.campaign_schemas import CampaignDetailOut, CampaignIn
from gpufleet.provisioning.images import ImageConfig
from gpufleet.tasks.runner import TaskRunner
from gpufleet.workers.campaign_loops import CampaignLoops
from tests.jobs import helpers
from tests.provisioning.images_helpers import import_tarball, make_tree, tarball

ACTOR = "token:admin#1"


@dataclass
class Fleet:
    """`nodes` nodes n1..nN in category gpu (software_image base, synced into root/nodes/NODE)."""

    sessions: sessionmaker[Session]
    clock: FakeClock
    root: Path
    settings: Settings
    runner: TaskRunner
    loops: CampaignLoops
    # After every pass: each campaign node's (phase, serving) and how many were out of service.
    history: list[dict[str, Any]] = field(default_factory=list)

    @property
    def workload(self) -> BuiltinWorkloadManager:
        return BuiltinWorkloadManager(self.clock)

    @property
    def image_tree(self) -> Path:
        return ImageConfig.of(self.settings).images_dir / "base"

    def target(self, node: str) -> Path:
        return self.root / "nodes" / node

    def create(self, **spec: Any) -> CampaignDetailOut:
        spec.setdefault("name", "upgrade")
        spec.setdefault("nodes", "n[1-6]")
        spec.setdefault("actions", ["sync-image:base"])
        body = CampaignIn(**spec)
        with transaction(self.sessions) as s:
            campaigns.create(s, self.clock, self.settings, body, ACTOR)
        return self.show(body.name)

    def show(self, name: str = "upgrade") -> CampaignDetailOut:
        with transaction(self.sessions, readonly=True) as s:
            return campaigns.detail_out(s, name)

    def step(self, name: str = "upgrade") -> CampaignDetailOut:
        """One pass of the leader's loop, its tasks run to their end, then what it shows."""
        self.loops.advance_once()
        for task_id in self.runner.running():
            self.runner.wait(task_id, 60)
        shown = self.show(name)
        self.history.append(
            {
                "out": shown.unavailable,
                "phases": {n.node: n.phase for n in shown.nodes},
                "serving": {n.node: n.serving for n in shown.nodes},
            }
        )
        return shown

    def until(
        self, done: Callable[[CampaignDetailOut], bool], name: str = "upgrade", passes: int = 60, tick_s: float = 1.0
    ) -> CampaignDetailOut:
        """Pass after pass, `tick_s` of fake time apart, jobs ending as their agents would report, until `done`."""
        for _ in range(passes):
            shown = self.step(name)
            if done(shown):
                return shown
            self.clock.advance(tick_s)
        raise AssertionError(f"campaign {name} never got there: {self.show(name).model_dump()}")

    def node(self, name: str) -> Node:
        with transaction(self.sessions, readonly=True) as s:
            found = s.scalars(select(Node).where(Node.name == name)).one()
            s.expunge_all()
            return found


def make_fleet(sessions: sessionmaker[Session], clock: FakeClock, root: Path, nodes: int = 6, **settings: Any) -> Fleet:
    config = load_settings(
        client_file=root / "none.toml",
        data_dir=root,
        image_import_dirs=[root],
        image_sync_local_root=root / "nodes",
        **settings,
    )
    helpers.cluster(sessions, clock, nodes=nodes)
    helpers.users(sessions, clock, "alice")
    tar = tarball(make_tree(root / "tree"), root / "base.tar")
    import_tarball(sessions, clock, ImageConfig.of(config), "base", tar)
    with transaction(sessions) as s:
        categories.create_category(
            s, clock, "gpu", settings={"software_image": "base", "sync_target": f"{root}/nodes/{{node}}"}
        )
        for node in s.scalars(select(Node)):
            node.category = "gpu"
    runner = TaskRunner(sessions, clock)
    loops = CampaignLoops(
        settings=config,
        sessions=sessions,
        clock=clock,
        workload=BuiltinWorkloadManager(clock),
        tasks=runner,
        is_leader=lambda: True,
    )
    return Fleet(sessions, clock, root, config, runner, loops)


def busy(fleet: Fleet, node_count: int, requeue: bool = False) -> list[int]:
    """A job holding all 8 GPUs of each of `node_count` nodes, running (as its agent said)."""
    ids = [
        helpers.submit(fleet.sessions, fleet.clock, gpus_per_node=8, requeue=requeue, argv=["sleep", "999"])
        for _ in range(node_count)
    ]
    helpers.tick(fleet.sessions, fleet.clock)
    for job_id in ids:
        helpers.report(fleet.sessions, fleet.clock, job_id, state="running", outcome=None)
    return ids


def where(fleet: Fleet, job_id: int) -> str:
    return next(r.node for r in helpers.ranks(fleet.sessions, job_id) if r.ended_at is None)


def hold_for_burnin(fleet: Fleet, name: str, hold: str) -> None:
    """Hold `name` as burn-in does (`hold` "burn-in": a run there; "burn-in-failed": it failed there), drained."""
    with transaction(fleet.sessions) as s:
        node = s.scalars(select(Node).where(Node.name == name)).one()
        fleet.workload.drain(s, node, f"{OWN_DRAIN_PREFIX} burn-in: profile t ({hold})", "gpufleet:burn-in")
        node.hold = hold
