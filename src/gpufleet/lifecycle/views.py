"""What the dashboard and the REST API show of burn-in runs and maintenance campaigns: read-only queries
returning plain dataclasses.

Nothing here writes, and nothing imports a web framework: the pages (api.dashboard.lifecycle) and the
API's routes read the same functions, so a number on a page is the number `GET /api/v1/...` returns.
Each list is a bounded number of statements whatever its length (the step counts of a page of runs in one
grouped query, the phase counts of every campaign in another), never one query per row.

The fleet view compares each node's latest measurement of a step with the other nodes' (`fleet_metrics`):
a threshold catches a GPU that is broken, the fleet catches one that is merely slower than its siblings.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Row, func, select
from sqlalchemy.orm import Session

from gpufleet.core.errors import NotFound
from gpufleet.inventory.models import Node
from gpufleet.lifecycle import campaign_actions
from gpufleet.lifecycle.models import BurnIn, BurnInStep, Campaign, CampaignNode

_Row = Row[*tuple[Any, ...]]  # a row of selected columns, read by name

# The states the models' comments list, for the pages' filters (an unknown state just matches nothing).
RUN_STATES = ("queued", "running", "passed", "failed", "cancelled")
CAMPAIGN_STATES = ("running", "paused", "stopped", "cancelled", "completed")
PHASES = ("pending", "waiting", "acting", "done", "failed", "skipped")

# Outliers against the fleet (see `fleet_metrics`). 1.4826 × MAD estimates the standard deviation of
# normally distributed values, so OUTLIER_SPREADS is a robust z-score: 3.5 is Iglewicz and Hoaglin's
# cut-off for the modified z-score, which flags almost nothing in a healthy, normal sample.
MAD_TO_SIGMA = 1.4826
OUTLIER_SPREADS = 3.5
# A spread under 1 % of the median is taken as measurement noise (clocks follow temperature and power
# from one run to the next), not as a tighter fleet: nodes that all report the same figure (MAD 0, as
# simulated ones may) would otherwise flag a node 0.1 % slower. With this floor a node must be at least
# 3.5 % off the median to be called out.
NOISE_FLOOR = 0.01
# Below this many nodes the median and MAD say too little to call any one of them an outlier: of three
# nodes, one slow one moves the median itself.
MIN_NODES_FOR_OUTLIERS = 5


@dataclass(frozen=True, slots=True)
class RunSummary:
    """One burn-in run (a node's run of a profile) with its steps counted by outcome."""

    id: int
    node: str
    node_exists: bool  # False once the node was removed (the run is kept as history)
    profile: str
    batch: str
    state: str
    reason: str  # the failed step, its value and threshold
    gpu_model: str | None
    campaign_id: int | None
    requested_by: str
    resume_on_pass: bool
    created_at: datetime
    started_at: datetime | None
    ended_at: datetime | None
    steps: int = 0
    passed: int = 0
    failed: int = 0
    skipped: int = 0

    @property
    def finished(self) -> int:
        return self.passed + self.failed + self.skipped


@dataclass(frozen=True, slots=True)
class StepView:
    """One step of a run with its measurement against its threshold."""

    position: int
    name: str
    kind: str
    state: str  # pending, running, passed, failed, skipped
    value: float | None
    unit: str
    threshold: float | None
    better: str  # higher / lower
    detail: str
    evidence: Mapping[str, Any]
    partner: str | None  # a pair step's other node
    attempts: int
    job_id: int | None  # the current (or last) attempt's job
    started_at: datetime | None
    ended_at: datetime | None

    @property
    def passed(self) -> bool | None:
        """True or False once judged; None while pending or running, and for a skipped step."""
        return {"passed": True, "failed": False}.get(self.state)

    @property
    def margin_pct(self) -> float | None:
        """How far the value lies from the threshold, in per cent of it: positive on the good side."""
        if self.value is None or self.threshold is None or self.threshold == 0:
            return None
        margin = (self.value - self.threshold) / abs(self.threshold) * 100
        return margin if self.better == "higher" else -margin


@dataclass(frozen=True, slots=True)
class RunDetail:
    run: RunSummary
    steps: list[StepView]
    hold: str | None  # the node's hold now (None: not held, or the node is gone)


@dataclass(frozen=True, slots=True)
class NodeValue:
    """A node's latest value of one step, placed against the fleet's."""

    node: str
    burnin_id: int
    value: float
    state: str  # the step's state in that run
    threshold: float | None
    at: datetime | None
    deviation: float  # in robust spreads from the median, negative on the worse side
    outlier: str | None  # "worse" or "better" than the fleet by more than OUTLIER_SPREADS; None: within


@dataclass(frozen=True, slots=True)
class Metric:
    """One step's latest values across the nodes with one GPU model, worst first."""

    step: str
    kind: str
    gpu_model: str | None  # None: CPU-only nodes (or a model nobody recorded)
    unit: str
    better: str
    values: list[NodeValue]
    minimum: float
    median: float
    maximum: float
    spread: float  # the robust spread the outliers are judged by (1.4826 × MAD, floored)
    judged: bool  # enough nodes (MIN_NODES_FOR_OUTLIERS) to call outliers at all
    thresholds: tuple[float, ...] = ()  # the thresholds these values were judged against

    @property
    def outliers(self) -> list[NodeValue]:
        return [v for v in self.values if v.outlier is not None]

    @property
    def failed(self) -> int:
        return sum(1 for v in self.values if v.state == "failed")


@dataclass(frozen=True, slots=True)
class HeldNode:
    """A node a workflow holds out of service, with why."""

    node: str
    hold: str  # burn-in, burn-in-failed, maintenance
    state: str  # new, up, down
    drained_at: datetime | None
    drain_reason: str | None
    drained_by: str | None
    burnin: RunSummary | None  # the node's latest run


@dataclass(frozen=True, slots=True)
class NodeBurnIn:
    """What the node page shows: the node's hold and its latest run, and how many it has had."""

    hold: str | None
    latest: RunSummary | None
    runs: int


@dataclass(frozen=True, slots=True)
class CampaignSummary:
    id: int
    name: str
    state: str
    actions: list[str]  # each action described in one line, in order
    policy: Mapping[str, Any]
    selector: Mapping[str, Any]
    failures: int
    reason: str
    created_by: str
    created_at: datetime
    updated_at: datetime
    ended_at: datetime | None
    phases: Mapping[str, int] = field(default_factory=dict)  # nodes per phase

    @property
    def total(self) -> int:
        return sum(self.phases.values())

    @property
    def finished(self) -> int:
        """Nodes the campaign is done with, one way or the other."""
        return sum(self.phases.get(p, 0) for p in ("done", "failed", "skipped"))

    @property
    def out(self) -> int:
        """Nodes out of service for the campaign now: drained and waiting for jobs, or being acted on."""
        return self.phases.get("waiting", 0) + self.phases.get("acting", 0)


@dataclass(frozen=True, slots=True)
class CampaignNodeView:
    node: str
    position: int
    canary: bool
    phase: str
    action_index: int
    action: str  # the action running or next, described; "" past the last
    task_id: int | None
    burnin_id: int | None
    drained_here: bool
    detail: str
    data: Mapping[str, Any]
    waiting_since: datetime | None
    started_at: datetime | None
    ended_at: datetime | None


@dataclass(frozen=True, slots=True)
class CampaignDetail:
    campaign: CampaignSummary
    nodes: list[CampaignNodeView]


# --- burn-in runs ---------------------------------------------------------------------------------------

# The run's own columns: selecting these rather than the BurnIn entity keeps SQLAlchemy from loading
# every run's steps (the relationship is selectin) for a list that only counts them.
_RUN_COLUMNS = (
    BurnIn.id,
    BurnIn.node,
    BurnIn.node_id,
    BurnIn.profile,
    BurnIn.batch,
    BurnIn.state,
    BurnIn.reason,
    BurnIn.gpu_model,
    BurnIn.campaign_id,
    BurnIn.requested_by,
    BurnIn.resume_on_pass,
    BurnIn.created_at,
    BurnIn.started_at,
    BurnIn.ended_at,
)


def list_runs(
    session: Session,
    *,
    node: str | None = None,
    state: str | None = None,
    batch: str | None = None,
    campaign_id: int | None = None,
    before: int | None = None,
    limit: int = 100,
) -> list[RunSummary]:
    """Burn-in runs, newest first, at most `limit`; `before` (a run id) pages back past it."""
    query = select(*_RUN_COLUMNS).order_by(BurnIn.id.desc()).limit(limit)
    if node is not None:
        query = query.where(BurnIn.node == node)
    if state is not None:
        query = query.where(BurnIn.state == state)
    if batch is not None:
        query = query.where(BurnIn.batch == batch)
    if campaign_id is not None:
        query = query.where(BurnIn.campaign_id == campaign_id)
    if before is not None:
        query = query.where(BurnIn.id < before)
    return _summaries(session, session.execute(query).all())


def get_run(session: Session, run_id: int) -> RunDetail:
    """One run with its steps in profile order. Raises NotFound."""
    row = session.execute(select(*_RUN_COLUMNS).where(BurnIn.id == run_id)).first()
    if row is None:
        raise NotFound(f"no burn-in run {run_id}")
    run = _summaries(session, [row])[0]
    steps = session.scalars(
        select(BurnInStep).where(BurnInStep.burnin_id == run_id).order_by(BurnInStep.position, BurnInStep.id)
    )
    hold = session.scalar(select(Node.hold).where(Node.id == row.node_id)) if row.node_id is not None else None
    return RunDetail(run, [_step_view(s) for s in steps], hold)


def latest_runs(session: Session, nodes: Iterable[str]) -> dict[str, RunSummary]:
    """Each named node's newest run (nodes without one are left out)."""
    names = sorted(set(nodes))
    if not names:
        return {}
    newest = select(func.max(BurnIn.id)).where(BurnIn.node.in_(names)).group_by(BurnIn.node).scalar_subquery()
    rows = session.execute(select(*_RUN_COLUMNS).where(BurnIn.id.in_(newest))).all()
    return {r.node: r for r in _summaries(session, rows)}


def node_burnin(session: Session, node: Node) -> NodeBurnIn:
    """The node page's burn-in line: its hold, its newest run and how many runs it has had."""
    runs = session.scalar(select(func.count()).select_from(BurnIn).where(BurnIn.node == node.name)) or 0
    return NodeBurnIn(node.hold, latest_runs(session, [node.name]).get(node.name), runs)


def held_nodes(session: Session) -> list[HeldNode]:
    """Every node a workflow holds (Node.hold), by name, with its drain and its newest run."""
    nodes = session.execute(
        select(Node.name, Node.hold, Node.state, Node.drained_at, Node.drain_reason, Node.drained_by)
        .where(Node.hold.is_not(None))
        .order_by(Node.name)
    ).all()
    latest = latest_runs(session, (n.name for n in nodes))
    return [
        HeldNode(
            node=n.name,
            hold=n.hold or "",
            state=n.state.value,
            drained_at=n.drained_at,
            drain_reason=n.drain_reason,
            drained_by=n.drained_by,
            burnin=latest.get(n.name),
        )
        for n in nodes
    ]


def _summaries(session: Session, rows: Sequence[_Row]) -> list[RunSummary]:
    """Runs from their column rows, their steps counted by state in one grouped query."""
    counts: dict[int, dict[str, int]] = defaultdict(dict)
    ids = [r.id for r in rows]
    if ids:
        grouped = session.execute(
            select(BurnInStep.burnin_id, BurnInStep.state, func.count())
            .where(BurnInStep.burnin_id.in_(ids))
            .group_by(BurnInStep.burnin_id, BurnInStep.state)
        )
        for burnin_id, state, count in grouped:
            counts[burnin_id][state] = count
    out = []
    for r in rows:
        by_state = counts.get(r.id, {})
        out.append(
            RunSummary(
                id=r.id,
                node=r.node,
                node_exists=r.node_id is not None,
                profile=r.profile,
                batch=r.batch,
                state=r.state,
                reason=r.reason,
                gpu_model=r.gpu_model,
                campaign_id=r.campaign_id,
                requested_by=r.requested_by,
                resume_on_pass=r.resume_on_pass,
                created_at=r.created_at,
                started_at=r.started_at,
                ended_at=r.ended_at,
                steps=sum(by_state.values()),
                passed=by_state.get("passed", 0),
                failed=by_state.get("failed", 0),
                skipped=by_state.get("skipped", 0),
            )
        )
    return out


def _step_view(s: BurnInStep) -> StepView:
    return StepView(
        position=s.position,
        name=s.name,
        kind=s.kind,
        state=s.state,
        value=s.value,
        unit=s.unit,
        threshold=s.threshold,
        better=s.better,
        detail=s.detail,
        evidence=s.evidence or {},
        partner=s.partner,
        attempts=s.attempts,
        job_id=s.job_id,
        started_at=s.started_at,
        ended_at=s.ended_at,
    )


# --- the fleet view -------------------------------------------------------------------------------------


def fleet_metrics(session: Session, *, step: str | None = None) -> list[Metric]:
    """Each step's latest value on every node that still exists, grouped by step and GPU model, with the
    fleet's minimum, median and maximum and the nodes that lie far from the median.

    Grouped by GPU model because an A100 and an H200 differ by a factor, not by a fault: one fleet of
    both would be two clusters of values, and every A100 an "outlier". A node's latest value is the
    newest run's that measured the step (a run cancelled before the step keeps the previous value).

    Outliers are judged by the median and the median absolute deviation (MAD), not the mean and standard
    deviation: the slow nodes are what we look for, and a mean and deviation computed with them in are
    pulled toward them (one GPU at half speed among sixteen widens the standard deviation until it hides
    itself). The median and MAD ignore up to half the values being wild. A node is an outlier when it
    lies more than OUTLIER_SPREADS robust spreads (1.4826 × MAD, at least NOISE_FLOOR of the median)
    from the median: "worse" on the side the step's `better` says is bad, "better" on the other
    (a step far faster than its siblings deserves a look too: it may have measured nothing).
    """
    ranked = (
        select(
            BurnInStep.id.label("step_id"),
            func.row_number()
            .over(partition_by=(BurnIn.node, BurnInStep.name), order_by=BurnIn.id.desc())
            .label("newest"),
        )
        .join(BurnIn, BurnIn.id == BurnInStep.burnin_id)
        # Removed nodes' runs stay as history (node_id SET NULL) but are no longer the fleet.
        .where(BurnInStep.value.is_not(None), BurnIn.node_id.is_not(None))
    )
    if step is not None:
        ranked = ranked.where(BurnInStep.name == step)
    latest = ranked.subquery()
    rows = session.execute(
        select(
            BurnIn.node,
            BurnIn.id.label("burnin_id"),
            BurnIn.gpu_model,
            BurnInStep.name,
            BurnInStep.kind,
            BurnInStep.unit,
            BurnInStep.better,
            BurnInStep.value,
            BurnInStep.state,
            BurnInStep.threshold,
            BurnInStep.ended_at,
        )
        .join(BurnIn, BurnIn.id == BurnInStep.burnin_id)
        .join(latest, latest.c.step_id == BurnInStep.id)
        .where(latest.c.newest == 1)
    ).all()
    groups: dict[tuple[str, str | None, str], list[_Row]] = defaultdict(list)
    for r in rows:
        groups[(r.name, r.gpu_model, r.unit)].append(r)
    metrics = [_metric(rows) for rows in groups.values()]
    metrics.sort(key=lambda m: (m.step, m.gpu_model or ""))
    return metrics


def robust_spread(values: Sequence[float]) -> tuple[float, float]:
    """(median, spread): the spread is 1.4826 × the median absolute deviation, at least NOISE_FLOOR of
    the median's size (see the module's constants for why)."""
    median = statistics.median(values)
    mad = statistics.median(abs(v - median) for v in values)
    return median, max(MAD_TO_SIGMA * mad, NOISE_FLOOR * abs(median))


def _metric(rows: list[_Row]) -> Metric:
    first = rows[0]
    values = [float(r.value) for r in rows]
    median, spread = robust_spread(values)
    judged = len(values) >= MIN_NODES_FOR_OUTLIERS and spread > 0
    sign = 1.0 if first.better == "higher" else -1.0
    out = []
    for r in rows:
        # Signed so that negative is always the worse side, whichever way the step counts.
        deviation = sign * (float(r.value) - median) / spread if spread > 0 else 0.0
        outlier = None
        if judged and abs(deviation) > OUTLIER_SPREADS:
            outlier = "worse" if deviation < 0 else "better"
        out.append(NodeValue(r.node, r.burnin_id, float(r.value), r.state, r.threshold, r.ended_at, deviation, outlier))
    out.sort(key=lambda v: (v.deviation, v.node))
    thresholds = tuple(sorted({r.threshold for r in rows if r.threshold is not None}))
    return Metric(
        step=first.name,
        kind=first.kind,
        gpu_model=first.gpu_model,
        unit=first.unit,
        better=first.better,
        values=out,
        minimum=min(values),
        median=median,
        maximum=max(values),
        spread=spread,
        judged=judged,
        thresholds=thresholds,
    )


# --- campaigns ------------------------------------------------------------------------------------------

_CAMPAIGN_COLUMNS = (
    Campaign.id,
    Campaign.name,
    Campaign.state,
    Campaign.actions,
    Campaign.policy,
    Campaign.selector,
    Campaign.failures,
    Campaign.reason,
    Campaign.created_by,
    Campaign.created_at,
    Campaign.updated_at,
    Campaign.ended_at,
)


def list_campaigns(session: Session, *, state: str | None = None, limit: int = 100) -> list[CampaignSummary]:
    """Campaigns, newest first, each with its nodes counted per phase."""
    query = select(*_CAMPAIGN_COLUMNS).order_by(Campaign.id.desc()).limit(limit)
    if state is not None:
        query = query.where(Campaign.state == state)
    rows = session.execute(query).all()
    phases: dict[int, dict[str, int]] = defaultdict(dict)
    if rows:
        grouped = session.execute(
            select(CampaignNode.campaign_id, CampaignNode.phase, func.count())
            .where(CampaignNode.campaign_id.in_([r.id for r in rows]))
            .group_by(CampaignNode.campaign_id, CampaignNode.phase)
        )
        for campaign_id, phase, count in grouped:
            phases[campaign_id][phase] = count
    return [_campaign_summary(r, phases.get(r.id, {})) for r in rows]


def get_campaign(session: Session, name: str) -> CampaignDetail:
    """One campaign with every node's phase, in the order the campaign takes them. Raises NotFound."""
    row = session.execute(select(*_CAMPAIGN_COLUMNS).where(Campaign.name == name)).first()
    if row is None:
        raise NotFound(f"no maintenance campaign {name!r}")
    members = list(
        session.scalars(
            select(CampaignNode)
            .where(CampaignNode.campaign_id == row.id)
            .order_by(CampaignNode.position, CampaignNode.id)
        )
    )
    phases: dict[str, int] = defaultdict(int)
    for m in members:
        phases[m.phase] += 1
    actions = list(row.actions or [])
    nodes = [
        CampaignNodeView(
            node=m.node,
            position=m.position,
            canary=m.canary,
            phase=m.phase,
            action_index=m.action,
            action=describe_action(actions[m.action]) if 0 <= m.action < len(actions) else "",
            task_id=m.task_id,
            burnin_id=m.burnin_id,
            drained_here=m.drained_here,
            detail=m.detail,
            data=m.data or {},
            waiting_since=m.waiting_since,
            started_at=m.started_at,
            ended_at=m.ended_at,
        )
        for m in members
    ]
    return CampaignDetail(_campaign_summary(row, dict(phases)), nodes)


def describe_action(action: object) -> str:
    """An action as the CLI writes it (`sync-image:base@3`), as campaign_actions describes it."""
    return campaign_actions.describe(action) if isinstance(action, Mapping) else str(action)


def _campaign_summary(r: _Row, phases: Mapping[str, int]) -> CampaignSummary:
    return CampaignSummary(
        id=r.id,
        name=r.name,
        state=r.state,
        actions=[describe_action(a) for a in (r.actions or [])],
        policy=r.policy or {},
        selector=r.selector or {},
        failures=r.failures,
        reason=r.reason,
        created_by=r.created_by,
        created_at=r.created_at,
        updated_at=r.updated_at,
        ended_at=r.ended_at,
        phases=dict(phases),
    )
