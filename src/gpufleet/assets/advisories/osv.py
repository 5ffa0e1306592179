"""OSV records (https://ossf.github.io/osv-schema/) as `Advisory`.

What the parser decides, beyond copying fields:

- `aliases` are the record's `aliases` and `upstream` (Ubuntu's CVE-level records put the CVE in
  `upstream`), CVE ids first; `related` ids are other problems and stay out, except what names the
  record's own problem. An id that embeds a CVE (`UBUNTU-CVE-2023-4911`, as a record's own id or in
  `upstream`) also gives that CVE; an Ubuntu CVE-level record keeps the CVE and the notices (`USN-...`)
  it lists in `related`, where Ubuntu has put them in some years.
- `summary` is `summary`, else the first non-empty line of `details`, at most 300 characters.
- Severity: the best CVSS vector in `severity` (highest CVSS version, then highest score) gives the
  score and severity, computed by the `cvss` library rather than trusted from elsewhere; without one,
  a word (Ubuntu's `medium` or `ecosystem_specific.ubuntu_priority`, GitHub's
  `database_specific.severity` `MODERATE`, ...) gives the severity and no score.
- Debian/Ubuntu entries keep the binary packages their source builds (Ubuntu's
  `ecosystem_specific.binaries`), so a list of binary names (`apt list`) is matched through them.
- A record is checked as far as it is read: `modified` (required by OSV) and the other times must be
  RFC 3339 date-times, every severity entry needs its type and score and a CVSS vector must be valid,
  every range needs events with versions. A truncated or hand-broken file is refused with what is
  wrong, never read as a shorter record that lost its severity or its fix.
- `package.ecosystem` "Ubuntu:Pro:14.04:LTS" becomes ecosystem `Ubuntu`, release `14.04`
  (`split_ecosystem`).
- A withdrawn record keeps its ids and text but affects nothing (`affected=()`), so it can replace
  an earlier version of itself without matching anything.

The CVSS and severity-word helpers here are shared with the NVD and CSAF parsers.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cvss import CVSS2, CVSS3, CVSS4, CVSSError

from gpufleet.assets.records import ECOSYSTEMS, SEVERITIES, Advisory, Affected, Range, Severity

SUMMARY_MAX = 300
EVENT_KINDS = ("introduced", "fixed", "last_affected", "limit")
# Range kinds whose versions the ecosystem orders; GIT ranges name commits, which nothing compares.
VERSION_RANGE_KINDS = ("ECOSYSTEM", "SEMVER")
CVSS_TYPES = ("CVSS_V2", "CVSS_V3", "CVSS_V4")

# Severity words advisories use (lower-cased) on gpufleet's scale: CVSS qualitative ratings, Ubuntu
# priorities, Debian urgencies, Red Hat impacts, GitHub's MODERATE.
SEVERITY_WORDS: dict[str, Severity] = {
    "critical": "critical",
    "important": "high",
    "high": "high",
    "moderate": "medium",
    "medium": "medium",
    "low": "low",
    "negligible": "low",
    "unimportant": "low",
    "none": "none",
}


@dataclass(frozen=True)
class CvssScore:
    """One CVSS vector's base score and the qualitative severity the CVSS specification gives it."""

    version: int  # 2, 3 or 4
    score: float
    severity: Severity
    vector: str


def severity_from_word(word: object) -> Severity:
    """A severity word as gpufleet's scale; anything else (`untriaged`, a number, None) is unknown."""
    if not isinstance(word, str):
        return "unknown"
    return SEVERITY_WORDS.get(word.strip().lower(), "unknown")


def cvss_version(vector: str) -> int:
    """The CVSS version a vector is written in: v3 and v4 vectors say so, v2 vectors have no prefix."""
    if vector.startswith("CVSS:4."):
        return 4
    if vector.startswith("CVSS:3."):
        return 3
    return 2


def cvss_base(vector: str) -> CvssScore | None:
    """The base score and severity of a CVSS v2, v3.x or v4 vector; None for a malformed vector (the
    NVD and CSAF parsers then fall back on the score the record states; OSV refuses the record)."""
    vector = vector.strip()
    version = cvss_version(vector)
    try:
        if version == 4:
            v4 = CVSS4(vector)
            score, word = v4.base_score, v4.severity
        elif version == 3:
            v3 = CVSS3(vector)
            score, word = v3.scores()[0], v3.severities()[0]
        else:
            v2 = CVSS2(vector)
            score, word = v2.scores()[0], v2.severities()[0]
    except (CVSSError, ValueError, KeyError, IndexError):
        return None
    return CvssScore(version, float(score), severity_from_word(word), vector)


def best_cvss(vectors: Iterable[str]) -> CvssScore | None:
    """The score of the highest CVSS version given, the highest score among vectors of that version."""
    scored = [s for s in (cvss_base(v) for v in vectors) if s is not None]
    return max(scored, key=lambda s: (s.version, s.score), default=None)


def shorten(text: str, limit: int = SUMMARY_MAX) -> str:
    """The first non-empty line of a text, cut to `limit` characters (ending with '…' when cut)."""
    line = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return line if len(line) <= limit else line[: limit - 1].rstrip() + "…"


_RELEASE = re.compile(r"v?(\d+(?:\.\d+)*)")


def split_ecosystem(text: str) -> tuple[str, str | None]:
    """OSV's `Debian:7`, `Ubuntu:Pro:14.04:LTS`, `Red Hat:enterprise_linux:9::appstream`, `PyPI` as
    (ecosystem, release): the release is the first version-looking part, without qualifiers such as
    `Pro` and `LTS` or Alpine's leading `v`; for the RPM distributions only the major version (RHEL
    advisories hold for a major release: `rhel_aus:8.4` is release `8`). When no part looks like a
    version the rest is kept as the release, so an unknown suffix narrows the match instead of
    widening it to every release."""
    name, _, rest = text.partition(":")
    if not rest:
        return name, None
    for part in rest.split(":"):
        if found := _RELEASE.fullmatch(part):
            release = found.group(1)
            if ECOSYSTEMS.get(name) == "rpm":
                release = release.split(".")[0]
            return name, release
    return name, rest


def version_text(value: object, where: str) -> str:
    """A version from a record as text. YAML reads an unquoted `2.10` as the float 2.1, which no
    longer says which version was meant: such a record must be loaded with
    `gpufleet.assets.advisories.load` (which keeps YAML scalars as text), not guessed at. An empty
    version (a YAML `fixed:` with nothing after it) is a broken record."""
    if isinstance(value, str) and value.strip():
        return value
    if value is None or isinstance(value, str):
        raise ValueError(f"{where}: a version is empty (is the file cut short?)")
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)  # an integer loses nothing: 0, 10
    raise ValueError(
        f"{where}: version {value!r} is not text (a YAML number?); load YAML with "
        "gpufleet.assets.advisories.load, which keeps versions as written"
    )


# RFC 3339 date-time, as OSV requires for `modified`, `published` and `withdrawn`.
_DATE_TIME = re.compile(r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:[Zz]|[+-]\d{2}:\d{2})")
# An id that names one CVE inside another feed's id: UBUNTU-CVE-2023-4911, DEBIAN-CVE-2024-1234.
_EMBEDDED_CVE = re.compile(r"[A-Z]+-(CVE-\d{4}-\d+)")


def _fail(record_id: object, message: str) -> ValueError:
    return ValueError(f"OSV record {record_id!r}: {message}")


def _list(data: Mapping[str, Any], key: str, record_id: object) -> Sequence[Any]:
    """A list field, absent or null meaning empty; any other type is a malformed record."""
    value = data.get(key)
    if value is None:
        return ()
    if not isinstance(value, list):
        raise _fail(record_id, f"{key!r} is {type(value).__name__}, not a list")
    return value


def _texts(data: Mapping[str, Any], key: str, record_id: object) -> list[str]:
    values = _list(data, key, record_id)
    if not all(isinstance(v, str) for v in values):
        raise _fail(record_id, f"{key!r} holds something other than text")
    return list(values)


def cve_first(ids: Iterable[str], own_id: str) -> tuple[str, ...]:
    """Ids without duplicates or the record's own id, CVE ids first, otherwise in the given order."""
    unique = [i for i in dict.fromkeys(ids) if i != own_id]
    return tuple(sorted(unique, key=lambda i: not i.startswith("CVE-")))


def _range(data: object, record_id: object) -> Range:
    if not isinstance(data, Mapping) or not isinstance(data.get("type"), str):
        raise _fail(record_id, f"range {data!r} has no type")
    events: list[tuple[str, str]] = []
    raw_events = _list(data, "events", record_id)
    if not raw_events:
        raise _fail(record_id, f"a {data['type']} range has no events")
    for event in raw_events:
        if not isinstance(event, Mapping):
            raise _fail(record_id, f"range event {event!r} is not an object")
        # OSV may grow event kinds; one this code does not know is left out rather than guessed at.
        events.extend((kind, version_text(event[kind], str(record_id))) for kind in EVENT_KINDS if kind in event)
    return Range(kind=data["type"], events=tuple(events))


def first_fixed(ranges: Iterable[Range]) -> str | None:
    """The first `fixed` event of the first ECOSYSTEM or SEMVER range (a GIT fix is a commit)."""
    for found in ranges:
        if found.kind in VERSION_RANGE_KINDS:
            return next((version for kind, version in found.events if kind == "fixed"), None)
    return None


def _affected(data: object, record_id: object) -> Affected | None:
    if not isinstance(data, Mapping):
        raise _fail(record_id, f"affected entry {data!r} is not an object")
    package = data.get("package")
    if package is None:
        return None  # an entry with only GIT ranges names a repository, not a package
    if not isinstance(package, Mapping) or not package.get("ecosystem") or not package.get("name"):
        raise _fail(record_id, f"affected package {package!r} needs an ecosystem and a name")
    ecosystem, release = split_ecosystem(str(package["ecosystem"]))
    ranges = tuple(_range(r, record_id) for r in _list(data, "ranges", record_id))
    versions = tuple(version_text(v, str(record_id)) for v in _list(data, "versions", record_id))
    return Affected(
        ecosystem=ecosystem,
        package=str(package["name"]),
        release=release,
        ranges=ranges,
        versions=versions,
        fixed=first_fixed(ranges),
        binaries=_binaries(data, record_id),
    )


def _ecosystem_specific(data: Mapping[str, Any], record_id: object) -> Mapping[str, Any]:
    value = data.get("ecosystem_specific")
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise _fail(record_id, f"ecosystem_specific is {type(value).__name__}, not an object")
    return value


def _binaries(data: Mapping[str, Any], record_id: object) -> tuple[str, ...]:
    """The binary packages an Ubuntu entry's source builds: ecosystem_specific.binaries, each
    {"binary_name": ..., "binary_version": ...}."""
    names = []
    for entry in _list(_ecosystem_specific(data, record_id), "binaries", record_id):
        name = entry.get("binary_name") if isinstance(entry, Mapping) else None
        if not isinstance(name, str) or not name.strip():
            raise _fail(record_id, f"a binary package {entry!r} has no binary_name")
        names.append(name.strip())
    return tuple(dict.fromkeys(names))


def _severity_entries(data: Mapping[str, Any], record_id: object) -> list[tuple[str, str]]:
    """(type, score) of the record's `severity` entries, then those of its affected packages (schema
    1.4 and later). An entry without its type or score is a broken record, not one to skip."""
    entries = list(_list(data, "severity", record_id))
    for affected in _list(data, "affected", record_id):
        if isinstance(affected, Mapping):
            entries.extend(_list(affected, "severity", record_id))
    found = []
    for entry in entries:
        kind = entry.get("type") if isinstance(entry, Mapping) else None
        score = entry.get("score") if isinstance(entry, Mapping) else None
        if not isinstance(kind, str) or not isinstance(score, str) or not kind.strip() or not score.strip():
            raise _fail(record_id, f"severity entry {entry!r} needs a type and a score")
        found.append((kind, score))
    return found


def _cvss_scores(entries: list[tuple[str, str]], record_id: object) -> list[CvssScore]:
    """Every CVSS vector's score; a vector the CVSS specification does not accept is an error."""
    scores = []
    for kind, vector in entries:
        if kind in CVSS_TYPES:
            scored = cvss_base(vector)
            if scored is None:
                raise _fail(record_id, f"{kind} vector {vector!r} is not a valid CVSS vector")
            scores.append(scored)
    return scores


def _severity(data: Mapping[str, Any], record_id: object) -> tuple[Severity, CvssScore | None]:
    entries = _severity_entries(data, record_id)
    best = max(_cvss_scores(entries, record_id), key=lambda s: (s.version, s.score), default=None)
    if best is not None:
        return best.severity, best
    words: list[object] = [score for kind, score in entries if kind not in CVSS_TYPES]
    database_specific = data.get("database_specific")
    if isinstance(database_specific, Mapping):
        words.append(database_specific.get("severity"))
    # Ubuntu's priority of the CVE, per release: the highest of them.
    priorities = [
        _ecosystem_specific(a, record_id).get("ubuntu_priority")
        for a in _list(data, "affected", record_id)
        if isinstance(a, Mapping)
    ]
    ranked = sorted((s for s in map(severity_from_word, priorities) if s != "unknown"), key=SEVERITIES.index)
    words.extend(ranked[:1])
    return next((s for s in map(severity_from_word, words) if s != "unknown"), "unknown"), None


def _time(data: Mapping[str, Any], key: str, record_id: object, *, required: bool = False) -> str | None:
    """A timestamp as the record gives it, checked to be an RFC 3339 date-time (a cut one is an
    error); a YAML loader that made it a datetime gets it back as ISO text."""
    value = data.get(key)
    if value is None:
        if required:
            raise _fail(record_id, f"no {key!r} time (OSV requires one; is the file cut short?)")
        return None
    isoformat = getattr(value, "isoformat", None)
    if callable(isoformat):
        return str(isoformat())
    text = str(value).strip()
    try:
        valid = _DATE_TIME.fullmatch(text) is not None and datetime.fromisoformat(text) is not None
    except ValueError:
        valid = False
    if not valid:
        raise _fail(record_id, f"{key!r} is {text!r}, not an RFC 3339 date-time")
    return text


def _aliases(data: Mapping[str, Any], record_id: str) -> tuple[str, ...]:
    """`aliases` and `upstream`, the CVEs ids embed, and what `related` says of the same problem."""
    ids = _texts(data, "aliases", record_id) + _texts(data, "upstream", record_id)
    related = _texts(data, "related", record_id)
    own_cve = _EMBEDDED_CVE.fullmatch(record_id)
    if own_cve:
        # UBUNTU-CVE-2023-4911 is CVE-2023-4911; Ubuntu lists that CVE and its notices in `related`.
        ids = [own_cve[1], *ids]
        ids += [i for i in related if i == own_cve[1] or (record_id.startswith("UBUNTU-") and i.startswith("USN-"))]
    embedded = [found[1] for i in ids if (found := _EMBEDDED_CVE.fullmatch(i))]
    return cve_first([*ids, *embedded], record_id)


def parse_osv(data: Mapping[str, Any]) -> Advisory:
    """One OSV record as an Advisory; ValueError, naming the record, for one that is not OSV."""
    if not isinstance(data, Mapping):
        # A malformed document is a data error (ValueError) for the caller, whatever its Python type.
        raise ValueError(f"an OSV record is a JSON object, not {type(data).__name__}")  # noqa: TRY004
    record_id = data.get("id")
    if not isinstance(record_id, str) or not record_id:
        raise _fail(record_id, "no id: not an OSV record")
    withdrawn = data.get("withdrawn")
    if "affected" not in data and not withdrawn:
        raise _fail(record_id, "neither 'affected' nor 'withdrawn': not an OSV record")
    entries = [_affected(a, record_id) for a in _list(data, "affected", record_id)]
    severity, cvss = _severity(data, record_id)
    modified = _time(data, "modified", record_id, required=True)
    published = _time(data, "published", record_id)
    if withdrawn is not None:
        _time(data, "withdrawn", record_id)
    return Advisory(
        id=record_id,
        aliases=_aliases(data, record_id),
        summary=shorten(str(data.get("summary") or data.get("details") or "")),
        source="osv",
        severity=severity,
        cvss_score=cvss.score if cvss else None,
        cvss_vector=cvss.vector if cvss else None,
        published=published,
        modified=modified,
        # A withdrawn record affects nothing: its packages are kept out so it matches nothing.
        affected=() if withdrawn else tuple(dict.fromkeys(a for a in entries if a is not None)),
    )
