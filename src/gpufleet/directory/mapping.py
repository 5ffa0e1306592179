"""Which role and projects a directory user's groups give them (`ldap_group_roles`, `ldap_group_projects`,
and the `oidc_` ones for single sign-on)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpufleet.auth.policy import Role
from gpufleet.auth.projects import Project

# The highest role wins when a user's groups map to several.
RANK = {Role.VIEWER: 0, Role.MEMBER: 1, Role.OPERATOR: 2, Role.ADMIN: 3}


@dataclass(frozen=True)
class GroupMapping:
    roles: Mapping[str, Role] = field(default_factory=dict)  # group -> role
    projects: Mapping[str, str] = field(default_factory=dict)  # group -> project name
    default_role: Role = Role.MEMBER  # a user in no group of `roles`

    @classmethod
    def of(cls, roles: Mapping[str, str], projects: Mapping[str, str], default_role: str) -> GroupMapping:
        """From the settings' plain strings (checked there to name user roles)."""
        return cls({g: Role(r) for g, r in roles.items()}, dict(projects), Role(default_role))

    def role_for(self, groups: Iterable[str]) -> Role:
        mapped = [self.roles[g] for g in groups if g in self.roles]
        return max(mapped, key=RANK.__getitem__) if mapped else self.default_role

    def projects_for(self, groups: Iterable[str]) -> set[str]:
        return {self.projects[g] for g in groups if g in self.projects}

    def problems(self, session: Session) -> list[str]:
        """What cannot be applied as configured: a group mapped to a project that does not exist."""
        wanted = set(self.projects.values())
        have = set(session.scalars(select(Project.name).where(Project.name.in_(wanted)))) if wanted else set()
        return [
            f"group {group} maps to project {project}, which does not exist"
            for group, project in sorted(self.projects.items())
            if project not in have
        ]
