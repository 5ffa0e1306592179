"""What the API and the CLI show of a task."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict

from gpufleet.tasks.models import Task


class TargetOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    target: str
    state: str
    detail: str
    data: dict[str, Any] | None
    started_at: datetime | None
    finished_at: datetime | None


class TaskOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    kind: str
    state: str
    summary: str | None
    params: dict[str, Any]
    created_by: str
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    total: int
    done: int
    failed: int
    targets: list[TargetOut]

    @classmethod
    def of(cls, task: Task) -> TaskOut:
        return cls.model_validate(task)
