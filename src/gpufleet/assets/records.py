"""What the asset and advisory code passes around: installed software, advisories, findings.

Pure data (no database, no server packages): the agent, the offline `gpufleet cve scan` and the head
all use these. Ecosystems use OSV's names where OSV has one (`Debian`, `Ubuntu`, `PyPI`, `Red Hat`,
`Go`, `npm`, ...); software no package manager owns (the NVIDIA driver, CUDA, firmware) has the
ecosystem `NVIDIA` or `firmware`, see `ECOSYSTEMS`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

# Ecosystems whose versions gpufleet compares (assets.versions), and the scheme each uses.
ECOSYSTEMS: dict[str, str] = {
    "Debian": "deb",
    "Ubuntu": "deb",
    "Red Hat": "rpm",
    "Rocky Linux": "rpm",
    "AlmaLinux": "rpm",
    "PyPI": "pep440",
    "Go": "semver",
    "npm": "semver",
    "crates.io": "semver",
    "NVIDIA": "dotted",  # driver 550.90.07, CUDA 12.4, cuDNN 9.1.0, NCCL 2.21.5
    "firmware": "dotted",
}
# Distributions whose packages name a source package (advisories name the source package).
SOURCE_PACKAGE_DISTROS = ("Debian", "Ubuntu")
# Distributions whose packages come from a source RPM: advisories name the binary package, some
# (CSAF's source products) the source RPM, so both names are tried.
SOURCE_RPM_DISTROS = ("Red Hat", "Rocky Linux", "AlmaLinux")

Severity = Literal["critical", "high", "medium", "low", "none", "unknown"]
SEVERITIES: tuple[Severity, ...] = ("critical", "high", "medium", "low", "none", "unknown")


@dataclass(frozen=True)
class Distro:
    """The node's OS as /etc/os-release says: ecosystem `Ubuntu`, release `22.04`."""

    ecosystem: str
    release: str


@dataclass(frozen=True)
class Installed:
    """One installed package (or driver, library, firmware) on a node or in an image."""

    ecosystem: str  # Debian, Ubuntu, Red Hat, PyPI, NVIDIA, firmware, ...
    name: str  # the binary package's name (Debian, RPM), the distribution's (PyPI, normalized), ...
    version: str
    source_name: str | None = None  # Debian/Ubuntu: the source package advisories name; RPM: the source RPM's
    source_version: str | None = None
    arch: str | None = None
    location: str | None = None  # a pip environment's path, a GPU's index, a NIC's name ...


@dataclass(frozen=True)
class Range:
    """An OSV range: events in order, each (`introduced` | `fixed` | `last_affected` | `limit`, version).
    `kind` is OSV's type: ECOSYSTEM (the ecosystem's own ordering), SEMVER or GIT (never matched)."""

    kind: str
    events: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Affected:
    """What one advisory says about one package in one ecosystem (and release, for distributions)."""

    ecosystem: str
    package: str  # for Debian/Ubuntu, the source package
    release: str | None = None  # "12", "22.04"; None: every release (PyPI, NVIDIA)
    ranges: tuple[Range, ...] = ()
    versions: tuple[str, ...] = ()  # explicitly affected versions
    fixed: str | None = None  # the first fixed version, when the advisory names one (for the report)
    binaries: tuple[str, ...] = ()  # Debian/Ubuntu: the binary packages the source builds (Ubuntu's OSV)


@dataclass(frozen=True)
class Advisory:
    id: str  # DSA-3029-1, PYSEC-2023-74, CVE-2024-0074, RHSA-2022:0011
    aliases: tuple[str, ...]  # other ids of the same problem (CVE ids first); one CVE = one finding
    summary: str
    source: Literal["osv", "nvd", "csaf"]
    severity: Severity = "unknown"
    cvss_score: float | None = None  # the base score of the best CVSS vector given
    cvss_vector: str | None = None
    published: str | None = None  # ISO 8601 as the record gives it
    modified: str | None = None
    affected: tuple[Affected, ...] = ()

    def key(self) -> str:
        """The id one problem is known by across feeds: its first CVE alias, else its own id."""
        return next((a for a in (self.id, *self.aliases) if a.startswith("CVE-")), self.id)


@dataclass(frozen=True)
class Finding:
    """An installed package an advisory affects."""

    advisory: Advisory
    installed: Installed
    affected: Affected
    fixed: str | None  # the version that fixes it for this package, if any
    also: tuple[str, ...] = ()  # other advisories of the same problem (same CVE) that matched too
    notes: tuple[str, ...] = field(default=())  # e.g. "matched by binary name: no source package known"
    problem: str | None = None  # the problem (CVE) it is about, where not its advisory's own key()

    def key(self) -> str:
        """The problem this finding is about: one CVE, one finding per package."""
        return self.problem or self.advisory.key()


def affected_to_json(affected: Affected) -> dict[str, Any]:
    data: dict[str, Any] = {
        "ecosystem": affected.ecosystem,
        "package": affected.package,
        "release": affected.release,
        "ranges": [{"kind": r.kind, "events": [list(e) for e in r.events]} for r in affected.ranges],
        "versions": list(affected.versions),
        "fixed": affected.fixed,
    }
    if affected.binaries:  # only then: a record without binaries keeps the content hash it had
        data["binaries"] = list(affected.binaries)
    return data


def affected_from_json(data: dict[str, Any]) -> Affected:
    return Affected(
        ecosystem=data["ecosystem"],
        package=data["package"],
        release=data.get("release"),
        ranges=tuple(Range(r["kind"], tuple((k, v) for k, v in r["events"])) for r in data.get("ranges", [])),
        versions=tuple(data.get("versions", [])),
        fixed=data.get("fixed"),
        binaries=tuple(data.get("binaries", [])),
    )


def advisory_to_json(advisory: Advisory) -> dict[str, Any]:
    """An advisory as the CLI sends it to the head (POST /api/v1/cve/advisories)."""
    return {
        "id": advisory.id,
        "aliases": list(advisory.aliases),
        "summary": advisory.summary,
        "source": advisory.source,
        "severity": advisory.severity,
        "cvss_score": advisory.cvss_score,
        "cvss_vector": advisory.cvss_vector,
        "published": advisory.published,
        "modified": advisory.modified,
        "affected": [affected_to_json(a) for a in advisory.affected],
    }


def advisory_from_json(data: dict[str, Any]) -> Advisory:
    return Advisory(
        id=data["id"],
        aliases=tuple(data.get("aliases", [])),
        summary=data.get("summary", ""),
        source=data["source"],
        severity=data.get("severity", "unknown"),
        cvss_score=data.get("cvss_score"),
        cvss_vector=data.get("cvss_vector"),
        published=data.get("published"),
        modified=data.get("modified"),
        affected=tuple(affected_from_json(a) for a in data.get("affected", [])),
    )
