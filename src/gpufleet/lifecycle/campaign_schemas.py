"""API shapes of maintenance campaigns. Field names are stable: scripts read them from `-o json`."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

CAMPAIGN_NAME = r"^[a-z0-9][a-z0-9._-]{0,62}$"
DAY_S = 86_400.0


class CampaignIn(BaseModel):
    """A new campaign: which nodes, what to do on each, and the policy it keeps to."""

    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, StringConstraints(pattern=CAMPAIGN_NAME)] = Field(description="unique, e.g. driver-550")
    nodes: str | None = Field(None, max_length=4096, description="a hostlist, e.g. gpu[001-016] (or category)")
    category: str | None = Field(None, max_length=64, description="every node of this category (or nodes)")
    actions: list[Annotated[str, StringConstraints(min_length=1, max_length=4096)]] = Field(
        min_length=1,
        max_length=16,
        description="in order, on each node: sync-image:IMAGE[@REVISION], packages:install:PKG[,PKG...], "
        "packages:upgrade:PKG[,PKG...], ansible:PLAYBOOK, reboot, power-cycle, burn-in:PROFILE",
    )
    playbooks: dict[Annotated[str, StringConstraints(max_length=100)], str] = Field(
        default_factory=dict, max_length=8, description="the text of each playbook an ansible: action names"
    )
    # Checked by the campaign (lifecycle.campaigns.limit_of), whose refusal says what a good value is.
    max_unavailable: Annotated[str, StringConstraints(min_length=1, max_length=8)] = Field(
        "1", description="campaign nodes out of service at once, whoever took them out: N, or P% of the nodes"
    )
    wait_jobs_s: float = Field(
        3600.0, ge=0, le=30 * DAY_S, description="how long a drained node's running jobs may finish on their own"
    )
    overdue: Literal["wait", "fail"] = Field(
        "wait",
        description="past wait_jobs_s, jobs that allow it are requeued; a node whose other jobs still run "
        "waits on (wait) or is given back and counted a failure (fail)",
    )
    keep: int = Field(0, ge=0, le=100_000, description="nodes of each category that stay in service at least")
    failure_budget: int = Field(1, ge=1, le=100_000, description="the campaign stops once this many nodes failed")
    canary: bool = Field(True, description="one node alone first; the rest only once it succeeded")
    boot_timeout_s: float = Field(
        1800.0, gt=0, le=DAY_S, description="how long a node may take to come back after reboot or power-cycle"
    )


class CampaignPlanOut(BaseModel):
    """What a campaign would do (the CLI's --dry-run)."""

    name: str
    nodes: list[str] = Field(description="in the order the campaign takes them")
    hostlist: str
    canary: str | None
    max_unavailable: int = Field(description="the limit in nodes, a percentage resolved")
    actions: list[str]
    policy: dict[str, Any]


class CampaignNodeOut(BaseModel):
    node: str
    position: int
    canary: bool
    phase: str = Field(description="pending, waiting (drained; its jobs finish), acting, done, failed, skipped")
    action: int = Field(description="the index of the action running or next")
    action_text: str | None = Field(description="that action as written; None past the last")
    task_id: int | None
    burnin_id: int | None
    drained_here: bool = Field(description="the campaign drained the node, so it resumes it when done")
    serving: bool | None = Field(description="up and not drained now (None: the node was removed)")
    detail: str
    results: dict[str, Any] = Field(description="each action's result, by its index")
    waiting_since: datetime | None
    started_at: datetime | None
    ended_at: datetime | None


class CampaignOut(BaseModel):
    name: str
    state: str = Field(description="running, paused, stopped (the canary or the failure budget), cancelled, completed")
    reason: str
    actions: list[str]
    policy: dict[str, Any]
    selector: dict[str, Any]
    failures: int
    total: int
    phases: dict[str, int] = Field(description="nodes per phase")
    unavailable: int = Field(description="campaign nodes out of service now (what max_unavailable limits)")
    max_unavailable: int
    created_by: str
    created_at: datetime
    updated_at: datetime
    ended_at: datetime | None


class CampaignDetailOut(CampaignOut):
    nodes: list[CampaignNodeOut]
