"""API shapes of burn-in runs and profiles. Field names are stable: scripts read them from `-o json`."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from gpufleet.lifecycle.models import BurnIn
from gpufleet.lifecycle.profiles import Profile

ProfileName = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")]


class BurnInCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    nodes: list[Annotated[str, StringConstraints(min_length=1, max_length=4096)]] = Field(
        min_length=1, max_length=1000, description="node names or hostlist expressions such as gpu[001-016]"
    )
    profile: ProfileName
    resume: bool = Field(True, description="put each node back in service when it passes (false: leave it drained)")


class StepOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    position: int
    name: str
    kind: str
    state: str = Field(
        description="pending, running, retry (a pair or group step measuring a suspect again), passed, failed, skipped"
    )
    job_id: int | None
    partner: str | None = Field(description="a pair step's other node; in a group, the first other (see evidence)")
    group_size: int = Field(description="nodes a multi-node step measures together (2: pairs); 1 for the others")
    attempts: int
    value: float | None
    unit: str
    threshold: float | None
    better: str = Field(description="higher: the value must be at least the threshold; lower: at most")
    detail: str
    evidence: dict[str, Any]
    started_at: datetime | None
    ended_at: datetime | None


class BurnInOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    node: str
    profile: str
    batch: str
    state: str = Field(description="queued, running, passed, failed, cancelled")
    reason: str = Field(description="a failed run: the step, its value and the threshold")
    gpu_model: str | None
    resume_on_pass: bool
    campaign_id: int | None
    requested_by: str
    created_at: datetime
    started_at: datetime | None
    ended_at: datetime | None
    steps: list[StepOut]

    @classmethod
    def of(cls, run: BurnIn) -> BurnInOut:
        return cls.model_validate(run)


class ProfileStepOut(BaseModel):
    name: str
    kind: str
    seconds: float
    options: dict[str, str]
    threshold: dict[str, float] = Field(description="per GPU model (a part of its name, lowercase) or default")
    better: str
    pairs: bool = Field(description="runs over several nodes under test together: pairs, or groups of `group`")
    group: int | None = Field(description="nodes measured together (2: pairs); null for a single-node step")


class ProfileOut(BaseModel):
    name: str
    description: str
    origin: str = Field(description='"built-in", or the admin file that defines it')
    steps: list[ProfileStepOut]

    @classmethod
    def of(cls, profile: Profile, builtin_dir: str) -> ProfileOut:
        return cls(
            name=profile.name,
            description=profile.description,
            origin="built-in" if profile.path.startswith(builtin_dir) else profile.path,
            steps=[
                ProfileStepOut(
                    name=s.name,
                    kind=s.kind,
                    seconds=s.seconds,
                    options=dict(s.options),
                    threshold=dict(s.threshold),
                    better=s.better,
                    pairs=s.multi_node,
                    group=s.group if s.multi_node else None,
                )
                for s in profile.steps
            ],
        )


class ProfilesOut(BaseModel):
    profiles: list[ProfileOut]
    problems: list[str] = Field(description="admin files that could not be loaded, and why")
