"""Reading advisories from files: one JSON or YAML document, a directory of them (recursively, in name
order), or a zip archive of them as OSV publishes each ecosystem
(https://osv-vulnerabilities.storage.googleapis.com/<ECOSYSTEM>/all.zip).

Each document's format is told from its shape (`detect_format`): CSAF has `document.csaf_version`,
NVD has `vulnerabilities: [{cve: ...}]`, `cve`, or a CVE `id` with `descriptions`/`configurations`,
OSV has `id` and `affected` or `withdrawn`. Anything else, and anything that is not valid JSON or
YAML, raises `AdvisoryError` naming the file (and archive member) and what is wrong.

YAML is read with every scalar as text (but null): an unquoted `versions: [2.10]` stays "2.10"
instead of becoming the float 2.1, and dates stay as written.

A file cut short is refused, naming it: JSON then does not parse; YAML often still does, so a YAML
document must end with a line break (a cut inside a line is seen) and must not end on a key without
its value (`severity:`), and the OSV parser refuses a record without its required `modified` time, a
severity entry without its score, or a broken CVSS vector. What no reader can see is a YAML file cut
exactly at a line end after its last required field: it reads as a shorter, valid record.
"""

from __future__ import annotations

import json
import re
import zipfile
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from gpufleet.assets.advisories.csaf import parse_csaf
from gpufleet.assets.advisories.nvd import parse_nvd
from gpufleet.assets.advisories.osv import parse_osv
from gpufleet.assets.records import Advisory

JSON_SUFFIXES = (".json",)
YAML_SUFFIXES = (".yaml", ".yml")
DOCUMENT_SUFFIXES = JSON_SUFFIXES + YAML_SUFFIXES
ARCHIVE_SUFFIXES = (".zip",)


class AdvisoryError(ValueError):
    """A file, or an archive member, that is no advisory gpufleet can read; the message names it."""


class _TextLoader(yaml.SafeLoader):
    """SafeLoader that resolves no plain scalar to a number, boolean or date: versions stay as written."""


_TextLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag == "tag:yaml.org,2002:null"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _is_csaf(data: Mapping[str, Any]) -> bool:
    document = data.get("document")
    return isinstance(document, Mapping) and "csaf_version" in document


def _is_nvd(data: Mapping[str, Any]) -> bool:
    items = data.get("vulnerabilities")
    if isinstance(items, list):
        # An API response with no results is still one when it says so (format NVD_CVE).
        entries = all(isinstance(i, Mapping) and "cve" in i for i in items)
        return entries and (bool(items) or data.get("format") == "NVD_CVE")
    if isinstance(data.get("cve"), Mapping):
        return True
    described = "configurations" in data or "descriptions" in data
    return str(data.get("id", "")).startswith("CVE-") and "affected" not in data and described


def _is_osv(data: Mapping[str, Any]) -> bool:
    return "id" in data and ("affected" in data or "withdrawn" in data)


# Tried in this order: a CSAF document also has `vulnerabilities`, an OSV record may have a CVE id.
_FORMATS = (("csaf", _is_csaf), ("nvd", _is_nvd), ("osv", _is_osv))


def detect_format(data: object) -> str | None:
    """`csaf`, `nvd` or `osv` for a document of that shape; None for anything else."""
    if not isinstance(data, Mapping):
        return None
    return next((name for name, test in _FORMATS if test(data)), None)


def parse_document(data: object, origin: str) -> list[Advisory]:
    """The advisories of one decoded document, whatever its format; AdvisoryError naming `origin`."""
    kind = detect_format(data)
    if kind is None or not isinstance(data, Mapping):
        keys = ", ".join(sorted(map(str, data)))[:200] if isinstance(data, Mapping) else type(data).__name__
        raise AdvisoryError(f"{origin}: not an OSV, NVD or CSAF advisory (found: {keys or 'an empty object'})")
    try:
        if kind == "csaf":
            return parse_csaf(data)
        if kind == "nvd":
            return parse_nvd(data)
        return [parse_osv(data)]
    except ValueError as error:
        raise AdvisoryError(f"{origin}: {error}") from error


# The last line of a YAML document cut after a key: `severity:`, `- fixed:`, `details: |`, or `-`.
_DANGLING = re.compile(r"\s*(?:-\s*|(?:-\s+)?[^#\s][^#]*?:\s*(?:[|>][-+0-9]*)?\s*)")


def _check_yaml_end(text: str, origin: str) -> None:
    """Refuse YAML that ends the way a cut file does (see the module docstring)."""
    if text and not text.endswith(("\n", "\r")):
        raise AdvisoryError(f"{origin}: the YAML does not end with a line break: the file looks cut short")
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if lines and _DANGLING.fullmatch(lines[-1]):
        raise AdvisoryError(
            f"{origin}: the YAML ends with {lines[-1].strip()!r} and no value after it: the file looks cut short"
        )


def _decode(raw: bytes, name: str, origin: str) -> Any:
    """A document's bytes as data: YAML for .yaml/.yml names, JSON otherwise."""
    try:
        if name.lower().endswith(YAML_SUFFIXES):
            text = raw.decode("utf-8")
            _check_yaml_end(text, origin)
            return yaml.load(text, Loader=_TextLoader)  # noqa: S506 - a SafeLoader
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, yaml.YAMLError) as error:
        kind = "YAML" if name.lower().endswith(YAML_SUFFIXES) else "JSON"
        raise AdvisoryError(f"{origin}: not valid {kind}: {error}") from error


def _document(raw: bytes, name: str, origin: str) -> Iterator[tuple[str, Advisory]]:
    for advisory in parse_document(_decode(raw, name, origin), origin):
        yield origin, advisory


def _load_zip(path: Path) -> Iterator[tuple[str, Advisory]]:
    """Every JSON/YAML member of a zip, in name order, one member in memory at a time (OSV's PyPI
    archive holds tens of thousands)."""
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as error:
        raise AdvisoryError(f"{path}: not a readable zip archive: {error}") from error
    with archive:
        members = sorted(
            (m for m in archive.infolist() if not m.is_dir() and m.filename.lower().endswith(DOCUMENT_SUFFIXES)),
            key=lambda m: m.filename,
        )
        for member in members:
            origin = f"{path}:{member.filename}"
            try:
                raw = archive.read(member)
            except (zipfile.BadZipFile, OSError) as error:
                raise AdvisoryError(f"{origin}: cannot read the archive member: {error}") from error
            yield from _document(raw, member.filename, origin)


def _load_file(path: Path) -> Iterator[tuple[str, Advisory]]:
    suffix = path.suffix.lower()
    if suffix in ARCHIVE_SUFFIXES:
        yield from _load_zip(path)
        return
    if suffix not in DOCUMENT_SUFFIXES:
        raise AdvisoryError(f"{path}: not an advisory file (expected .json, .yaml, .yml or .zip)")
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise AdvisoryError(f"{path}: cannot read: {error}") from error
    yield from _document(raw, path.name, str(path))


def load_path(path: Path) -> Iterator[tuple[str, Advisory]]:
    """(origin, advisory) for every advisory in a file, a zip archive or a directory tree; the origin
    is the file's path, or `archive.zip:member.json`. In a directory, files of other types (a
    README) are skipped; named directly, they raise AdvisoryError."""
    if path.is_dir():
        for file in sorted(p for p in path.rglob("*") if p.is_file()):
            if file.suffix.lower() in DOCUMENT_SUFFIXES + ARCHIVE_SUFFIXES:
                yield from _load_file(file)
        return
    if not path.exists():
        raise AdvisoryError(f"{path}: no such file or directory")
    yield from _load_file(path)


def load_paths(paths: Iterable[Path]) -> Iterator[tuple[str, Advisory]]:
    """`load_path` over several paths, in the order given."""
    for path in paths:
        yield from load_path(path)
