"""Maintenance campaigns: a change rolled over many nodes, a few at a time, never breaking a running job.

A campaign is rows in the database (`Campaign`, one `CampaignNode` per node) that the leader's pass
(lifecycle.campaign_pass, run by workers.campaign_loops) moves on, so it survives a head restart and a
leader change.
Each node goes pending → waiting → acting → done (or failed, or skipped):

- **Taking a node.** The campaign holds it (`Node.hold = "maintenance"`, which the health loop never
  undoes and a person's resume refuses) and drains it through the workload manager (under Slurm, in
  Slurm), unless it is drained already: a drain someone else made stays theirs and is not undone at
  the end (`drained_here`). A node another workflow holds (a burn-in runs there, or failed there) is
  refused at create; one held so after the campaign started fails when its turn comes, the hold as
  the reason, rather than waiting for a hold only a person may end.
- **Waiting.** The node's running jobs (ranks that have not exited; Slurm jobs allocated there) may
  finish on their own for `wait_jobs_s`. Past it, jobs that allow requeue (`Job.requeue`, within
  `job_max_requeues`) are requeued (their ranks stop; they run again elsewhere); no other job is ever
  stopped. A node whose other jobs still run waits on and says so in its detail (`overdue = "wait"`,
  the default), or is given back to service untouched and counted a failure (`overdue = "fail"`).
  Slurm jobs are waited for (requeue them in Slurm to hurry them).
- **Acting.** The actions run in order (lifecycle.campaign_actions), each a task (or a burn-in run); a
  reboot or power-cycle then waits for the node to be up again (`boot_timeout_s`). A task its head
  dropped (the head stopped) runs again, up to MAX_ATTEMPTS times.
- **Done.** The hold is released and the node resumed if the campaign drained it. A failed node stays
  held and drained, its detail saying why.

Policy, checked before each node is taken:

- **max_unavailable** (N, or P% of the campaign's nodes, rounded down, at least 1): campaign nodes out
  of service at once, i.e. not up or drained, *whoever* took them out, as the GPU Operator counts
  (`maxUnavailable`). A node already out (drained by someone, down) costs nothing more to take, so it
  may be taken even at the limit; failed nodes, held out, count until resumed or given back. When
  failed nodes alone fill the limit, no other node can ever be taken: the campaign stops, saying so.
- **keep**: at least K nodes of each category (of the whole fleet) stay in service.
- **canary**: one node alone first (the first node in order that serves and runs no job, if any);
  the others only once it is done. A failed canary stops the campaign whatever the budget.
- **failure_budget**: the campaign stops once F nodes failed.

Pausing or stopping takes no new node: nodes waiting for their jobs are given back (pending again),
nodes already acting finish their actions. Resuming retries failed nodes (from the action that failed)
and resets the failure count. Cancelling skips the nodes not started and gives failed ones back to
people (drained with the reason, no longer held: `node resume` puts them back).

Every step is in the audit log as `campaign:NAME` (actions maintenance.*). Functions take a session
and never commit.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from gpufleet.core import hostlist
from gpufleet.core.clock import Clock, to_datetime
from gpufleet.core.config import Settings
from gpufleet.core.errors import Conflict, InvalidInput, NotFound
from gpufleet.inventory import categories
from gpufleet.inventory import service as inventory
from gpufleet.inventory.models import Node
from gpufleet.inventory.states import NodeState
from gpufleet.jobs.ports import WorkloadManager
from gpufleet.lifecycle import burnin
from gpufleet.lifecycle import campaign_actions as actions_
from gpufleet.lifecycle.campaign_schemas import (
    CampaignDetailOut,
    CampaignIn,
    CampaignNodeOut,
    CampaignOut,
    CampaignPlanOut,
)
from gpufleet.lifecycle.models import CAMPAIGN_ACTIVE, Campaign, CampaignNode
from gpufleet.lifecycle.occupancy import busy_jobs
from gpufleet.tasks.runner import HEARTBEAT_S

HOLD = burnin.HOLD_MAINTENANCE
PENDING, WAITING, ACTING, DONE, FAILED, SKIPPED = "pending", "waiting", "acting", "done", "failed", "skipped"
IN_PROGRESS = (WAITING, ACTING)
MAX_ATTEMPTS = 3
# A task of ours that this head does not run and whose heartbeat is this old belongs to a head that
# stopped (four missed beats): its action runs again rather than waiting for the janitor's minute.
TASK_LOST_AFTER_S = 4 * HEARTBEAT_S
SOURCE = "maintenance campaign"
_NUMBER = re.compile(r"[0-9]{1,7}")  # ASCII digits only: int() would read "٣" too, but not "²"


def actor_of(name: str) -> str:
    """Who the campaign's own steps are by, in the audit log and on the drains it makes."""
    return f"campaign:{name}"


# ---- policy -----------------------------------------------------------------------------------------


def limit_of(max_unavailable: str, total: int) -> int:
    """The most campaign nodes out at once: N, or P% of `total` rounded down and at least 1.
    Raises InvalidInput for 0, or a percentage of 0 or over 100."""
    text = max_unavailable.strip()
    number = _NUMBER.fullmatch(text.removesuffix("%"))
    if text.endswith("%"):
        percent = int(number.group()) if number else -1
        if not 0 < percent <= 100:
            raise InvalidInput(f"max-unavailable {text!r}: a percentage is 1% to 100%")
        return max(1, math.floor(total * percent / 100))
    if number is None or int(text) < 1:
        raise InvalidInput(f"max-unavailable {text!r}: a number of nodes (1 or more) or a percentage such as 25%")
    return int(text)


def _policy(spec: CampaignIn) -> dict[str, Any]:
    return {
        "max_unavailable": spec.max_unavailable,
        "wait_jobs_s": spec.wait_jobs_s,
        "overdue": spec.overdue,
        "keep": spec.keep,
        "failure_budget": spec.failure_budget,
        "canary": spec.canary,
        "boot_timeout_s": spec.boot_timeout_s,
    }


def serving(node: Node) -> bool:
    return node.state is NodeState.UP and node.drained_at is None


# ---- creating -----------------------------------------------------------------------------------------


@dataclass
class Plan:
    """A checked campaign, not yet recorded."""

    spec: CampaignIn
    nodes: list[Node]
    canary: Node | None
    actions: list[dict[str, Any]]
    limit: int

    def out(self) -> CampaignPlanOut:
        names = [n.name for n in self.nodes]
        return CampaignPlanOut(
            name=self.spec.name,
            nodes=names,
            hostlist=hostlist.collect(names),
            canary=self.canary.name if self.canary else None,
            max_unavailable=self.limit,
            actions=[actions_.describe(a) for a in self.actions],
            policy=_policy(self.spec),
        )


def _select(session: Session, spec: CampaignIn) -> list[Node]:
    if (spec.nodes is None) == (spec.category is None):
        raise InvalidInput("name the nodes (a hostlist) or a category, not both")
    if spec.nodes is not None:
        names = inventory.expand_names([spec.nodes])
        if not names:
            raise InvalidInput("the node list is empty")
        found = {n.name: n for n in inventory.list_nodes(session, [spec.nodes])}
        missing = [n for n in names if n not in found]
        if missing:
            raise NotFound(f"no such node: {hostlist.collect(missing)}")
        return [found[n] for n in dict.fromkeys(names)]
    categories.get_category(session, spec.category or "")  # NotFound
    members = categories.node_names(session, spec.category or "")
    if not members:
        raise InvalidInput(f"category {spec.category} has no nodes")
    return inventory.list_nodes(session, members)


def _claimed(session: Session, node_ids: Sequence[int]) -> list[tuple[str, str]]:
    """(node, campaign) for nodes another campaign still has work or a hold on."""
    busy = or_(
        CampaignNode.phase.in_(IN_PROGRESS),
        Campaign.state.in_(CAMPAIGN_ACTIVE) & CampaignNode.phase.in_((PENDING, FAILED)),
    )
    rows = session.execute(
        select(CampaignNode.node, Campaign.name)
        .join(Campaign, Campaign.id == CampaignNode.campaign_id)
        .where(CampaignNode.node_id.in_(node_ids), busy)
    )
    return sorted((node, name) for node, name in rows)


def foreign_hold(node: Node) -> str | None:
    """Why another workflow keeps `node` from a campaign (a burn-in runs or failed there); None if none does."""
    if node.hold in (None, HOLD):
        return None
    known = {burnin.HOLD: "a burn-in runs there", burnin.HOLD_FAILED: "its burn-in failed"}
    return known.get(node.hold or "", f"held by {node.hold}")


HELD_HINT = (
    "let the burn-in end or cancel it (gpufleet burn-in cancel ID), resume a node whose burn-in failed "
    "(gpufleet node resume NODE) once it is fixed, or leave them out of the campaign"
)


def _canary(session: Session, nodes: Sequence[Node]) -> Node:
    """The first node that serves and runs no job (it costs no wait), else the first that serves, else the first."""
    in_service = [n for n in nodes if serving(n) and n.hold is None]
    busy = busy_jobs(session, in_service)
    idle = [n for n in in_service if n.id not in busy]
    return (idle or in_service or list(nodes))[0]


def plan(session: Session, settings: Settings, spec: CampaignIn) -> Plan:
    """Check a campaign all at once, recording nothing. Raises InvalidInput (a bad action or policy),
    NotFound (a node, category, image or profile), Conflict (the name is taken, a node belongs to another
    campaign or is held by a burn-in, no BMC) or Unavailable (no Ansible on the head)."""
    if session.scalar(select(Campaign.id).where(Campaign.name == spec.name)) is not None:
        raise Conflict(f"a campaign named {spec.name} exists already; choose another name")
    nodes = _select(session, spec)
    limit = limit_of(spec.max_unavailable, len(nodes))
    actions = actions_.parse_all(spec.actions, spec.playbooks)
    claimed = _claimed(session, [n.id for n in nodes])
    if claimed:
        shown = ", ".join(f"{node} ({name})" for node, name in claimed[:10])
        raise Conflict(f"nodes already in a maintenance campaign: {shown}; cancel that one or leave them out")
    held = [(n.name, why) for n in nodes if (why := foreign_hold(n)) is not None]
    if held:
        shown = ", ".join(f"{node} ({why})" for node, why in held[:10])
        raise Conflict(f"nodes held by a burn-in: {shown}; {HELD_HINT}")
    actions_.check(session, settings, actions, nodes)
    return Plan(spec, nodes, _canary(session, nodes) if spec.canary else None, actions, limit)


def create(session: Session, clock: Clock, settings: Settings, spec: CampaignIn, actor: str) -> Campaign:
    """Record a campaign (state running); the leader's pass starts it. Raises as `plan` does."""
    checked = plan(session, settings, spec)
    now = to_datetime(clock.now())
    campaign = Campaign(
        name=spec.name,
        state="running",
        actions=checked.actions,
        policy=_policy(spec),
        selector={"nodes": spec.nodes} if spec.nodes is not None else {"category": spec.category},
        failures=0,
        reason="",
        created_by=actor,
        created_at=now,
        updated_at=now,
        nodes=[
            CampaignNode(
                node_id=node.id,
                node=node.name,
                position=i,
                canary=checked.canary is not None and node.id == checked.canary.id,
                phase=PENDING,
                action=0,
                drained_here=False,
                detail="",
                data={},
            )
            for i, node in enumerate(checked.nodes)
        ],
    )
    session.add(campaign)
    session.flush()
    return campaign


# ---- pause, resume, cancel ----------------------------------------------------------------------------


def get(session: Session, name: str, *, lock: bool = False) -> Campaign:
    """Raises NotFound."""
    query = select(Campaign).where(Campaign.name == name)
    campaign = session.scalar(query.with_for_update() if lock else query)
    if campaign is None:
        raise NotFound(f"no maintenance campaign {name!r}")
    return campaign


def pause(session: Session, clock: Clock, name: str, actor: str) -> Campaign:
    """Take no new node; nodes waiting for their jobs are given back, acting ones finish. Raises Conflict
    unless running."""
    campaign = get(session, name, lock=True)
    if campaign.state != "running":
        raise Conflict(f"campaign {name} is {campaign.state}, not running")
    set_state(campaign, clock, "paused", f"paused by {actor}")
    return campaign


def resume(session: Session, clock: Clock, name: str, actor: str) -> Campaign:
    """Go on after a pause or a stop: failed nodes are tried again (from the action that failed) and the
    failure count starts anew. Raises Conflict unless paused or stopped."""
    campaign = get(session, name, lock=True)
    if campaign.state not in ("paused", "stopped"):
        raise Conflict(f"campaign {name} is {campaign.state}: only a paused or stopped one resumes")
    for member in campaign.nodes:
        if member.phase == FAILED:
            member.phase, member.ended_at = PENDING, None
            member.detail = f"failed before ({member.detail}); to be tried again"[:4000]
    campaign.failures = 0
    set_state(campaign, clock, "running", "")
    return campaign


def cancel(session: Session, clock: Clock, workload: WorkloadManager, name: str, actor: str) -> Campaign:
    """End the campaign: nodes not started are skipped; failed ones are given back to people, drained with
    why (no longer held: `node resume` puts them back); waiting ones are given back and acting ones finish
    by the leader's next passes. Raises Conflict once it has ended."""
    campaign = get(session, name, lock=True)
    if campaign.state not in CAMPAIGN_ACTIVE:
        raise Conflict(f"campaign {name} has already ended ({campaign.state})")
    now = to_datetime(clock.now())
    for member in campaign.nodes:
        if member.phase == PENDING:
            member.phase, member.detail, member.ended_at = SKIPPED, f"cancelled by {actor} before it started", now
        elif member.phase == FAILED and member.node_id is not None:
            node = session.get(Node, member.node_id)
            if node is not None and node.hold == HOLD:
                node.hold = None
                reason = f"maintenance campaign {name} failed here: {member.detail}; resume by hand"
                workload.drain(session, node, reason[:512], actor)
    set_state(campaign, clock, "cancelled", f"cancelled by {actor}")
    if not any(m.phase in IN_PROGRESS for m in campaign.nodes):
        campaign.ended_at = now
    return campaign


def set_state(campaign: Campaign, clock: Clock, state: str, reason: str) -> None:
    campaign.state, campaign.reason = state, reason[:1024]
    campaign.updated_at = to_datetime(clock.now())


# ---- reading ----------------------------------------------------------------------------------------------


def nodes_of(session: Session, members: Iterable[CampaignNode]) -> dict[int, Node]:
    ids = [m.node_id for m in members if m.node_id is not None]
    out: dict[int, Node] = {}
    for start in range(0, len(ids), 500):
        out.update({n.id: n for n in session.scalars(select(Node).where(Node.id.in_(ids[start : start + 500])))})
    return out


def unavailable(members: Iterable[CampaignNode], nodes: dict[int, Node]) -> int:
    return sum(1 for m in members if m.node_id in nodes and not serving(nodes[m.node_id]))


def _out(campaign: Campaign, nodes: dict[int, Node]) -> CampaignOut:
    total = len(campaign.nodes)
    return CampaignOut(
        name=campaign.name,
        state=campaign.state,
        reason=campaign.reason,
        actions=[actions_.describe(a) for a in campaign.actions],
        policy=dict(campaign.policy),
        selector=dict(campaign.selector),
        failures=campaign.failures,
        total=total,
        phases=dict(Counter(m.phase for m in campaign.nodes)),
        unavailable=unavailable(campaign.nodes, nodes),
        max_unavailable=limit_of(str(campaign.policy.get("max_unavailable", "1")), total),
        created_by=campaign.created_by,
        created_at=campaign.created_at,
        updated_at=campaign.updated_at,
        ended_at=campaign.ended_at,
    )


def list_out(session: Session, limit: int = 100) -> list[CampaignOut]:
    """Campaigns, newest first."""
    campaigns = list(session.scalars(select(Campaign).order_by(Campaign.id.desc()).limit(limit)))
    nodes = nodes_of(session, [m for c in campaigns for m in c.nodes])
    return [_out(c, nodes) for c in campaigns]


def detail_out(session: Session, name: str) -> CampaignDetailOut:
    """One campaign and each node's progress, in the order the campaign takes them. Raises NotFound."""
    campaign = get(session, name)
    nodes = nodes_of(session, campaign.nodes)
    members = []
    for m in campaign.nodes:
        node = nodes.get(m.node_id) if m.node_id is not None else None
        action = campaign.actions[m.action] if m.action < len(campaign.actions) else None
        members.append(
            CampaignNodeOut(
                node=m.node,
                position=m.position,
                canary=m.canary,
                phase=m.phase,
                action=m.action,
                action_text=actions_.describe(action) if action is not None else None,
                task_id=m.task_id,
                burnin_id=m.burnin_id,
                drained_here=m.drained_here,
                serving=serving(node) if node is not None else None,
                detail=m.detail,
                results=dict(m.data),
                waiting_since=m.waiting_since,
                started_at=m.started_at,
                ended_at=m.ended_at,
            )
        )
    return CampaignDetailOut(**_out(campaign, nodes).model_dump(), nodes=members)
