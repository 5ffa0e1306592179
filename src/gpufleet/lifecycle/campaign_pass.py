"""The leader's pass over maintenance campaigns: take nodes out under the policy, wait for their jobs,
run the actions, give the nodes back (see lifecycle.campaigns for the rules).

One pass over one campaign is one transaction (`advance`), the campaign's row locked so a pause or a
cancel waits for it; the tasks it records are started by the caller once that transaction committed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from gpufleet.auth import audit
from gpufleet.core import hostlist
from gpufleet.core.clock import to_datetime
from gpufleet.core.errors import GpufleetError, Unavailable
from gpufleet.inventory.models import Node
from gpufleet.inventory.states import NodeState
from gpufleet.jobs import lifecycle as jobs
from gpufleet.jobs.models import JobState
from gpufleet.jobs.ports import OWN_DRAIN_PREFIX
from gpufleet.lifecycle import campaign_actions as actions_
from gpufleet.lifecycle.campaign_actions import ActionEnv, Launch
from gpufleet.lifecycle.campaigns import (
    ACTING,
    DONE,
    FAILED,
    HOLD,
    IN_PROGRESS,
    MAX_ATTEMPTS,
    PENDING,
    SKIPPED,
    SOURCE,
    TASK_LOST_AFTER_S,
    WAITING,
    actor_of,
    foreign_hold,
    limit_of,
    nodes_of,
    serving,
    set_state,
    unavailable,
)
from gpufleet.lifecycle.models import CAMPAIGN_ACTIVE, BurnIn, Campaign, CampaignNode
from gpufleet.lifecycle.occupancy import busy_jobs, slurm_busy
from gpufleet.tasks import service as tasks_service
from gpufleet.tasks.models import Task
from gpufleet.tasks.service import FINISHED_STATES, INTERRUPTED, SUCCEEDED

HELD_RETRY = (
    "let the burn-in end or cancel it, or resume a node whose burn-in failed once it is fixed "
    "(gpufleet node resume), then resume the campaign to try it again"
)


def to_advance(session: Session) -> list[int]:
    """Campaigns with work left: active ones, and ended ones with nodes still acting or waiting."""
    in_progress = select(CampaignNode.campaign_id).where(CampaignNode.phase.in_(IN_PROGRESS))
    query = select(Campaign.id).where(or_(Campaign.state.in_(CAMPAIGN_ACTIVE), Campaign.id.in_(in_progress)))
    return list(session.scalars(query.order_by(Campaign.id)))


def advance(session: Session, env: ActionEnv, campaign_id: int, live_tasks: Iterable[int] = ()) -> list[Launch]:
    """One pass over one campaign; returns the tasks to start once the caller committed. `live_tasks`:
    the tasks this head runs (others' may be lost). Raises Unavailable (the database, Slurm) with
    nothing done: the next pass tries again."""
    campaign = session.scalar(select(Campaign).where(Campaign.id == campaign_id).with_for_update())
    if campaign is None:
        return []
    step = _Pass(session, env, campaign, set(live_tasks))
    step.run()
    return step.launches


@dataclass
class _Pass:
    session: Session
    env: ActionEnv
    campaign: Campaign
    live: set[int]
    launches: list[Launch] = field(default_factory=list)
    nodes: dict[int, Node] = field(default_factory=dict)
    busy: dict[int, list[int]] = field(default_factory=dict)
    now: float = 0.0

    @property
    def actor(self) -> str:
        return actor_of(self.campaign.name)

    @property
    def policy(self) -> dict[str, Any]:
        return self.campaign.policy

    def run(self) -> None:
        self.now = self.env.clock.now()
        members = list(self.campaign.nodes)
        self.nodes = nodes_of(self.session, members)
        self.busy = busy_jobs(self.session, list(self.nodes.values()))
        for member in members:
            if member.phase in (PENDING, *IN_PROGRESS) and member.node_id not in self.nodes:
                self._end(member, SKIPPED, "the node was removed")
        for member in [m for m in members if m.phase == ACTING]:
            self._act(member)
        self._check_stop()
        for member in [m for m in members if m.phase == WAITING]:
            self._wait(member)
        self._check_stop()  # a failure while waiting counts before any new node is taken
        if self.campaign.state == "running":
            self._take_more(members)
        self._check_end(members)

    # -- helpers ------------------------------------------------------------------------------------------
    def _audit(self, what: str, target: str, result: int = 200) -> None:
        audit.record(
            self.session,
            self.env.clock,
            actor=self.actor,
            action=f"maintenance.{what}",
            target=f"{self.campaign.name}: {target}",
            source=SOURCE,
            result=result,
        )

    def _say(self, member: CampaignNode, detail: str) -> None:
        if member.detail != detail:  # a pending node's detail is set every pass: write only a change
            member.detail = detail[:4000]

    def _end(self, member: CampaignNode, phase: str, detail: str) -> None:
        member.phase, member.ended_at = phase, to_datetime(self.now)
        member.task_id, member.burnin_id, member.waiting_since = None, None, None
        self._say(member, detail)

    def _result(self, member: CampaignNode) -> dict[str, Any]:
        return dict((member.data or {}).get(str(member.action), {}))

    def _set_result(self, member: CampaignNode, result: dict[str, Any]) -> None:
        member.data = {**(member.data or {}), str(member.action): result}  # a new dict: JSON is not tracked

    def _action(self, member: CampaignNode) -> dict[str, Any]:
        return dict(self.campaign.actions[member.action])

    def _give_back(self, member: CampaignNode, node: Node) -> str:
        """Release the hold and resume the node if the campaign drained it; returns what happened."""
        if node.hold == HOLD:
            node.hold = None
        if not member.drained_here or node.drained_at is None:
            member.drained_here = False
            return "left drained as it was before" if node.drained_at is not None else "in service"
        member.drained_here = False
        try:
            self.env.workload.resume(self.session, node, self.actor)
        except Unavailable:
            raise
        except GpufleetError as exc:  # drained meanwhile by someone else (Slurm): theirs to resume
            return f"not resumed: {exc}"
        return "back in service"

    # -- taking nodes out -------------------------------------------------------------------------------
    def _candidates(self, members: list[CampaignNode]) -> list[CampaignNode]:
        """The pending nodes that may be taken now: the canary alone until it is done, then the rest."""
        canary = next((m for m in members if m.canary), None)
        if canary is None or canary.phase not in (PENDING, *IN_PROGRESS):  # done, or skipped (removed)
            return [m for m in members if m.phase == PENDING]
        for member in members:
            if member.phase == PENDING and member is not canary:
                self._say(member, f"waits for the canary, {canary.node}")
        return [canary] if canary.phase == PENDING else []

    def _take_more(self, members: list[CampaignNode]) -> None:
        candidates = self._candidates(members)
        if not candidates:
            return
        limit = limit_of(str(self.policy.get("max_unavailable", "1")), len(members))
        out = unavailable(members, self.nodes)
        keep = int(self.policy.get("keep", 0))
        in_service = self._serving_by_category() if keep else Counter[str | None]()
        blocked = False
        for member in candidates:
            node = self.nodes[member.node_id] if member.node_id is not None else None
            if node is None:
                continue
            held = foreign_hold(node)
            if held is not None:  # held since the campaign began: only a person ends a failed burn-in's hold
                self._fail(member, f"not taken: {held} (hold {node.hold}); {HELD_RETRY}")
                self._check_stop()
                if self.campaign.state != "running":
                    return
                continue
            if serving(node):
                if out + 1 > limit:
                    self._say(member, f"waits: {out} of at most {limit} campaign nodes are out of service")
                    blocked = True
                    continue
                if keep and in_service[node.category] - 1 < keep:
                    group = f"category {node.category}" if node.category else "nodes without a category"
                    self._say(member, f"waits: {keep} of {group} must stay in service")
                    continue
                out += 1
                in_service[node.category] -= 1
            self._take(member, node, out, limit)
            self._check_stop()
            if self.campaign.state != "running":
                return
        if blocked:
            self._check_full(members, limit)

    def _check_full(self, members: list[CampaignNode], limit: int) -> None:
        """Stop when failed nodes, held out of service until a resume retries them, fill every slot of the
        limit: no pending node that serves can ever be taken, whatever the failure budget."""
        failed = [
            m.node
            for m in members
            if m.phase == FAILED and m.node_id in self.nodes and not serving(self.nodes[m.node_id])
        ]
        if len(failed) < limit:
            return
        why = (
            f"{len(failed)} failed node(s) ({hostlist.collect(failed)}) fill all {limit} slot(s) of "
            f"max-unavailable: no other node can be taken"
        )
        more = "resume retries the failed nodes, cancel gives them back"
        set_state(self.campaign, self.env.clock, "stopped", f"{why}; {more}")
        self._audit("stop", why, result=500)

    def _serving_by_category(self) -> Counter[str | None]:
        rows = self.session.execute(
            select(Node.category, func.count())
            .where(Node.state == NodeState.UP, Node.drained_at.is_(None))
            .group_by(Node.category)
        )
        counts: Counter[str | None] = Counter()
        for category, count in rows:
            counts[category] = count
        return counts

    def _take(self, member: CampaignNode, node: Node, out: int, limit: int) -> None:
        node.hold = HOLD
        if node.drained_at is None:
            reason = f"{OWN_DRAIN_PREFIX} maintenance campaign {self.campaign.name}"
            try:
                self.env.workload.drain(self.session, node, reason, self.actor)
            except Unavailable:
                raise
            except GpufleetError as exc:  # Slurm does not know the node: it cannot be maintained here
                node.hold = None
                self._fail(member, f"could not drain: {exc}")
                return
            member.drained_here = True
        member.phase = WAITING
        member.waiting_since = to_datetime(self.now)
        member.started_at = member.started_at or to_datetime(self.now)
        member.ended_at = None
        jobs_ = self.busy.get(node.id, [])
        running = f", running job(s) {', '.join(map(str, jobs_))}" if jobs_ else ", idle"
        self._audit("take", f"{node.name} out of service{running} ({out} of at most {limit} out)")
        self._wait(member)

    def _act_when_free(self, member: CampaignNode, node: Node) -> None:
        if slurm_busy(node):  # a Slurm job the last queue read had not seen yet
            self._say(member, f"drained; Slurm still reports work on it ({node.wlm_state})")
            return
        member.phase, member.waiting_since = ACTING, None
        self._begin(member, node)

    def _wait(self, member: CampaignNode) -> None:
        node = self.nodes[member.node_id] if member.node_id is not None else None
        if node is None:
            return
        if self.campaign.state != "running":
            done = self._give_back(member, node)
            cancelled = self.campaign.state == "cancelled"
            member.phase, member.waiting_since = (SKIPPED if cancelled else PENDING), None
            member.ended_at = to_datetime(self.now) if cancelled else None
            self._say(member, f"given back untouched ({done}): the campaign is {self.campaign.state}")
            self._audit("return", f"{node.name} given back untouched: the campaign is {self.campaign.state}")
            return
        running = self.busy.get(node.id, [])
        if not running:
            self._act_when_free(member, node)
            return
        since = member.waiting_since.timestamp() if member.waiting_since else self.now
        deadline = float(self.policy.get("wait_jobs_s", 3600.0))
        shown = ", ".join(map(str, running))
        if self.now - since < deadline:
            self._say(member, f"drained; waits for job(s) {shown} to end (up to {deadline:g} s, then requeue)")
            return
        requeued, stopping, kept = self._requeue(node, running)
        if requeued:
            self._audit("requeue", f"{node.name}: job(s) {', '.join(map(str, requeued))} requeued after {deadline:g} s")
        if not kept:
            self._say(member, f"requeued job(s) {', '.join(map(str, requeued + stopping))}; waits for them to stop")
            return
        listed = ", ".join(map(str, kept))
        if self.policy.get("overdue") == "fail":
            done = self._give_back(member, node)
            self._fail(member, f"job(s) {listed} (not requeueable) still ran past {deadline:g} s; given back ({done})")
            return
        self._say(member, f"waits on job(s) {listed}: not requeueable, still running past the {deadline:g} s deadline")

    def _requeue(self, node: Node, running: list[int]) -> tuple[list[int], list[int], list[int]]:
        """Requeue the jobs on `node` that allow it: (requeued now, already stopping, still running)."""
        requeued, stopping, kept = [], [], []
        max_requeues = self.env.settings.job_max_requeues
        for job_id, job in sorted(jobs.lock_jobs(self.session, running).items()):
            if job.state is not JobState.RUNNING:
                stopping.append(job_id)  # requeued or ended already: its ranks are being stopped
            elif job.backend == "builtin" and job.requeue and job.run <= max_requeues:
                why = f"maintenance campaign {self.campaign.name} needs node {node.name}"
                jobs.fail_run(self.session, self.env.clock, job, why, max_requeues)
                requeued.append(job_id)
            else:
                kept.append(job_id)
        return requeued, stopping, kept

    # -- acting -------------------------------------------------------------------------------------------
    def _begin(self, member: CampaignNode, node: Node) -> None:
        """Start the node's current action, or finish the node past the last one."""
        if member.action >= len(self.campaign.actions):
            self._finish(member, node)
            return
        action = self.campaign.actions[member.action]
        text = actions_.describe(action)
        attempts = int(self._result(member).get("attempts", 0)) + 1
        try:
            with self.session.begin_nested():  # an action that cannot start leaves nothing half-written
                launch, run_id = actions_.start(
                    self.session,
                    self.env,
                    campaign=self.campaign.name,
                    campaign_id=self.campaign.id,
                    actor=self.campaign.created_by,
                    action=action,
                    index=member.action,
                    node=node,
                )
        except Unavailable:
            raise
        except GpufleetError as exc:
            self._fail(member, f"{text}: {exc}")
            return
        member.task_id = launch.task_id if launch is not None else None
        member.burnin_id = run_id
        self._set_result(member, {"action": text, "attempts": attempts, "task": member.task_id, "burnin": run_id})
        what = f"task {launch.task_id}" if launch is not None else f"burn-in run {run_id}"
        self._say(member, f"{text}: {what}" + (f" (attempt {attempts})" if attempts > 1 else ""))
        self._audit("action", f"{node.name}: {text} as {what}")
        if launch is not None:
            self.launches.append(launch)

    def _act(self, member: CampaignNode) -> None:
        node = self.nodes.get(member.node_id) if member.node_id is not None else None
        if node is None:
            return
        if member.task_id is not None:
            self._follow_task(member, node)
        elif member.burnin_id is not None:
            self._follow_burnin(member, node)
        elif "await_up_since" in self._result(member):
            self._follow_boot(member, node)
        else:  # acting with nothing started: a pass that failed between the two (or an old row)
            self._begin(member, node)

    def _follow_task(self, member: CampaignNode, node: Node) -> None:
        task = self.session.get(Task, member.task_id)
        text = actions_.describe(self._action(member))
        if task is not None and task.state not in FINISHED_STATES:
            beat = task.heartbeat_at or task.created_at
            if task.id in self.live or self.now - beat.timestamp() < TASK_LOST_AFTER_S:
                return
            # Given up before it is tried again: its head, if only stalled, then acts on no further node.
            tasks_service.supersede(self.session, self.env.clock, task.id, "its head stopped beating; tried again")
            self._retry_or_fail(member, node, f"{text}: task {task.id} was lost (its head stopped)")
            return
        if task is None or task.state == INTERRUPTED:
            self._retry_or_fail(member, node, f"{text}: task {member.task_id} was interrupted (its head stopped)")
            return
        target = next((t for t in task.targets if t.target == node.name), None)
        if task.state != SUCCEEDED or target is None:
            # The node's own failure, else the task's (a sync refused before any node: another revision)
            failed_here = target is not None and target.state == "failed" and target.detail
            why = (target.detail if target is not None and failed_here else task.summary) or task.state
            self._fail(member, f"{text} failed (task {task.id}): {why}")
            return
        result = self._result(member) | {"detail": target.detail[:500], "task": task.id}
        kind = self._action(member)["kind"]
        if kind == "sync-image" and target.data:
            result["image"], result["revision"] = target.data.get("image"), target.data.get("revision")
            self._pin(member.action, result["revision"], node.name)
        if kind in actions_.POWER:
            # Up again means a heartbeat after the BMC confirmed the action (an agent that restarted).
            ended = task.finished_at.timestamp() if task.finished_at else self.now
            self._set_result(member, result | {"await_up_since": ended})
            member.task_id = None
            self._follow_boot(member, node)
            return
        self._set_result(member, result)
        self._next(member, node)

    def _pin(self, index: int, revision: Any, node: str) -> None:
        """The first node's synced revision becomes the campaign's: the rest get exactly it."""
        action = dict(self.campaign.actions[index])
        if action.get("revision") is None and isinstance(revision, int):
            action["revision"] = revision
            actions = list(self.campaign.actions)
            actions[index] = action
            self.campaign.actions = actions
            self._audit("pin", f"{actions_.describe(action)}: the revision {node} got is the campaign's")

    def _follow_burnin(self, member: CampaignNode, node: Node) -> None:
        run = self.session.get(BurnIn, member.burnin_id)
        text = actions_.describe(self._action(member))
        if run is None:
            self._fail(member, f"{text}: burn-in run {member.burnin_id} is gone")
        elif run.state == "passed":
            self._set_result(member, self._result(member) | {"detail": "passed"})
            self._next(member, node)
        elif run.state in ("failed", "cancelled"):
            self._fail(member, f"{text} {run.state} (run {run.id}): {run.reason}")
        else:
            self._say(member, f"{text}: burn-in run {run.id} {run.state}")

    def _follow_boot(self, member: CampaignNode, node: Node) -> None:
        since = float(self._result(member)["await_up_since"])
        text = actions_.describe(self._action(member))
        seen = node.last_seen.timestamp() if node.last_seen else None
        if node.state is NodeState.UP and seen is not None and seen >= since:
            self._next(member, node)
            return
        timeout = float(self.policy.get("boot_timeout_s", 1800.0))
        if self.now - since > timeout:
            self._fail(member, f"{text}: the node did not come back up within {timeout:g} s")
            return
        self._say(member, f"{text}: done; waits for the node to come back up (up to {timeout:g} s)")

    def _retry_or_fail(self, member: CampaignNode, node: Node, why: str) -> None:
        if int(self._result(member).get("attempts", 1)) >= MAX_ATTEMPTS:
            self._fail(member, f"{why}; {MAX_ATTEMPTS} attempts made")
            return
        self._audit("retry", f"{node.name}: {why}; running it again")
        member.task_id = None
        self._begin(member, node)

    def _next(self, member: CampaignNode, node: Node) -> None:
        self._audit("action_done", f"{node.name}: {actions_.describe(self._action(member))} done")
        member.action += 1
        member.task_id, member.burnin_id = None, None
        self._begin(member, node)

    def _finish(self, member: CampaignNode, node: Node) -> None:
        done = self._give_back(member, node)
        self._end(member, DONE, f"done: {done}")
        self._audit("return", f"{node.name} done: {done}")

    def _fail(self, member: CampaignNode, reason: str) -> None:
        self._end(member, FAILED, reason)
        self.campaign.failures += 1
        self._audit("node_failed", f"{member.node}: {reason}", result=500)

    # -- the campaign as a whole ----------------------------------------------------------------------------
    def _check_stop(self) -> None:
        if self.campaign.state != "running":
            return
        canary = next((m for m in self.campaign.nodes if m.canary and m.phase == FAILED), None)
        budget = int(self.policy.get("failure_budget", 1))
        if canary is not None:
            why = f"the canary {canary.node} failed: {canary.detail}"
        elif self.campaign.failures >= budget:
            why = f"{self.campaign.failures} node(s) failed (failure budget {budget})"
        else:
            return
        set_state(self.campaign, self.env.clock, "stopped", f"{why}; fix it and resume, or cancel")
        self._audit("stop", why, result=500)

    def _check_end(self, members: list[CampaignNode]) -> None:
        if any(m.phase in (PENDING, *IN_PROGRESS) for m in members):
            return
        now = to_datetime(self.now)
        if self.campaign.state == "running":
            failed = [m.node for m in members if m.phase == FAILED]
            if failed:
                why = f"every node was tried; {len(failed)} failed: {hostlist.collect(failed)}"
                more = "resume retries them, cancel gives them back"
                set_state(self.campaign, self.env.clock, "stopped", f"{why}; {more}")
                self._audit("stop", why, result=500)
                return
            set_state(self.campaign, self.env.clock, "completed", "every node is done")
            self.campaign.ended_at = now
            self._audit("complete", f"{len(members)} node(s) done")
        elif self.campaign.state == "cancelled" and self.campaign.ended_at is None:
            self.campaign.ended_at = now
