"""Tables for tasks (a slow action over many targets) and each target's result."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column, relationship

from gpufleet.core.db import Base, UTCDateTime


class Task(Base):
    __tablename__ = "tasks"

    id: Mapped[int] = mapped_column(primary_key=True)
    kind: Mapped[str] = mapped_column(String(64), index=True)  # power.on, image.sync, image.install, ansible.run
    state: Mapped[str] = mapped_column(String(16), index=True)  # queued, running, succeeded, failed, interrupted
    summary: Mapped[str | None] = mapped_column(String(1024), default=None)
    params: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_by: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None)
    # Written every few seconds by the head running the task: a task whose heartbeat stopped belongs
    # to a head that died, and is marked interrupted instead of showing "running" forever.
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None)
    total: Mapped[int] = mapped_column(Integer, default=0)
    done: Mapped[int] = mapped_column(Integer, default=0)  # targets finished, ok or not
    failed: Mapped[int] = mapped_column(Integer, default=0)

    targets: Mapped[list[TaskTarget]] = relationship(
        back_populates="task", cascade="all, delete-orphan", order_by="TaskTarget.position", lazy="selectin"
    )


class TaskTarget(Base):
    __tablename__ = "task_targets"
    __table_args__ = (UniqueConstraint("task_id", "target"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    task_id: Mapped[int] = mapped_column(ForeignKey("tasks.id", ondelete="CASCADE"), index=True)
    position: Mapped[int] = mapped_column(Integer)  # the order the caller gave (hostlist order)
    target: Mapped[str] = mapped_column(String(253))
    state: Mapped[str] = mapped_column(String(16))  # pending, running, ok, failed, skipped
    detail: Mapped[str] = mapped_column(Text, default="")
    data: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), default=None)

    task: Mapped[Task] = relationship(back_populates="targets")
