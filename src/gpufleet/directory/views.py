"""The directory's status for admins: users per source, each source's last sync and what cannot be mapped."""

from __future__ import annotations

from collections.abc import Mapping

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gpufleet.auth.models import User
from gpufleet.directory import sync
from gpufleet.directory.mapping import GroupMapping
from gpufleet.directory.schemas import DirectoryStatus, SourceStatus


def status(
    session: Session, *, identity_provider: str, sso: bool, mappings: Mapping[str, GroupMapping]
) -> DirectoryStatus:
    """`mappings`: each configured source's group mapping, checked against the projects there are now."""
    counts: dict[str, int] = dict(session.execute(select(User.source, func.count()).group_by(User.source)).all())
    problems = [f"{source}: {p}" for source, mapping in mappings.items() for p in mapping.problems(session)]
    return DirectoryStatus(
        identity_provider=identity_provider,
        sso=sso,
        users={source: counts.get(source, 0) for source in ("local", *sync.SOURCES)},
        sources=[SourceStatus.model_validate(row) for row in sync.statuses(session)],
        problems=problems,
    )
