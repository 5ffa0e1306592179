"""Tables of burn-in runs (one per node and run, each with its steps' results) and maintenance campaigns."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Boolean, Float, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column, relationship

from gpufleet.core.db import Base, UTCDateTime

# BurnIn.state: queued (waiting for the node to be idle and up), running, passed, failed, cancelled.
BURNIN_ACTIVE = ("queued", "running")
# BurnInStep.state: pending, running, passed, failed, skipped (a GPU step on a node without GPUs).
# Campaign.state: running, paused, stopped (the failure budget or the canary), cancelled, completed.
CAMPAIGN_ACTIVE = ("running", "paused", "stopped")
# CampaignNode.phase: pending, waiting (drained; its jobs finish), acting (an action runs), done, failed,
# skipped (the campaign was cancelled before it started here).


class BurnIn(Base):
    """One node's run of a profile. Nodes started together form a batch: pair steps pair within it."""

    __tablename__ = "burnins"

    id: Mapped[int] = mapped_column(primary_key=True)
    node_id: Mapped[int | None] = mapped_column(ForeignKey("nodes.id", ondelete="SET NULL"), index=True)
    node: Mapped[str] = mapped_column(String(64), index=True)
    profile: Mapped[str] = mapped_column(String(64))
    batch: Mapped[str] = mapped_column(String(64), index=True)
    state: Mapped[str] = mapped_column(String(16), index=True)
    reason: Mapped[str] = mapped_column(String(1024), default="")  # the failed step, its value and threshold
    gpu_model: Mapped[str | None] = mapped_column(String(128), default=None)  # as thresholds were chosen
    # On pass: put the node back in service (admission, a repaired node) or leave it as it was.
    resume_on_pass: Mapped[bool] = mapped_column(Boolean, default=True)
    campaign_id: Mapped[int | None] = mapped_column(Integer, default=None, index=True)
    requested_by: Mapped[str] = mapped_column(String(160))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None)

    steps: Mapped[list[BurnInStep]] = relationship(
        back_populates="burnin", cascade="all, delete-orphan", order_by="BurnInStep.position", lazy="selectin"
    )


class BurnInStep(Base):
    __tablename__ = "burnin_steps"
    __table_args__ = (UniqueConstraint("burnin_id", "name"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    burnin_id: Mapped[int] = mapped_column(ForeignKey("burnins.id", ondelete="CASCADE"), index=True)
    position: Mapped[int] = mapped_column(Integer)
    name: Mapped[str] = mapped_column(String(64))
    kind: Mapped[str] = mapped_column(String(32))
    # The command and limit as the profile said when the run started: editing a profile file later
    # changes no run in flight.
    argv: Mapped[list[str]] = mapped_column(JSON, default=list)
    time_limit_s: Mapped[float] = mapped_column(Float, default=600.0)
    thresholds: Mapped[dict[str, float]] = mapped_column(JSON, default=dict)  # per GPU model, as the profile
    state: Mapped[str] = mapped_column(String(16))
    job_id: Mapped[int | None] = mapped_column(Integer, default=None, index=True)  # the current attempt's job
    # A multi-node step's other node (in a group, the first other; the evidence lists them all).
    partner: Mapped[str | None] = mapped_column(String(64), default=None)
    # How many nodes a multi-node step measures together (2: pairs), as the profile said; 1 for the others.
    group_size: Mapped[int] = mapped_column(Integer, default=2)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    value: Mapped[float | None] = mapped_column(Float, default=None)
    unit: Mapped[str] = mapped_column(String(16), default="")
    threshold: Mapped[float | None] = mapped_column(Float, default=None)
    better: Mapped[str] = mapped_column(String(8), default="higher")  # higher / lower
    detail: Mapped[str] = mapped_column(String(1024), default="")
    evidence: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None)

    burnin: Mapped[BurnIn] = relationship(back_populates="steps")


class Campaign(Base):
    """A rolling change over many nodes, node by node under a policy; durable, so any leader carries it on."""

    __tablename__ = "campaigns"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    state: Mapped[str] = mapped_column(String(16), index=True)
    actions: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)  # in order, on each node
    policy: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    selector: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # how the nodes were chosen
    failures: Mapped[int] = mapped_column(Integer, default=0)
    reason: Mapped[str] = mapped_column(String(1024), default="")  # why it stopped, paused or ended
    created_by: Mapped[str] = mapped_column(String(160))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None)

    nodes: Mapped[list[CampaignNode]] = relationship(
        back_populates="campaign", cascade="all, delete-orphan", order_by="CampaignNode.position", lazy="selectin"
    )


class CampaignNode(Base):
    __tablename__ = "campaign_nodes"
    __table_args__ = (UniqueConstraint("campaign_id", "node"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    campaign_id: Mapped[int] = mapped_column(ForeignKey("campaigns.id", ondelete="CASCADE"), index=True)
    node_id: Mapped[int | None] = mapped_column(ForeignKey("nodes.id", ondelete="SET NULL"), index=True)
    node: Mapped[str] = mapped_column(String(64))
    position: Mapped[int] = mapped_column(Integer)
    canary: Mapped[bool] = mapped_column(Boolean, default=False)
    phase: Mapped[str] = mapped_column(String(16), index=True)
    action: Mapped[int] = mapped_column(Integer, default=0)  # index of the action running or next
    task_id: Mapped[int | None] = mapped_column(Integer, default=None)  # the running action's task
    burnin_id: Mapped[int | None] = mapped_column(Integer, default=None)  # the running action's burn-in
    # Whether the campaign drained the node (so it resumes it); a node a person had drained stays drained.
    drained_here: Mapped[bool] = mapped_column(Boolean, default=False)
    detail: Mapped[str] = mapped_column(Text, default="")
    data: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # each action's result
    waiting_since: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None)

    campaign: Mapped[Campaign] = relationship(back_populates="nodes")
