"""Software assets and CVE impact: what runs where, how it drifts, which advisories touch it.

Reading needs `assets:read` (which nodes are vulnerable is not for every cluster user); importing
advisories and judging findings need `cve:write`. Findings are kept up to date by the leader's asset
pass (workers.asset_loops), a few seconds after a node's software or the advisories change.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from gpufleet.api.deps import Ctx, allow, tx
from gpufleet.assets import report, store, views
from gpufleet.assets.records import advisory_from_json
from gpufleet.auth.policy import Permission
from gpufleet.auth.schemas import Principal
from gpufleet.core.errors import InvalidInput, NotFound

router = APIRouter(tags=["assets"])
MAX_ADVISORIES_PER_BATCH = 2000
MAX_ADVISORY_BATCH_BYTES = 32 * 1024 * 1024


def _at(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


# -- advisories and findings ----------------------------------------------------------------------


class AdvisoryBatch(BaseModel):
    advisories: list[dict[str, Any]] = Field(max_length=MAX_ADVISORIES_PER_BATCH)


class ImportResult(BaseModel):
    new: int
    updated: int
    unchanged: int


@router.post("/cve/advisories")
def import_advisories(
    body: AdvisoryBatch, _: Annotated[Principal, allow(Permission.CVE_WRITE)], ctx: Ctx
) -> ImportResult:
    """Store advisories (as `gpufleet cve import` parses them); the same record again changes nothing."""
    try:
        parsed = [advisory_from_json(a) for a in body.advisories]
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidInput(f"malformed advisory: {exc}") from None
    with tx(ctx) as db:
        counts = store.import_advisories(db, ctx.clock, parsed)
    return ImportResult(new=counts.new, updated=counts.updated, unchanged=counts.unchanged)


class PackageImpactOut(BaseModel):
    ecosystem: str
    package: str
    installed: list[str]
    fixed: str | None


class ProblemOut(BaseModel):
    problem: str
    advisory: str
    also: list[str]
    aliases: list[str]
    summary: str
    severity: str
    cvss_score: float | None
    cvss_vector: str | None
    fix_available: bool
    nodes: list[str]
    hostlist: str
    packages: list[PackageImpactOut]
    statuses: dict[str, int]
    images: list[str] = Field(description="software images holding an affected package")


Severity = Annotated[str | None, Query(pattern="^(critical|high|medium|low|none|unknown)$", description="at least")]
Statuses = Annotated[list[str] | None, Query(description="open, accepted, mitigated, fixed (default: all but fixed)")]


@router.get("/cve/report")
def cve_report(
    _: Annotated[Principal, allow(Permission.ASSETS_READ)],
    ctx: Ctx,
    severity: Severity = None,
    status: Statuses = None,
    node: Annotated[str | None, Query(max_length=64)] = None,
    problem: Annotated[str | None, Query(max_length=128, description="one CVE (or advisory id)")] = None,
) -> list[ProblemOut]:
    """Per problem (CVE): affected nodes and packages, installed and fixed versions, severity."""
    with tx(ctx, readonly=True) as db:
        found = report.problems(
            db, severity=severity, statuses=tuple(status) if status else None, node=node, problem=problem
        )
    return [
        ProblemOut(
            **{k: getattr(p, k) for k in ProblemOut.model_fields if k not in ("packages", "hostlist")},
            hostlist=p.hostlist,
            packages=[PackageImpactOut(**vars(i)) for i in p.packages],
        )
        for p in found
    ]


class FindingOut(BaseModel):
    id: int
    node: str
    problem: str
    advisory: str
    also: list[str]
    ecosystem: str
    package: str
    location: str
    installed: str
    fixed: str | None
    severity: str
    cvss_score: float | None
    notes: str
    status: str
    status_by: str | None
    status_reason: str | None
    status_at: datetime | None
    first_seen: datetime


@router.get("/cve/findings")
def node_findings(
    _: Annotated[Principal, allow(Permission.ASSETS_READ)],
    ctx: Ctx,
    node: Annotated[str, Query(max_length=64)],
    status: Statuses = None,
) -> list[FindingOut]:
    """One node's findings, most severe first."""
    with tx(ctx, readonly=True) as db:
        rows = report.node_findings(db, node, tuple(status) if status else None)
        return [_finding_out(f, node) for f in rows]


def _finding_out(f: Any, node: str) -> FindingOut:
    return FindingOut(
        id=f.id,
        node=node,
        problem=f.problem,
        advisory=f.advisory_id,
        also=json.loads(f.also),
        ecosystem=f.ecosystem,
        package=f.package,
        location=f.location,
        installed=f.installed,
        fixed=f.fixed,
        severity=f.severity,
        cvss_score=f.cvss_score,
        notes=f.notes,
        status=f.status,
        status_by=f.status_by,
        status_reason=f.status_reason,
        status_at=_at(f.status_at) if f.status_at is not None else None,
        first_seen=_at(f.first_seen),
    )


class StatusChange(BaseModel):
    status: Literal["open", "accepted", "mitigated", "fixed"]
    reason: str | None = Field(None, max_length=1024)


@router.patch("/cve/findings/{finding_id}")
def change_finding(
    finding_id: int, body: StatusChange, who: Annotated[Principal, allow(Permission.CVE_WRITE)], ctx: Ctx
) -> FindingOut:
    """A person's verdict: accepted risk or mitigated (both need a reason), open again, or fixed."""
    with tx(ctx) as db:
        finding = report.set_status(db, ctx.clock, finding_id, body.status, who.actor, body.reason)
        node = store.node_name(db, finding.node_id)
        return _finding_out(finding, node)


# -- software: what runs where ----------------------------------------------------------------------


class PackageOut(BaseModel):
    ecosystem: str
    name: str
    version: str
    source_name: str | None
    source_version: str | None
    arch: str | None
    location: str | None


class NodeSoftwareOut(BaseModel):
    node: str
    category: str | None
    distro: str | None
    kernel: str | None
    reported_at: datetime
    changed_at: datetime
    packages: list[PackageOut]


def _packages(packages: list[Any]) -> list[PackageOut]:
    return [PackageOut(**vars(p)) for p in packages]


@router.get("/assets/nodes/{name}")
def node_software(
    name: str,
    _: Annotated[Principal, allow(Permission.ASSETS_READ)],
    ctx: Ctx,
    ecosystem: Annotated[str | None, Query(max_length=64)] = None,
) -> NodeSoftwareOut:
    with tx(ctx, readonly=True) as db:
        found = store.node_software(db, [name]).get(name)
    if found is None:
        raise NotFound(f"node {name} has not reported its software (or does not exist)")
    packages = [p for p in found.packages if ecosystem is None or p.ecosystem == ecosystem]
    return NodeSoftwareOut(
        node=name,
        category=found.category,
        distro=f"{found.distro.ecosystem} {found.distro.release}" if found.distro else None,
        kernel=found.kernel,
        reported_at=_at(found.reported_at),
        changed_at=_at(found.changed_at),
        packages=_packages(packages),
    )


class ChangedOut(BaseModel):
    ecosystem: str
    name: str
    location: str | None
    a: str
    b: str


class DiffOut(BaseModel):
    a: str
    b: str
    only_a: list[PackageOut]
    only_b: list[PackageOut]
    changed: list[ChangedOut]


@router.get("/assets/diff")
def software_diff(
    _: Annotated[Principal, allow(Permission.ASSETS_READ)],
    ctx: Ctx,
    a: Annotated[str, Query(max_length=64)],
    b: Annotated[str, Query(max_length=64)],
) -> DiffOut:
    with tx(ctx, readonly=True) as db:
        found = store.node_software(db, [a, b])
    for name in (a, b):
        if name not in found:
            raise NotFound(f"node {name} has not reported its software (or does not exist)")
    d = views.diff(found[a].packages, found[b].packages)
    return DiffOut(
        a=a,
        b=b,
        only_a=_packages(d.only_a),
        only_b=_packages(d.only_b),
        changed=[
            ChangedOut(ecosystem=x.ecosystem, name=x.name, location=x.location, a=x.version, b=y.version)
            for x, y in d.changed
        ],
    )


class WhereOut(BaseModel):
    node: str
    package: PackageOut


@router.get("/assets/where")
def software_where(
    _: Annotated[Principal, allow(Permission.ASSETS_READ)],
    ctx: Ctx,
    package: Annotated[str, Query(min_length=1, max_length=256)],
    versions: Annotated[str | None, Query(max_length=256, description="e.g. <2.31.0 or >=535,<550.90.07")] = None,
    ecosystem: Annotated[str | None, Query(max_length=64)] = None,
) -> list[WhereOut]:
    """The nodes that have a package (by binary or source name), optionally only in a version range."""
    try:
        clauses = views.parse_range(versions) if versions else None
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None
    with tx(ctx, readonly=True) as db:
        nodes = {n: v.packages for n, v in store.node_software(db).items()}
    return [WhereOut(node=n, package=PackageOut(**vars(p))) for n, p in views.where(nodes, package, clauses, ecosystem)]


@router.get("/assets/matrix")
def software_matrix(
    _: Annotated[Principal, allow(Permission.ASSETS_READ)], ctx: Ctx
) -> dict[str, dict[str, list[str]]]:
    """Which nodes run which kernel, driver, CUDA, cuDNN, NCCL and firmware version."""
    with tx(ctx, readonly=True) as db:
        nodes = {n: v.packages for n, v in store.node_software(db).items()}
    return views.version_matrix(nodes)


class DriftOut(BaseModel):
    category: str
    software: str
    baseline: str
    pinned: bool
    nodes: dict[str, list[str]]
    summary: str


@router.get("/assets/drift")
def software_drift(_: Annotated[Principal, allow(Permission.ASSETS_READ)], ctx: Ctx) -> list[DriftOut]:
    """Per category, the nodes whose kernel, driver, CUDA or firmware differs from the category's."""
    with tx(ctx, readonly=True) as db:
        found = store.node_software(db)
    nodes = {n: v.packages for n, v in found.items()}
    categories = {n: v.category for n, v in found.items()}
    return [
        DriftOut(
            category=d.category,
            software=d.software,
            baseline=d.baseline,
            pinned=d.pinned,
            nodes=d.nodes,
            summary=d.describe(),
        )
        for d in views.drift(nodes, categories)
    ]
