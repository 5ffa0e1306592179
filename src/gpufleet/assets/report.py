"""The impact report: per problem (CVE), which nodes and packages it touches, at what severity, and
whether a fix exists; per node, its findings; and the findings' workflow (open, accepted risk,
mitigated, fixed), each change with who and why."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpufleet.assets.models import FINDING_STATUSES, AdvisoryRecord, FindingRecord, ImageFinding
from gpufleet.assets.records import SEVERITIES
from gpufleet.core.clock import Clock
from gpufleet.core.errors import InvalidInput, NotFound
from gpufleet.core.hostlist import collect
from gpufleet.inventory.models import Node

ACTIVE = ("open", "accepted", "mitigated")  # what a report shows unless asked for fixed ones too


@dataclass
class PackageImpact:
    ecosystem: str
    package: str
    installed: list[str]
    fixed: str | None


@dataclass
class ProblemReport:
    problem: str  # the CVE (or the advisory id when it names none)
    advisory: str
    also: list[str]
    aliases: list[str]
    summary: str
    severity: str
    cvss_score: float | None
    cvss_vector: str | None
    fix_available: bool
    nodes: list[str]
    packages: list[PackageImpact] = field(default_factory=list)
    statuses: dict[str, int] = field(default_factory=dict)
    images: list[str] = field(default_factory=list)  # software images that hold an affected package

    @property
    def hostlist(self) -> str:
        return collect(self.nodes)


def _severities_from(at_least: str | None) -> tuple[str, ...]:
    if at_least is None:
        return SEVERITIES
    if at_least not in SEVERITIES:
        raise InvalidInput(f"severity must be one of {', '.join(SEVERITIES)}")
    return SEVERITIES[: SEVERITIES.index(at_least) + 1]


def _statuses(statuses: tuple[str, ...] | None) -> tuple[str, ...]:
    chosen = statuses or ACTIVE
    unknown = set(chosen) - set(FINDING_STATUSES)
    if unknown:
        raise InvalidInput(f"status must be among {', '.join(FINDING_STATUSES)}, not {', '.join(sorted(unknown))}")
    return chosen


def problems(
    session: Session,
    *,
    severity: str | None = None,
    statuses: tuple[str, ...] | None = None,
    node: str | None = None,
    problem: str | None = None,
) -> list[ProblemReport]:
    """Problems with findings in `statuses` (default: not fixed), most severe and widest first."""
    query = (
        select(FindingRecord, Node.name)
        .join(Node, Node.id == FindingRecord.node_id)
        .where(FindingRecord.severity.in_(_severities_from(severity)), FindingRecord.status.in_(_statuses(statuses)))
    )
    if node is not None:
        query = query.where(Node.name == node)
    if problem is not None:
        query = query.where(FindingRecord.problem == problem)
    grouped: dict[str, list[tuple[FindingRecord, str]]] = defaultdict(list)
    for finding, name in session.execute(query).all():
        grouped[finding.problem].append((finding, name))
    # Images have no workflow: what affects one is open until a new revision fixes it. A report about
    # one node has no images in it.
    in_images: dict[str, list[ImageFinding]] = defaultdict(list)
    if node is None and "open" in _statuses(statuses):
        images = select(ImageFinding).where(ImageFinding.severity.in_(_severities_from(severity)))
        if problem is not None:
            images = images.where(ImageFinding.problem == problem)
        for row in session.scalars(images):
            in_images[row.problem].append(row)
    leading = {f.advisory_id for rows in grouped.values() for f, _ in rows}
    leading |= {f.advisory_id for key, rows in in_images.items() if key not in grouped for f in rows}
    advisories = {a.id: a for a in session.scalars(select(AdvisoryRecord).where(AdvisoryRecord.id.in_(leading)))}
    reports = [_problem(key, rows, advisories) for key, rows in grouped.items()]
    reports += [_image_problem(key, rows, advisories) for key, rows in in_images.items() if key not in grouped]
    for report in reports:
        report.images = sorted({row.image for row in in_images.get(report.problem, ())})
    rank: dict[str, int] = {s: i for i, s in enumerate(SEVERITIES)}
    reports.sort(key=lambda r: (rank.get(r.severity, len(rank)), -len(r.nodes), r.problem))
    return reports


def _problem(key: str, rows: list[tuple[FindingRecord, str]], advisories: dict[str, AdvisoryRecord]) -> ProblemReport:
    found = [finding for finding, _ in rows]
    also = {a for finding in found for a in json.loads(finding.also)}
    statuses = dict(Counter(finding.status for finding in found))
    return _report(key, found, advisories, also, sorted({name for _, name in rows}), statuses)


def _image_problem(key: str, rows: list[ImageFinding], advisories: dict[str, AdvisoryRecord]) -> ProblemReport:
    """A problem found only in images: no node runs the affected package yet."""
    return _report(key, rows, advisories, set(), [], {})


def _report(
    key: str,
    found: Sequence[FindingRecord | ImageFinding],
    advisories: dict[str, AdvisoryRecord],
    also: set[str],
    nodes: list[str],
    statuses: dict[str, int],
) -> ProblemReport:
    """One problem from what was found of it (on nodes or in images): the most severe advisory leads."""
    lead = max(found, key=lambda f: f.cvss_score or 0.0)
    advisory = advisories.get(lead.advisory_id)
    packages: dict[tuple[str, str], PackageImpact] = {}
    for f in found:
        impact = packages.setdefault((f.ecosystem, f.package), PackageImpact(f.ecosystem, f.package, [], f.fixed))
        if f.installed not in impact.installed:
            impact.installed.append(f.installed)
        impact.fixed = impact.fixed or f.fixed
    return ProblemReport(
        problem=key,
        advisory=lead.advisory_id,
        also=sorted((also | {f.advisory_id for f in found}) - {lead.advisory_id}),
        aliases=json.loads(advisory.aliases) if advisory else [],
        summary=advisory.summary if advisory else "",
        severity=lead.severity,
        cvss_score=lead.cvss_score,
        cvss_vector=advisory.cvss_vector if advisory else None,
        fix_available=all(p.fixed for p in packages.values()),
        nodes=nodes,
        packages=sorted(packages.values(), key=lambda p: (p.ecosystem, p.package)),
        statuses=statuses,
    )


def node_findings(session: Session, node: str, statuses: tuple[str, ...] | None = None) -> list[FindingRecord]:
    """A node's findings, most severe first. Raises NotFound for an unknown node."""
    node_id = session.scalar(select(Node.id).where(Node.name == node))
    if node_id is None:
        raise NotFound(f"no node {node}")
    rank: dict[str, int] = {s: i for i, s in enumerate(SEVERITIES)}
    rows = session.scalars(
        select(FindingRecord).where(FindingRecord.node_id == node_id, FindingRecord.status.in_(_statuses(statuses)))
    )
    return sorted(rows, key=lambda f: (rank.get(f.severity, 99), f.problem, f.package))


REASON_NEEDED = ("accepted", "mitigated")


def set_status(
    session: Session, clock: Clock, finding_id: int, status: str, who: str, reason: str | None
) -> FindingRecord:
    """A person's verdict on a finding. Accepting a risk or calling it mitigated needs a reason."""
    if status not in FINDING_STATUSES:
        raise InvalidInput(f"status must be one of {', '.join(FINDING_STATUSES)}")
    if status in REASON_NEEDED and not (reason and reason.strip()):
        raise InvalidInput(f"say why the finding is {status} (a reason is required)")
    finding = session.get(FindingRecord, finding_id)
    if finding is None:
        raise NotFound(f"no finding {finding_id}")
    finding.status, finding.status_by, finding.status_reason = status, who, (reason or "").strip() or None
    finding.status_at = finding.updated_at = clock.now()
    return finding
