"""Burn-in runs and campaigns written straight into the tables, for tests of what is read back (views,
pages) without running the controllers that would write them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpufleet.inventory.models import Node
from gpufleet.lifecycle.models import BurnIn, BurnInStep, Campaign, CampaignNode

T0 = datetime(2027, 1, 4, 9, 0, tzinfo=UTC)


@dataclass
class S:
    """A step to seed: name (kind too, unless given), state, value, threshold."""

    name: str
    state: str = "passed"
    value: float | None = None
    threshold: float | None = None
    unit: str = "TFLOPS"
    better: str = "higher"
    kind: str = ""
    detail: str = ""
    partner: str | None = None
    attempts: int = 1
    job_id: int | None = None
    evidence: dict[str, Any] = field(default_factory=dict)


def add_run(
    session: Session,
    node: str,
    steps: Sequence[S],
    *,
    state: str | None = None,
    profile: str = "quick",
    batch: str = "b1",
    reason: str = "",
    gpu_model: str | None = "NVIDIA H200",
    at: datetime = T0,
    campaign_id: int | None = None,
) -> int:
    """A finished run of `node` (failed if a step failed, else passed, unless `state`). Returns its id."""
    node_id = session.scalar(select(Node.id).where(Node.name == node))
    if state is None:
        state = "failed" if any(s.state == "failed" for s in steps) else "passed"
    run = BurnIn(
        node_id=node_id,
        node=node,
        profile=profile,
        batch=batch,
        state=state,
        reason=reason,
        gpu_model=gpu_model,
        resume_on_pass=True,
        campaign_id=campaign_id,
        requested_by="alice",
        created_at=at,
        started_at=at,
        ended_at=at + timedelta(minutes=10) if state not in ("queued", "running") else None,
    )
    for i, s in enumerate(steps):
        run.steps.append(
            BurnInStep(
                position=i,
                name=s.name,
                kind=s.kind or s.name,
                state=s.state,
                job_id=s.job_id,
                partner=s.partner,
                attempts=s.attempts,
                value=s.value,
                unit=s.unit,
                threshold=s.threshold,
                better=s.better,
                detail=s.detail,
                evidence=s.evidence,
                started_at=at + timedelta(minutes=i),
                ended_at=at + timedelta(minutes=i + 1) if s.state in ("passed", "failed", "skipped") else None,
            )
        )
    session.add(run)
    session.flush()
    return run.id


def add_campaign(
    session: Session,
    name: str,
    phases: Sequence[tuple[str, str]],
    *,
    state: str = "running",
    actions: Sequence[dict[str, Any]] = ({"kind": "sync-image", "image": "base", "revision": 3},),
    policy: dict[str, Any] | None = None,
    reason: str = "",
    failures: int = 0,
    at: datetime = T0,
) -> int:
    """A campaign over (node, phase) pairs in order, the first one its canary. Returns its id."""
    campaign = Campaign(
        name=name,
        state=state,
        actions=list(actions),
        policy=policy if policy is not None else {"max_unavailable": 2, "canary": True},
        selector={"nodes": "sim[001-016]"},
        failures=failures,
        reason=reason,
        created_by="alice",
        created_at=at,
        updated_at=at,
    )
    for i, (node, phase) in enumerate(phases):
        campaign.nodes.append(
            CampaignNode(
                node_id=session.scalar(select(Node.id).where(Node.name == node)),
                node=node,
                position=i,
                canary=i == 0,
                phase=phase,
                action=0,
                detail=f"{node}: {phase}",
            )
        )
    session.add(campaign)
    session.flush()
    return campaign.id
