"""NVD CVE API 2.0 records (https://nvd.nist.gov/developers/vulnerabilities) as `Advisory`.

The NVD names software by CPE, not by package; `CPE_PACKAGES` maps the few CPEs gpufleet can find on
a node to its own names (ecosystem `NVIDIA`). Everything else in a record's configurations is left
out: distribution packages and PyPI come better from OSV, which names packages as their ecosystems do.

How a `cpeMatch` becomes an `Affected` (release None: NVIDIA software has no distribution release):

- Only `vulnerable: true` matches count. Configurations are read as plain lists: an AND with a
  non-vulnerable platform ("driver ... running on a GeForce") is taken as met, and negated nodes are
  skipped; over-reporting a driver CVE is the safer mistake.
- A match whose CPE target_sw is another operating system (`windows`, ...) is skipped: gpufleet's
  nodes run Linux, and the NVIDIA driver's Windows branches have their own version numbers.
- `versionStartIncluding` X is `("introduced", X)`; `versionEndExcluding` Y is `("fixed", Y)`;
  `versionEndIncluding` Y is `("last_affected", Y)`; no start is `("introduced", "0")`.
- Approximation: OSV has no exclusive start, so `versionStartExcluding` X is also `("introduced", X)`:
  version X itself is reported affected though the NVD says it is not.
- A CPE naming one version (not `*` or `-`) adds that version to `versions`; the CPE's `update` field
  (`cuda_toolkit:10.1:update2`) is not part of it.
- Each version range becomes its own `Affected`, so `fixed` is the fix of that driver branch.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from gpufleet.assets.advisories.osv import CvssScore, cvss_base, severity_from_word, shorten
from gpufleet.assets.records import Advisory, Affected, Range, Severity

# (CPE vendor, CPE product) -> (gpufleet ecosystem, package name), for software gpufleet inventories.
CPE_PACKAGES: dict[tuple[str, str], tuple[str, str]] = {
    ("nvidia", "gpu_display_driver"): ("NVIDIA", "driver"),
    ("nvidia", "cuda_toolkit"): ("NVIDIA", "cuda-toolkit"),  # the name the agent reports
    ("nvidia", "container_toolkit"): ("NVIDIA", "container-toolkit"),
    ("nvidia", "gpu_operator"): ("NVIDIA", "gpu-operator"),
    ("nvidia", "data_center_gpu_manager"): ("NVIDIA", "dcgm"),
}
# CPE target_sw values naming an operating system other than Linux.
OTHER_OS_TARGETS = frozenset({"windows", "macos", "mac_os", "mac_os_x", "android", "iphone_os", "freebsd", "solaris"})
# Metric keys, best first: the highest CVSS version the record has is the one reported.
METRIC_KEYS = (("cvssMetricV40", 4), ("cvssMetricV31", 3), ("cvssMetricV30", 3), ("cvssMetricV2", 2))
ANY_VALUES = ("*", "-", "")  # CPE's ANY and NA: no single value


@dataclass(frozen=True)
class Cpe:
    """The fields of a CPE name that say what software it is (2.3 formatted string or 2.2 URI)."""

    part: str  # a: application, o: operating system, h: hardware
    vendor: str
    product: str
    version: str = "*"
    update: str = "*"
    target_sw: str = "*"
    fields: tuple[str, ...] = ()  # every field after the prefix, unescaped


def _split_cpe23(text: str) -> list[str]:
    """Split a CPE 2.3 formatted string on its unescaped colons, removing the escapes (`\\:` -> `:`)."""
    fields, current, chars = [], [], iter(text)
    for char in chars:
        if char == "\\":
            current.append(next(chars, ""))
        elif char == ":":
            fields.append("".join(current))
            current = []
        else:
            current.append(char)
    fields.append("".join(current))
    return fields


def parse_cpe(text: str) -> Cpe | None:
    """A CPE 2.3 name (`cpe:2.3:a:nvidia:gpu_display_driver:*:*:*:*:*:linux:*:*`) or 2.2 URI
    (`cpe:/o:redhat:rhel_aus:7.6::server`); None for anything else or a name without a product."""
    if text.startswith("cpe:2.3:"):
        fields = _split_cpe23(text)[2:]
        target_index = 8  # part vendor product version update edition language sw_edition target_sw
    elif text.startswith("cpe:/"):
        fields = text[len("cpe:/") :].split(":")
        target_index = -1  # 2.2 URIs have no target_sw field
    else:
        return None
    fields = [f.lower() for f in fields] + [""] * max(0, 11 - len(fields))
    if not fields[1] or not fields[2]:
        return None
    return Cpe(
        part=fields[0],
        vendor=fields[1],
        product=fields[2],
        version=fields[3] or "*",
        update=fields[4] or "*",
        target_sw=fields[target_index] if target_index > 0 else "*",
        fields=tuple(fields),
    )


def _fail(cve_id: object, message: str) -> ValueError:
    return ValueError(f"NVD record {cve_id!r}: {message}")


def _records(data: Mapping[str, Any]) -> list[Any]:
    """The CVE objects of an API response (`vulnerabilities: [{cve: ...}]`), a `{cve: ...}` wrapper or
    a bare CVE object (as the per-CVE files of NVD mirrors hold)."""
    if "vulnerabilities" in data:
        items = data["vulnerabilities"]
        if not isinstance(items, list) or not all(isinstance(i, Mapping) and "cve" in i for i in items):
            raise ValueError("NVD response: 'vulnerabilities' is not a list of {'cve': ...} objects")
        return [i["cve"] for i in items]
    if "cve" in data:
        return [data["cve"]]
    if str(data.get("id", "")).startswith("CVE-"):
        return [data]
    raise ValueError("not an NVD CVE API 2.0 record: no 'vulnerabilities', 'cve' or CVE 'id'")


def _description(cve: Mapping[str, Any]) -> str:
    descriptions = [d for d in cve.get("descriptions") or () if isinstance(d, Mapping)]
    english = next((d for d in descriptions if d.get("lang") == "en"), descriptions[0] if descriptions else {})
    return shorten(str(english.get("value") or ""))


def _metric_score(metric: Mapping[str, Any]) -> CvssScore | None:
    """A metric's score from its vector; the record's own number when the vector cannot be read."""
    data = metric.get("cvssData")
    if not isinstance(data, Mapping) or not isinstance(data.get("vectorString"), str):
        return None
    vector = data["vectorString"]
    scored = cvss_base(vector)
    if scored is None and isinstance(data.get("baseScore"), int | float):
        word = data.get("baseSeverity") or metric.get("baseSeverity")  # v2 keeps it outside cvssData
        scored = CvssScore(0, float(data["baseScore"]), severity_from_word(word), vector)
    return scored


def _severity(cve: Mapping[str, Any]) -> tuple[Severity, CvssScore | None]:
    """NVD's own (Primary) metric before a CNA's (Secondary), then the highest CVSS version."""
    metrics = cve.get("metrics")
    if not isinstance(metrics, Mapping):
        return "unknown", None
    candidates: list[tuple[bool, int, CvssScore]] = []
    for key, version in METRIC_KEYS:
        for metric in metrics.get(key) or ():
            scored = _metric_score(metric) if isinstance(metric, Mapping) else None
            if scored is not None:
                candidates.append((metric.get("type") == "Primary", version, scored))
    if not candidates:
        return "unknown", None
    best = max(candidates, key=lambda c: (c[0], c[1], c[2].score))[2]
    return best.severity, best


def _cpe_matches(cve: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    """Every cpeMatch of the record's configurations marked vulnerable, outside negated nodes."""
    for configuration in cve.get("configurations") or ():
        for node in (configuration.get("nodes") or ()) if isinstance(configuration, Mapping) else ():
            if not isinstance(node, Mapping) or node.get("negate"):
                continue
            for match in node.get("cpeMatch") or ():
                if isinstance(match, Mapping) and match.get("vulnerable") is True:
                    yield match


def _bounds(match: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """The version bounds of a cpeMatch as OSV events (see the module docstring for the exclusive start)."""
    start = match.get("versionStartIncluding") or match.get("versionStartExcluding")
    events = [("introduced", str(start or "0"))]
    if match.get("versionEndExcluding"):
        events.append(("fixed", str(match["versionEndExcluding"])))
    elif match.get("versionEndIncluding"):
        events.append(("last_affected", str(match["versionEndIncluding"])))
    return tuple(events)


def _match_affected(match: Mapping[str, Any]) -> Affected | None:
    """The gpufleet package and versions one cpeMatch affects; None for software gpufleet does not know."""
    cpe = parse_cpe(str(match.get("criteria") or ""))
    if cpe is None or cpe.target_sw in OTHER_OS_TARGETS:
        return None
    known = CPE_PACKAGES.get((cpe.vendor, cpe.product))
    if known is None:
        return None
    ecosystem, package = known
    if cpe.version not in ANY_VALUES:
        return Affected(ecosystem=ecosystem, package=package, versions=(cpe.version,))
    events = _bounds(match)
    fixed = next((version for kind, version in events if kind == "fixed"), None)
    return Affected(ecosystem=ecosystem, package=package, ranges=(Range("ECOSYSTEM", events),), fixed=fixed)


def _affected(cve: Mapping[str, Any]) -> tuple[Affected, ...]:
    """One Affected per version range, and one per package for the single versions CPEs name."""
    ranged: list[Affected] = []
    single: dict[tuple[str, str], list[str]] = {}
    for match in _cpe_matches(cve):
        found = _match_affected(match)
        if found is None:
            continue
        if found.versions:
            single.setdefault((found.ecosystem, found.package), []).extend(found.versions)
        else:
            ranged.append(found)
    versions = [Affected(e, p, versions=tuple(dict.fromkeys(v))) for (e, p), v in single.items()]
    return tuple(dict.fromkeys([*ranged, *versions]))  # configurations repeat matches: keep one


def _advisory(cve: object) -> Advisory:
    if not isinstance(cve, Mapping):
        raise _fail(None, f"'cve' is {type(cve).__name__}, not an object")
    cve_id = cve.get("id")
    if not isinstance(cve_id, str) or not cve_id.startswith("CVE-"):
        raise _fail(cve_id, "no CVE id")
    severity, cvss = _severity(cve)
    return Advisory(
        id=cve_id,
        aliases=(),
        summary=_description(cve),
        source="nvd",
        severity=severity,
        cvss_score=cvss.score if cvss else None,
        cvss_vector=cvss.vector if cvss else None,
        published=cve.get("published"),
        modified=cve.get("lastModified"),
        # A rejected CVE affects nothing, like a withdrawn OSV record.
        affected=() if cve.get("vulnStatus") == "Rejected" else _affected(cve),
    )


def parse_nvd(data: Mapping[str, Any]) -> list[Advisory]:
    """The CVEs of an NVD CVE API 2.0 response (or of one CVE object) as Advisories; ValueError for a
    document that is not one."""
    if not isinstance(data, Mapping):
        # A malformed document is a data error (ValueError) for the caller, whatever its Python type.
        raise ValueError(f"an NVD record is a JSON object, not {type(data).__name__}")  # noqa: TRY004
    return [_advisory(cve) for cve in _records(data)]
