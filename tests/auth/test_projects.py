import pytest
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.auth import projects, users
from gpufleet.auth.schemas import UserCreate
from gpufleet.core.clock import FakeClock
from gpufleet.core.db import transaction
from gpufleet.core.errors import Conflict, InvalidInput, NotFound


def test_projects_members_and_quotas(sessions: sessionmaker[Session], clock: FakeClock) -> None:
    with transaction(sessions) as s:
        for name in ("alice", "bob"):
            users.create_user(s, clock, UserCreate(username=name))
        projects.create_project(s, clock, "vision", "image models")
        projects.add_member(s, clock, "vision", "alice")
        projects.add_member(s, clock, "vision", "bob")
        projects.set_quota(s, "vision", max_gpus=16, gpu_hours_budget=5000.0, budget_period=projects.BudgetPeriod.WEEK)
    with transaction(sessions) as s:
        project = projects.get_project(s, "vision")
        assert sorted(m.user.username for m in project.members) == ["alice", "bob"]
        assert (project.max_gpus, project.gpu_hours_budget, project.budget_period) == (16, 5000.0, "week")
        projects.remove_member(s, "vision", "bob")
        users.delete_user(s, "alice")  # a deleted user leaves every project
    with transaction(sessions) as s:
        assert projects.get_project(s, "vision").members == []


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda s, c: projects.create_project(s, c, "Vision"), InvalidInput),
        (lambda s, c: projects.create_project(s, c, "vision"), Conflict),
        (lambda s, c: projects.add_member(s, c, "vision", "nobody"), NotFound),
        (lambda s, c: projects.add_member(s, c, "vision", "alice"), Conflict),
        (lambda s, c: projects.remove_member(s, "vision", "bob"), NotFound),
        (lambda s, c: projects.set_quota(s, "vision", max_gpus=-1, gpu_hours_budget=None), InvalidInput),
        (lambda s, c: projects.get_project(s, "nope"), NotFound),
    ],
)
def test_bad_project_changes_change_nothing(
    sessions: sessionmaker[Session], clock: FakeClock, call: object, error: type[Exception]
) -> None:
    with transaction(sessions) as s:
        for name in ("alice", "bob"):
            users.create_user(s, clock, UserCreate(username=name))
        projects.create_project(s, clock, "vision")
        projects.add_member(s, clock, "vision", "alice")
    with pytest.raises(error), transaction(sessions) as s:
        call(s, clock)  # type: ignore[operator]
    with transaction(sessions) as s:
        project = projects.get_project(s, "vision")
        assert [m.user.username for m in project.members] == ["alice"]
        assert project.max_gpus is None
