"""Who may do what: the one policy table. Routes name a permission; only `api.deps.allow` checks it.

Roles are the issue's: `admin` (everything), `operator` (nodes, drains, alerts, join tokens; not
users or the audit log), `member` and `viewer` (read the cluster; members also run jobs in their projects), and
`node`, which is what an agent's own credential is: it may only report for its own node.
"""

from __future__ import annotations

import enum


class Role(enum.StrEnum):
    ADMIN = "admin"
    OPERATOR = "operator"
    MEMBER = "member"
    VIEWER = "viewer"
    NODE = "node"


class Permission(enum.StrEnum):
    SELF_READ = "self:read"  # who am I
    API_SCHEMA = "api:schema"  # the OpenAPI document
    NODES_READ = "nodes:read"
    NODES_WRITE = "nodes:write"
    TOKENS_READ = "tokens:read"
    TOKENS_WRITE = "tokens:write"
    TOKENS_OWN = "tokens:own"  # API tokens for oneself (for others: users:write as well)
    TOKENS_REVOKE = "tokens:revoke"
    USERS_READ = "users:read"
    USERS_WRITE = "users:write"
    PROJECTS_READ = "projects:read"
    PROJECTS_WRITE = "projects:write"
    AUDIT_READ = "audit:read"
    ALERTS_READ = "alerts:read"
    ALERTS_WRITE = "alerts:write"  # acknowledge, silence, manage receivers
    METRICS_READ = "metrics:read"  # the fleet in Prometheus' format (GET /metrics)
    JOBS_READ = "jobs:read"  # the queue, job history and usage reports
    JOBS_SUBMIT = "jobs:submit"  # submit jobs as oneself to one's projects, cancel one's own, read their output
    JOBS_ADMIN = "jobs:admin"  # any user's jobs: submit as them, cancel, raise priority, read output
    ENVIRONMENTS_WRITE = "environments:write"  # add and remove runtime environments (reading needs jobs:read)
    ARTIFACTS_WRITE = "artifacts:write"  # register and remove models and datasets (reading needs jobs:read)
    SERVICES_WRITE = "services:write"  # create, scale, update, delete inference services in one's projects
    SERVICES_USE = "services:use"  # call an inference service through the head (/services/NAME/...)
    AGENT_REPORT = "agent:report"  # a node reporting about itself
    ASSETS_READ = "assets:read"  # installed software, advisories and findings: which nodes are vulnerable
    CVE_WRITE = "cve:write"  # import advisories, set a finding's status (accepted risk, mitigated, ...)
    IMAGES_READ = "images:read"  # software images, their history, what a sync would change, a node's drift
    IMAGES_WRITE = "images:write"  # create, clone, remove images, install packages into them, sync nodes
    # Run Ansible playbooks on nodes. Admins only: a playbook also runs code on the head itself
    # (`delegate_to: localhost`, lookups), as the head's user, which reads the head's secrets.
    ANSIBLE_RUN = "ansible:run"
    # Nodes' BMCs (never their passwords) and their power state; reading it live from the BMCs (a task,
    # POST /power/status) needs a token with scope write as every POST does (api.deps.PermissionCheck).
    POWER_READ = "power:read"
    POWER_WRITE = "power:write"  # set BMCs, power nodes on, off, cycle and reset
    # Create, pause, resume and cancel maintenance campaigns (drains and resumes of their nodes); each action
    # also needs its own permission (images:write, power:write, ansible:run, nodes:write). Reading: nodes:read.
    MAINTENANCE_WRITE = "maintenance:write"
    # Register and remove switches polled over SNMP (their communities and keys are write-only). Reading the
    # switches, their ports and where each node is plugged: nodes:read.
    NETWORK_WRITE = "network:write"


_READ_CLUSTER = frozenset(
    {
        Permission.SELF_READ,
        Permission.API_SCHEMA,
        Permission.NODES_READ,
        Permission.PROJECTS_READ,
        Permission.TOKENS_OWN,
        Permission.ALERTS_READ,
        Permission.METRICS_READ,
        Permission.JOBS_READ,
    }
)
# What a token with scope "read" may still do, whatever its role; on routes with a method other than GET,
# HEAD and OPTIONS it is refused anyway, unless the route is marked reads_only (api.deps.PermissionCheck).
READ_SCOPE = frozenset(p for p in Permission if p.value.endswith(":read")) | {Permission.API_SCHEMA}

POLICY: dict[Role, frozenset[Permission]] = {
    Role.ADMIN: frozenset(Permission) - {Permission.AGENT_REPORT},
    Role.OPERATOR: _READ_CLUSTER
    | {
        Permission.NODES_WRITE,
        Permission.TOKENS_READ,
        Permission.TOKENS_WRITE,
        Permission.TOKENS_REVOKE,  # join tokens only: see the revoke route
        Permission.ALERTS_WRITE,
        Permission.JOBS_SUBMIT,
        Permission.ENVIRONMENTS_WRITE,
        Permission.ARTIFACTS_WRITE,
        Permission.SERVICES_WRITE,
        Permission.SERVICES_USE,
        Permission.ASSETS_READ,
        Permission.CVE_WRITE,
        Permission.IMAGES_READ,
        Permission.IMAGES_WRITE,
        Permission.POWER_READ,
        Permission.POWER_WRITE,
        Permission.MAINTENANCE_WRITE,
        Permission.NETWORK_WRITE,
    },
    Role.MEMBER: _READ_CLUSTER | {Permission.JOBS_SUBMIT, Permission.SERVICES_WRITE, Permission.SERVICES_USE},
    Role.VIEWER: _READ_CLUSTER,
    Role.NODE: frozenset({Permission.AGENT_REPORT}),
}


def allowed(role: Role, permission: Permission, scope: str = "write") -> bool:
    if scope == "read" and permission not in READ_SCOPE:
        return False
    return permission in POLICY[role]


def policy_markdown() -> str:
    """The policy table as Markdown, for docs/security.md (a test keeps that page equal to this)."""
    roles = list(Role)
    lines = [
        "| permission | " + " | ".join(role.value for role in roles) + " |",
        "|---|" + "---|" * len(roles),
    ]
    for permission in Permission:
        marks = " | ".join("yes" if allowed(role, permission) else "" for role in roles)
        lines.append(f"| `{permission.value}` | {marks} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(policy_markdown(), end="")
