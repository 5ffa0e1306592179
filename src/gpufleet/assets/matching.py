"""Which installed packages each advisory affects, with each ecosystem's own version rules.

The rules (OSV's, which NVD and CSAF records are converted to):

- An advisory's `affected` entry names an ecosystem, a package and, for a distribution, a release.
  A package matches only within its own ecosystem and release: an Ubuntu 22.04 advisory never touches
  an Ubuntu 20.04 node, a Debian one never an Ubuntu one.
- Debian and Ubuntu advisories name *source* packages (`glibc`, not `libc6`): a binary package is
  matched through its source package and the source version, and through the binary packages an
  advisory lists for its source (Ubuntu's OSV: `libc6`, `libc-bin`, ...), with its own version.
  Where only binary names are known (`apt list --installed`, `dpkg -l`, a 3-column dpkg-query) and
  the advisory lists no binaries (Debian's), the binary name is also tried as the source name and
  the finding says so; packages whose names differ are missed there, which the scan reports.
- RPM advisories mostly name binary packages, some (CSAF's source products) the source RPM: both
  names are tried where the list has the source RPM (`rpm -qa` with %{SOURCERPM}).
- A distribution package advised under another ecosystem (`assets.links`: the deb or rpm
  `nvidia-container-toolkit` is the Go module github.com/NVIDIA/nvidia-container-toolkit) is also
  judged against that ecosystem's advisories, with its upstream version; the finding says so.
- A version is affected when it is listed in `versions`, or falls in a range: events sorted by
  version, `introduced` opens, `fixed` closes (the fixed version itself is not affected),
  `last_affected` closes after itself, `limit` bounds the whole range. GIT ranges are not judged.
- One problem seen in several feeds (DSA-3029-1 and CVE-2014-3616) is one finding: findings of one
  package are grouped by the advisory's `key()` (its CVE), the most severe kept, the others in `also`.
  A notice that fixes several CVEs (USN-6409-1: CVE-2023-4527 and CVE-2023-4911) joins the finding
  of a CVE of its own that the package already has, rather than standing as another problem.

Verdicts are cached per (ecosystem, release, package, version), so a fleet of nodes built from a few
images is judged once per distinct package version, not once per node.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from packaging.utils import canonicalize_name

from gpufleet.assets.links import DEFAULT_LINKS, PackageLink, upstream_version
from gpufleet.assets.records import (
    ECOSYSTEMS,
    SEVERITIES,
    SOURCE_PACKAGE_DISTROS,
    SOURCE_RPM_DISTROS,
    Advisory,
    Affected,
    Distro,
    Finding,
    Installed,
    Range,
)
from gpufleet.assets.versions import InvalidVersion, scheme_of, sort_key

_RANK = {s: i for i, s in enumerate(reversed(SEVERITIES))}  # unknown 0 ... critical 5
BINARY_NAME_NOTE = "matched by binary name: the source package was not known"
# Index keys of the binary packages an advisory lists for its source: a prefix no package name has
# (Debian names are [a-z0-9+.-]), so they never meet a source name.
BINARY_PREFIX = "binary:"


def package_key(ecosystem: str, name: str) -> str:
    """Names as each ecosystem compares them: PyPI's normalized (PEP 503), the rest lower-case."""
    return canonicalize_name(name) if ecosystem == "PyPI" else name.lower()


def binary_key(name: str) -> str:
    """The index name of a binary package an advisory lists (see `BINARY_PREFIX`)."""
    return BINARY_PREFIX + name.lower()


def link_note(link: PackageLink, version: str) -> str:
    return f"advised as {link.ecosystem} {link.advised}: compared as version {version}"


def _range_verdict(rng: Range, scheme: str, version: str) -> tuple[bool, str | None]:
    """(affected, the first fixed version above `version`) for one OSV range."""
    key = sort_key(scheme, version)
    events = []
    for kind, value in rng.events:
        at = None if kind == "introduced" and value == "0" else sort_key(scheme, value)
        events.append((at, kind, value))
    # "0" sorts before everything; on equal versions a closing event comes after an opening one.
    events.sort(key=lambda e: (e[0] is not None, e[0] if e[0] is not None else 0, e[1] != "introduced"))
    affected = False
    for at, kind, _value in events:
        if kind == "introduced" and (at is None or key >= at):
            affected = True
        elif at is None:
            continue
        elif (kind == "fixed" and key >= at) or (kind == "last_affected" and key > at):
            affected = False
        elif kind == "limit" and key >= at:
            return False, None
    fixed = None
    if affected:
        above = [(at, value) for at, kind, value in events if kind == "fixed" and at is not None and at > key]
        fixed = min(above, key=lambda e: e[0])[1] if above else None
    return affected, fixed


def verdict(affected: Affected, version: str) -> tuple[bool, str | None]:
    """Is `version` affected by this entry, and which version fixes it. Raises InvalidVersion."""
    scheme = scheme_of(affected.ecosystem)
    fixed: str | None = None
    hit = version in affected.versions
    for rng in affected.ranges:
        if rng.kind == "GIT":
            continue
        in_range, range_fix = _range_verdict(rng, "semver" if rng.kind == "SEMVER" else scheme, version)
        if in_range:
            hit, fixed = True, fixed or range_fix
    if hit and fixed is None and affected.fixed is not None:
        try:  # an explicit version list with a fix named beside it
            if sort_key(scheme, affected.fixed) > sort_key(scheme, version):
                fixed = affected.fixed
        except InvalidVersion:
            pass
    return hit, fixed


TargetKey = tuple[str, str | None, str]  # ecosystem, release, package (as package_key compares it)


def affected_keys(affected: Affected) -> set[TargetKey]:
    """The keys one entry is indexed under: its package, and the binary packages it lists."""
    keys = {(affected.ecosystem, affected.release, package_key(affected.ecosystem, affected.package))}
    keys.update((affected.ecosystem, affected.release, binary_key(name)) for name in affected.binaries)
    return keys


def targets(advisory: Advisory) -> set[TargetKey]:
    """What an advisory's entries name: the keys it is indexed under."""
    return {key for affected in advisory.affected for key in affected_keys(affected)}


class AdvisoryIndex:
    """Advisories by (ecosystem, release, package) for lookups per installed package.

    `add_lazy` indexes an advisory by its keys alone and parses it (`load`) only when a package asks
    for one of them: a distribution's feed holds tens of thousands of records for every release and
    package it ever shipped, and a fleet runs a few of those releases and packages.
    """

    def __init__(self, advisories: Iterable[Advisory] = ()) -> None:
        self._entries: dict[TargetKey, list[tuple[Advisory, Affected]]] = defaultdict(list)
        self._lazy: dict[TargetKey, list[Callable[[], Advisory]]] = defaultdict(list)
        self.advisories = 0
        for advisory in advisories:
            self.add(advisory)

    def add(self, advisory: Advisory) -> None:
        self.advisories += 1
        for affected in advisory.affected:
            for key in affected_keys(affected):
                self._entries[key].append((advisory, affected))

    def add_lazy(self, keys: Iterable[TargetKey], load: Callable[[], Advisory]) -> None:
        """Index an advisory by `keys`; `load` (called at most once) gives the whole record."""
        self.advisories += 1
        once = _Once(load)
        for key in keys:
            self._lazy[key].append(once)

    def _entries_for(self, key: TargetKey) -> list[tuple[Advisory, Affected]]:
        pending = self._lazy.pop(key, None)
        if pending:
            entries = self._entries[key]
            for load in pending:
                advisory = load()
                entries += [(advisory, a) for a in advisory.affected if key in affected_keys(a)]
        return self._entries.get(key, [])

    def candidates(self, ecosystem: str, release: str | None, name: str) -> list[tuple[Advisory, Affected]]:
        """Entries naming `name` (a package, or a `binary_key`) in this ecosystem and release, or in
        every release."""
        if not name.startswith(BINARY_PREFIX):
            name = package_key(ecosystem, name)
        found = self._entries_for((ecosystem, release, name))
        if release is not None:
            found = found + self._entries_for((ecosystem, None, name))
        return found


class _Once:
    """A loader that runs once, however many keys share it."""

    def __init__(self, load: Callable[[], Advisory]) -> None:
        self._load: Callable[[], Advisory] | None = load
        self._value: Advisory | None = None

    def __call__(self) -> Advisory:
        if self._value is None and self._load is not None:
            self._value, self._load = self._load(), None
        assert self._value is not None  # noqa: S101 (set just above)
        return self._value


@dataclass
class ScanResult:
    findings: list[Finding] = field(default_factory=list)
    unjudged: list[tuple[Installed, str, str]] = field(default_factory=list)  # (package, advisory, why)
    packages: int = 0


_Hit = tuple[Advisory, Affected, str | None]
_Verdicts = tuple[list[_Hit], list[tuple[str, str]]]
_NOTHING: _Verdicts = ([], [])
_DISTRIBUTIONS = frozenset(e for e, scheme in ECOSYSTEMS.items() if scheme in ("deb", "rpm"))
_VerdictKey = tuple[str, str | None, str, str]  # ecosystem, release, name (or binary key), version
# What one package is looked up as: (verdict key, notes any finding through it carries).
_Lookup = tuple[_VerdictKey, tuple[str, ...]]
_NotedHit = tuple[Advisory, Affected, str | None, tuple[str, ...]]  # a hit and the notes of its lookup
_PackageVerdicts = tuple[list[_NotedHit], list[tuple[str, str]]]
_NOTHING_FOUND: _PackageVerdicts = ([], [])  # shared by every package nothing affects


class Matcher:
    """Judges installed packages against an index; `links` (assets.links) add the other ecosystems
    a distribution package is advised under."""

    def __init__(self, index: AdvisoryIndex, links: Iterable[PackageLink] = DEFAULT_LINKS) -> None:
        self.index = index
        self._cache: dict[_VerdictKey, _Verdicts] = {}
        # Per package (names, versions and release): everything found for it under all its names.
        self._by_package: dict[tuple[str | None, ...], _PackageVerdicts] = {}
        self._links: dict[str, list[PackageLink]] = defaultdict(list)
        for link in links:
            self._links[link.installed.lower()].append(link)

    def _judge(self, key: _VerdictKey) -> _Verdicts:
        ecosystem, release, name, version = key
        hits: list[_Hit] = []
        errors: list[tuple[str, str]] = []
        for advisory, affected in self.index.candidates(ecosystem, release, name):
            try:
                hit, fixed = verdict(affected, version)
            except InvalidVersion as exc:
                errors.append((advisory.id, str(exc)))
                continue
            if hit:
                hits.append((advisory, affected, fixed))
        verdicts = (hits, errors) if hits or errors else _NOTHING
        self._cache[key] = verdicts
        return verdicts

    def _lookups(self, package: Installed, release: str | None) -> list[_Lookup]:
        """Every name (and version) `package` may be advised under, first the surest."""
        ecosystem, name, version = package.ecosystem, package.name, package.version
        if ecosystem in SOURCE_PACKAGE_DISTROS:
            lookups: list[_Lookup] = [((ecosystem, release, binary_key(name), version), ())]
            if package.source_name:
                source = (ecosystem, release, package.source_name, package.source_version or version)
                lookups.insert(0, (source, ()))
            else:
                lookups.append(((ecosystem, release, name, version), (BINARY_NAME_NOTE,)))
        else:
            lookups = [((ecosystem, release, name, version), ())]
            if ecosystem in SOURCE_RPM_DISTROS and package.source_name and package.source_name != name:
                lookups.append(((ecosystem, release, package.source_name, version), ()))
        if ecosystem in _DISTRIBUTIONS:
            for link in self._links.get(name.lower(), ()):
                upstream = upstream_version(version, scheme_of(link.ecosystem))
                lookups.append(((link.ecosystem, None, link.advised, upstream), (link_note(link, upstream),)))
        return lookups

    def _judge_package(self, package: Installed, release: str | None) -> _PackageVerdicts:
        """Every advisory that affects `package` under any of its names (each advisory once, by the
        surest name that found it), and what could not be judged."""
        hits: list[_NotedHit] = []
        unjudged: list[tuple[str, str]] = []
        seen: set[str] = set()
        for key, notes in self._lookups(package, release):
            verdicts = self._cache.get(key)
            if verdicts is None:
                verdicts = self._judge(key)
            found, errors = verdicts
            unjudged += errors
            for advisory, affected, fixed in found:
                if advisory.id not in seen:  # one advisory found by two names counts once
                    seen.add(advisory.id)
                    hits.append((advisory, affected, fixed, notes))
        return (hits, unjudged) if hits or unjudged else _NOTHING_FOUND

    def scan(self, packages: Iterable[Installed], distro: Distro | None) -> ScanResult:
        # The hot loop of a fleet's evaluation (millions of packages): one dict lookup per package
        # once a package of the same names and versions has been judged, and nothing more for the
        # many that nothing affects.
        result = ScanResult()
        judged = self._by_package
        count = 0
        for package in packages:
            count += 1
            release = None
            if package.ecosystem in _DISTRIBUTIONS:
                if distro is None or distro.ecosystem != package.ecosystem:
                    continue  # a distribution package on a node of another distribution: nothing to say
                release = distro.release
            key = (
                package.ecosystem,
                release,
                package.name,
                package.version,
                package.source_name,
                package.source_version,
            )
            verdicts = judged.get(key)
            if verdicts is None:
                verdicts = judged[key] = self._judge_package(package, release)
            if verdicts is _NOTHING_FOUND:
                continue
            hits, errors = verdicts
            result.unjudged += [(package, advisory_id, why) for advisory_id, why in errors]
            if hits:
                result.findings += _grouped(package, hits)
        result.packages = count
        return result


def _cves(advisory: Advisory) -> list[str]:
    return [i for i in (advisory.id, *advisory.aliases) if i.startswith("CVE-")]


def _problems(hits: list[_NotedHit]) -> dict[str, list[int]]:
    """Hit indexes by problem: an advisory's `key()`, except that a record of several CVEs (a notice
    fixing many) joins the problem of one of its CVEs that a record of its own already names."""
    single = {advisory.key() for advisory, *_ in hits if len(_cves(advisory)) <= 1}
    problems: dict[str, list[int]] = defaultdict(list)
    for index, (advisory, *_) in enumerate(hits):
        joined = next((cve for cve in _cves(advisory) if cve in single), None)
        problems[joined or advisory.key()].append(index)
    return problems


def _grouped(package: Installed, hits: list[_NotedHit]) -> list[Finding]:
    """One finding per problem for this package: the most severe advisory, the others named in `also`."""
    findings = []
    for problem, indexes in _problems(hits).items():
        same = sorted(
            (hits[i] for i in indexes), key=lambda h: (-_RANK[h[0].severity], -(h[0].cvss_score or 0.0), h[0].id)
        )
        advisory, affected, fixed, notes = same[0]
        fixed = fixed or next((f for _, _, f, _ in same if f), None)
        also = tuple(sorted({h[0].id for h in same[1:]} - {advisory.id}))
        findings.append(Finding(advisory, package, affected, fixed, also, notes, problem))
    return findings
