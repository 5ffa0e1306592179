"""Projects: groups of users sharing GPUs, with quotas the scheduler will enforce. Never commits."""

from __future__ import annotations

import enum
import re
from datetime import datetime

from sqlalchemy import Boolean, Enum, Float, ForeignKey, Integer, String, false, select
from sqlalchemy.orm import Mapped, Session, lazyload, mapped_column, relationship

from gpufleet.auth.models import User
from gpufleet.auth.users import get_user
from gpufleet.core.clock import Clock, to_datetime
from gpufleet.core.db import Base, UTCDateTime, enum_values
from gpufleet.core.errors import Conflict, InvalidInput, NotFound

PROJECT_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")


class BudgetPeriod(enum.StrEnum):
    WEEK = "week"
    MONTH = "month"
    QUARTER = "quarter"


class Project(Base):
    __tablename__ = "projects"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(63), unique=True)
    description: Mapped[str] = mapped_column(String(512), default="")
    # Quotas, enforced by the job scheduler: GPUs in use at once, and GPU-hours per budget period.
    max_gpus: Mapped[int | None] = mapped_column(Integer, default=None)
    gpu_hours_budget: Mapped[float | None] = mapped_column(Float, default=None)
    budget_period: Mapped[BudgetPeriod] = mapped_column(
        Enum(BudgetPeriod, native_enum=False, length=16, values_callable=enum_values), default=BudgetPeriod.MONTH
    )
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())

    members: Mapped[list[ProjectMember]] = relationship(cascade="all, delete-orphan", lazy="selectin")


class ProjectMember(Base):
    __tablename__ = "project_members"

    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"), primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), primary_key=True, index=True)
    added_at: Mapped[datetime] = mapped_column(UTCDateTime())
    # Given by a directory group (`ldap_group_projects`, `oidc_group_projects`): the directory takes it back
    # when the user leaves the group. A membership added by hand is never touched by a directory sync.
    from_directory: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())

    user: Mapped[User] = relationship(lazy="joined")


def get_project(session: Session, name: str, *, members: bool = True) -> Project:
    """The project named `name`, with its members unless `members` is False (a submission reads only its
    quotas). Raises NotFound."""
    query = select(Project).where(Project.name == name)
    if not members:
        query = query.options(lazyload(Project.members))
    project = session.scalar(query)
    if project is None:
        raise NotFound(f"no such project: {name}")
    return project


def list_projects(session: Session) -> list[Project]:
    return list(session.scalars(select(Project).order_by(Project.name)))


def projects_of(session: Session, username: str) -> set[str]:
    """The names of the projects `username` is a member of."""
    return set(
        session.scalars(
            select(Project.name)
            .join(ProjectMember, ProjectMember.project_id == Project.id)
            .join(User, User.id == ProjectMember.user_id)
            .where(User.username == username)
        )
    )


def user_and_projects(session: Session, username: str) -> tuple[User, dict[str, Project]]:
    """The user `username` and the projects they are a member of (without their members), by name: one
    query, for a submission's checks. Raises NotFound for an unknown user."""
    rows = session.execute(
        select(User, Project)
        .outerjoin(ProjectMember, ProjectMember.user_id == User.id)
        .outerjoin(Project, Project.id == ProjectMember.project_id)
        .where(User.username == username)
        .options(lazyload(Project.members))
    ).all()
    if not rows:
        raise NotFound(f"no such user: {username}")
    return rows[0][0], {project.name: project for _, project in rows if project is not None}


def create_project(session: Session, clock: Clock, name: str, description: str = "") -> Project:
    if not PROJECT_NAME.fullmatch(name):
        raise InvalidInput(f"invalid project name {name!r}: lowercase letters, digits, '.', '_' and '-' (max 63)")
    if session.scalar(select(Project.id).where(Project.name == name)) is not None:
        raise Conflict(f"project already exists: {name}")
    project = Project(name=name, description=description, created_at=to_datetime(clock.now()))
    session.add(project)
    session.flush()
    return project


def add_member(session: Session, clock: Clock, project_name: str, username: str) -> Project:
    project = get_project(session, project_name)
    user = get_user(session, username)
    if any(m.user_id == user.id for m in project.members):
        raise Conflict(f"{username} is already a member of {project_name}")
    project.members.append(ProjectMember(user_id=user.id, user=user, added_at=to_datetime(clock.now())))
    session.flush()
    return project


def remove_member(session: Session, project_name: str, username: str) -> Project:
    project = get_project(session, project_name)
    user = get_user(session, username)
    keep = [m for m in project.members if m.user_id != user.id]
    if len(keep) == len(project.members):
        raise NotFound(f"{username} is not a member of {project_name}")
    project.members = keep
    session.flush()
    return project


def set_quota(
    session: Session,
    project_name: str,
    *,
    max_gpus: int | None,
    gpu_hours_budget: float | None,
    budget_period: BudgetPeriod | None = None,
) -> Project:
    """Set both quotas (None: unlimited). Raises InvalidInput for negative values."""
    if max_gpus is not None and max_gpus < 0:
        raise InvalidInput("max GPUs must be 0 or more")
    if gpu_hours_budget is not None and gpu_hours_budget < 0:
        raise InvalidInput("the GPU-hour budget must be 0 or more")
    project = get_project(session, project_name)
    project.max_gpus = max_gpus
    project.gpu_hours_budget = gpu_hours_budget
    if budget_period is not None:
        project.budget_period = budget_period
    return project


def delete_project(session: Session, project_name: str) -> None:
    session.delete(get_project(session, project_name))
    session.flush()
