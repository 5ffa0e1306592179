"""Read what software a machine has installed from the text its package tools print.

Pure parsers (standard library, `packaging` and `python-debian` only): the agent runs them on its own
node, and the offline `gpufleet cve scan` runs them on a file someone saved. Accepted formats:

==================  ===========================================================================================
kind                what produces it
==================  ===========================================================================================
dpkg-status         /var/lib/dpkg/status (RFC 822 stanzas; source packages from `Source:`)
dpkg-query          dpkg-query -W -f='${Package}\\t${Version}\\t${Architecture}\\t${source:Package}\\t
                    ${source:Version}[\\t${db:Status-Abbrev}]\\n' (5 or 6 tab-separated columns)
dpkg-query-3col     dpkg-query -W -f='${Package}\\t${Version}\\t${Architecture}\\n' (binary names only)
dpkg-query-source   dpkg-query -W -f='${binary:Package} ${source:Package} ${Version}\\n' (space-separated)
dpkg-l              dpkg -l (the table, with or without its header; binary names only)
apt-list            apt list --installed (binary names only)
rpm-qa              rpm -qa --qf '%{NAME}\\t%{EPOCHNUM}:%{VERSION}-%{RELEASE}\\t%{ARCH}[\\t%{SOURCERPM}]\\n'
                    (see RPM_QUERY_FORMAT; with the 4th column, packages keep their source RPM's name)
rpm-nevra           plain rpm -qa (name-version-release.arch; the epoch is not shown, so it is unknown)
pip-freeze          pip freeze
pip-list-json       pip list --format=json
gpufleet-json       gpufleet's own export (`export_json`, format "gpufleet-software/1")
==================  ===========================================================================================

Versions are kept as the package manager spells them (Debian `1:1.16.5-1.3ubuntu1` keeps its epoch),
except that an RPM epoch of 0 is dropped: `0:5.1.8-6.el9` and `5.1.8-6.el9` are the same version and
advisories write the latter.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)

from gpufleet.assets.records import ECOSYSTEMS, SOURCE_PACKAGE_DISTROS, Distro, Installed

EXPORT_FORMAT = "gpufleet-software/1"

# The dpkg-query format the agent runs: the 5 columns of the documented format plus the package's
# state, because `dpkg-query -W` also lists removed packages whose configuration files remain ("rc").
DPKG_QUERY_FORMAT = (
    "${Package}\\t${Version}\\t${Architecture}\\t${source:Package}\\t${source:Version}\\t${db:Status-Abbrev}\\n"
)
# EPOCHNUM prints 0 where a package has no epoch (EPOCH would print "(none)"), so every line has E:V-R.
# SOURCERPM ("glibc-2.34-60.el9.src.rpm") names the source package some advisories name.
RPM_QUERY_FORMAT = "%{NAME}\\t%{EPOCHNUM}:%{VERSION}-%{RELEASE}\\t%{ARCH}\\t%{SOURCERPM}\\n"

ACCEPTED = (
    "dpkg-query -W output, /var/lib/dpkg/status, dpkg -l, apt list --installed, "
    "rpm -qa (plain or with gpufleet's --qf), pip freeze, pip list --format=json, or a gpufleet-software/1 JSON export"
)
DISTRO_HINT = "give --distro ubuntu:22.04 (or debian:12, rocky:9, almalinux:9, rhel:9)"

# dpkg states in which a package's files are on disk. "config-files" (removed, configuration kept) and
# "not-installed" are left out; so is "half-installed", whose files may be partly gone.
_DPKG_PRESENT = {"installed", "unpacked", "half-configured", "triggers-awaiting", "triggers-pending"}
# The same states as the second letter of ${db:Status-Abbrev}.
_DPKG_PRESENT_ABBREV = set("iUFWt")

# Architecture spellings only one family uses: how a 3-column list tells dpkg from rpm.
_DEB_ONLY_ARCHES = {"all", "amd64", "arm64", "armhf", "armel", "ppc64el", "riscv64", "mips64el"}
_RPM_ONLY_ARCHES = {"noarch", "x86_64", "aarch64", "i686", "ppc64le", "(none)"}

# "adduser/focal,now 3.118ubuntu2 all [installed]" - the suite list may be empty ("/now" is "now").
_APT_LINE = re.compile(
    r"^(?P<name>[^/\s]+)/(?P<suites>\S*)\s+(?P<version>\S+)\s+(?P<arch>\S+)(?:\s+\[(?P<flags>[^\]]*)\])?$"
)
# A pip requirement's name (PEP 508): letters and digits, with . _ - inside.
_PIP_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_PIP_PINNED = re.compile(rf"^(?P<name>{_PIP_NAME})\s*===?\s*(?P<version>\S+)$")
_PIP_DIRECT = re.compile(rf"^(?P<name>{_PIP_NAME})(?:\[[^\]]*\])?\s+@\s+(?P<url>\S+)$")
# A row of `dpkg -l`: desired action, status and error flags (the error flag is blank or R), the name
# (`libc6:amd64` for a multi-arch package), version, architecture and description.
_DPKG_L_ROW = re.compile(
    r"^(?P<flags>[uihrp][ncHUFWti][ R]?)\s+(?P<name>[a-z0-9][a-z0-9+.-]*(?::[a-z0-9-]+)?)\s+"
    r"(?P<version>[A-Za-z0-9.+~:-]+)\s+(?P<arch>[a-z0-9-]+)(?:\s+.*)?$"
)
# Its header: "Desired=...", "| Status=...", "|/ Err?=...", "||/ Name ...", "+++-====...".
_DPKG_L_HEADER = ("Desired=", "|", "+++-")
# `dpkg-query -W -f='${binary:Package} ${source:Package} ${Version}\n'`: three space-separated
# fields, the last a Debian version (digits first, after an optional epoch).
_DPKG_SOURCE_ROW = re.compile(
    r"^(?P<name>[a-z0-9][a-z0-9+.-]*(?::[a-z0-9-]+)?) (?P<source>[a-z0-9][a-z0-9+.-]*)"
    r" (?P<version>(?:\d+:)?\d[A-Za-z0-9.+~:-]*)$"
)
# name-version-release.arch; the name may itself contain dashes, so version and release are the last two.
_NEVRA = re.compile(r"^(?P<name>\S+)-(?P<version>[^-\s]+)-(?P<release>[^-\s]+)\.(?P<arch>[A-Za-z0-9_]+)$")

# Ubuntu codenames, for derivatives (Linux Mint, elementary) whose own VERSION_ID is not Ubuntu's.
_UBUNTU_CODENAMES = {
    "xenial": "16.04",
    "bionic": "18.04",
    "focal": "20.04",
    "jammy": "22.04",
    "noble": "24.04",
    "oracular": "24.10",
    "plucky": "25.04",
    "questing": "25.10",
}
# os-release IDs and --distro spellings -> the ecosystem names advisories use (records.ECOSYSTEMS).
_DISTRO_IDS = {
    "ubuntu": "Ubuntu",
    "debian": "Debian",
    "rocky": "Rocky Linux",
    "rockylinux": "Rocky Linux",
    "rocky linux": "Rocky Linux",
    "almalinux": "AlmaLinux",
    "alma": "AlmaLinux",
    "rhel": "Red Hat",
    "redhat": "Red Hat",
    "red hat": "Red Hat",
}


@dataclass
class InventoryFile:
    """What `detect_and_parse` made of one file.

    `binary_names_only`: the format names binary packages but not their source packages (apt list, a
    3-column dpkg-query), so Debian/Ubuntu advisories, which name source packages, can only be tried by
    binary name; a scan must say so. `notes` say what was left out and why.
    """

    kind: str
    packages: list[Installed]
    distro: Distro | None
    binary_names_only: bool
    notes: list[str] = field(default_factory=list)


# -- distributions ---------------------------------------------------------------------------------


def _unquote(value: str) -> str:
    """An os-release value without its shell quoting ("24.04" -> 24.04, backslash escapes undone)."""
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        value = value[1:-1]
    return re.sub(r"\\(.)", r"\1", value)


def _os_release_fields(text: str) -> dict[str, str]:
    """KEY=value lines of an os-release file, comments and blank lines skipped."""
    fields: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            fields[key.strip()] = _unquote(value)
    return fields


def _major(version: str) -> str:
    """ "9.3" -> "9": RPM distributions' advisories name the major release."""
    return version.split(".", 1)[0]


def parse_os_release(text: str) -> Distro | None:
    """The distribution /etc/os-release describes, as advisories name it, or None if gpufleet knows none.

    Ubuntu and Debian keep VERSION_ID ("24.04", "12"); Rocky Linux, AlmaLinux and RHEL keep the major
    release ("9"). A derivative is mapped through ID_LIKE only where its release numbers are its parent's:
    Ubuntu derivatives through UBUNTU_CODENAME, RHEL rebuilds (CentOS: ID_LIKE "rhel") by major release.
    Debian derivatives and a release without VERSION_ID (testing, sid) give None.
    """
    fields = _os_release_fields(text)
    distro_id = fields.get("ID", "").lower()
    version = fields.get("VERSION_ID", "")
    like = fields.get("ID_LIKE", "").lower().split()
    ecosystem = _DISTRO_IDS.get(distro_id)
    if ecosystem is not None and version:
        return _distro(ecosystem, version)
    if "ubuntu" in like:
        release = _UBUNTU_CODENAMES.get(fields.get("UBUNTU_CODENAME", "").lower())
        return Distro("Ubuntu", release) if release else None
    if "rhel" in like and version:
        return Distro("Red Hat", _major(version))
    return None


def _distro(ecosystem: str, release: str) -> Distro:
    """A Distro with the release as its ecosystem's advisories write it."""
    if ECOSYSTEMS.get(ecosystem) == "rpm" or ecosystem == "Debian":
        return Distro(ecosystem, _major(release))
    return Distro(ecosystem, release)


def parse_distro_arg(text: str) -> Distro:
    """A `--distro` argument: "ubuntu:22.04", "debian:12", "rocky:9", "almalinux:9", "rhel:9" (any case)."""
    name, sep, release = text.strip().partition(":")
    ecosystem = _DISTRO_IDS.get(name.strip().lower())
    release = release.strip()
    if not sep or ecosystem is None or not release:
        raise ValueError(f"unknown distribution {text!r}: {DISTRO_HINT}")
    pattern = r"\d{2}\.\d{2}" if ecosystem == "Ubuntu" else r"\d+(?:\.\d+)*"
    if not re.fullmatch(pattern, release):
        example = "ubuntu:22.04" if ecosystem == "Ubuntu" else f"{name.strip().lower()}:9"
        raise ValueError(f"release {release!r} of {ecosystem} is not a release number: write it like {example}")
    return _distro(ecosystem, release)


# -- Debian and Ubuntu -----------------------------------------------------------------------------


def _tab_lines(text: str) -> Iterator[tuple[int, list[str]]]:
    """(line number, stripped columns) of each non-blank line of tab-separated text."""
    for number, raw in enumerate(text.splitlines(), start=1):
        if raw.strip():
            yield number, [column.strip() for column in raw.split("\t")]


def parse_dpkg_query(text: str, ecosystem: str) -> list[Installed]:
    """`dpkg-query -W` output in 3 (package, version, arch), 5 (+ source package, source version) or 6
    (+ ${db:Status-Abbrev}) tab-separated columns. With 3 the source is unknown (None); with 6, packages
    whose files are not on disk ("rc": removed, configuration kept) are left out. Raises ValueError on a
    line with another number of columns."""
    packages = []
    for number, columns in _tab_lines(text):
        if len(columns) not in (3, 5, 6):
            raise ValueError(f"dpkg-query line {number}: expected 3, 5 or 6 tab-separated columns, got {len(columns)}")
        name, version, arch = columns[:3]
        if len(columns) == 6 and (len(columns[5]) < 2 or columns[5][1] not in _DPKG_PRESENT_ABBREV):
            continue
        if not name or not version:
            continue  # dpkg-query prints an empty version for packages it only knows by name
        source_name = source_version = None
        if len(columns) >= 5:
            source_name, source_version = columns[3] or name, columns[4] or version
        packages.append(Installed(ecosystem, name, version, source_name, source_version, arch or None))
    return packages


def _source_of(paragraph: Mapping[str, str], name: str, version: str) -> tuple[str, str]:
    """The source package of a dpkg stanza: `Source: glibc` or `Source: gcc-13 (13.2.0-23ubuntu4)`.

    Without a Source field the source package is the binary package itself; without a version in it,
    the source version is the binary's (they differ only for binNMUs and some multi-binary sources).
    """
    source = paragraph.get("Source", "").strip()
    if not source:
        return name, version
    match = re.fullmatch(r"(\S+)(?:\s+\((\S+)\))?", source)
    if match is None:
        return name, version
    return match[1], match[2] or version


def parse_dpkg_status(text: str, ecosystem: str) -> list[Installed]:
    """/var/lib/dpkg/status: one Installed per stanza whose files are on disk (see _DPKG_PRESENT)."""
    from debian.deb822 import Deb822  # imported here: only this format needs python-debian

    packages = []
    for paragraph in Deb822.iter_paragraphs(text.splitlines(), use_apt_pkg=False):
        status = paragraph.get("Status", "").split()
        name, version = paragraph.get("Package", "").strip(), paragraph.get("Version", "").strip()
        if len(status) != 3 or status[2] not in _DPKG_PRESENT or not name or not version:
            continue
        source_name, source_version = _source_of(paragraph, name, version)
        arch = paragraph.get("Architecture", "").strip() or None
        packages.append(Installed(ecosystem, name, version, source_name, source_version, arch))
    return packages


def _without_arch(name: str) -> str:
    """`libc6:amd64` -> `libc6`: dpkg qualifies multi-arch packages; the arch has its own column."""
    return name.split(":", 1)[0]


def parse_dpkg_l(text: str, ecosystem: str) -> list[Installed]:
    """`dpkg -l` as admins paste it, header or not: one Installed per row whose files are on disk
    (status `i`, `U`, `F`, `W` or `t`: `ii`, `iU`, ...; `rc`, removed with its configuration kept, is
    left out). Binary names only. Raises ValueError on a line that is neither header nor row."""
    packages = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.rstrip()
        if not line.strip() or line.startswith(_DPKG_L_HEADER):
            continue
        match = _DPKG_L_ROW.match(line)
        if match is None:
            raise ValueError(f"dpkg -l line {number} is not 'ii  name  version  arch  description': {line[:120]!r}")
        if match["flags"][1] in _DPKG_PRESENT_ABBREV:
            packages.append(Installed(ecosystem, _without_arch(match["name"]), match["version"], arch=match["arch"]))
    return packages


def parse_dpkg_query_source(text: str, ecosystem: str) -> list[Installed]:
    """`dpkg-query -W -f='${binary:Package} ${source:Package} ${Version}\\n'`: binary name, source
    name, version (the source version is unknown there: the binary's stands in for it, as it does for
    all but binNMUs). Raises ValueError on another line."""
    packages = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _DPKG_SOURCE_ROW.match(line)
        if match is None:
            raise ValueError(f"dpkg-query line {number} is not 'binary source version': {line[:120]!r}")
        name, version = match["name"], match["version"]
        arch = name.split(":", 1)[1] if ":" in name else None
        packages.append(Installed(ecosystem, _without_arch(name), version, match["source"], version, arch))
    return packages


def _apt_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number, line) of the package lines of `apt list`: headers, warnings and comments skipped."""
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if line and not line.startswith(("#", "Listing...", "WARNING:")):
            yield number, line


def parse_apt_list(text: str, ecosystem: str) -> list[Installed]:
    """`apt list --installed`: binary names, versions and architectures; the source package is unknown.

    Lines not marked installed (`apt list` without --installed, "[residual-config]") are left out.
    Raises ValueError on a line that is not an apt list entry.
    """
    packages = []
    for number, line in _apt_lines(text):
        match = _APT_LINE.match(line)
        if match is None:
            raise ValueError(f"apt list line {number} is not 'name/suite version arch [installed]': {line[:120]!r}")
        flags = [flag.strip() for flag in (match["flags"] or "").split(",")]
        if "installed" not in flags:
            continue
        # Foreign-architecture packages may be listed as name:arch; the arch has its own column.
        name = _without_arch(match["name"])
        packages.append(Installed(ecosystem, name, match["version"], arch=match["arch"]))
    return packages


# -- Python ------------------------------------------------------------------------------------------


def _version_from_url(name: str, url: str) -> str | None:
    """The version in a direct reference's wheel or sdist file name (torch-1.13.1%2Bcu116-...whl ->
    1.13.1+cu116), or None when the URL names no such file (a VCS checkout, a local directory)."""
    filename = unquote(urlsplit(url).path.rsplit("/", 1)[-1])
    try:
        if filename.endswith(".whl"):
            parsed_name, version, _build, _tags = parse_wheel_filename(filename)
        elif filename.endswith((".tar.gz", ".zip")):
            parsed_name, version = parse_sdist_filename(filename)
        else:
            return None
    except (InvalidWheelFilename, InvalidSdistFilename):
        return None
    return str(version) if parsed_name == canonicalize_name(name) else None


def _pip_freeze(text: str, location: str | None) -> tuple[list[Installed], list[str]]:
    """pip freeze -> (packages, notes on what was left out or guessed)."""
    packages: list[Installed] = []
    unknown: list[str] = []
    from_files: list[str] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith(("#", "WARNING:")):
            continue
        if line.startswith("-"):
            # -e (editable: a working tree, no released version), -r/-i/-f options: nothing to match.
            if line.startswith(("-e ", "--editable")):
                unknown.append(line.split(None, 1)[-1][:80])
            continue
        pinned = _PIP_PINNED.match(line)
        direct = None if pinned else _PIP_DIRECT.match(line)
        if pinned:
            name, version = pinned["name"], pinned["version"]
        elif direct:
            name, version = direct["name"], _version_from_url(direct["name"], direct["url"])
            if version is None:
                unknown.append(canonicalize_name(name))
                continue
            from_files.append(f"{canonicalize_name(name)} {version}")
        else:
            raise ValueError(f"pip freeze line {number} is not 'name==version' or 'name @ url': {line[:120]!r}")
        packages.append(Installed("PyPI", canonicalize_name(name), version, location=location))
    notes = []
    if from_files:
        notes.append(f"version taken from the wheel or sdist file name of {len(from_files)}: {', '.join(from_files)}")
    if unknown:
        notes.append(
            f"{len(unknown)} left out, no released version (editable, VCS or directory installs): {', '.join(unknown)}"
        )
    return packages, notes


def parse_pip_freeze(text: str, location: str | None = None) -> list[Installed]:
    """`pip freeze`: `name==version` and `name===version` lines, names normalized (PEP 503).

    A direct reference (`name @ url`) gets the version in its wheel or sdist file name; one without
    (a VCS URL, a directory) and editable installs (`-e`) are left out: they have no released version
    to match. Raises ValueError on a line that is none of these.
    """
    return _pip_freeze(text, location)[0]


def parse_pip_list_json(text: str, location: str | None = None) -> list[Installed]:
    """`pip list --format=json`: [{"name": ..., "version": ...}, ...]. Raises ValueError otherwise."""
    try:
        entries = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"pip list output is not JSON: {exc}") from exc
    if not isinstance(entries, list) or not all(
        isinstance(e, dict) and isinstance(e.get("name"), str) and isinstance(e.get("version"), str) for e in entries
    ):
        raise ValueError('pip list JSON must be a list of {"name": ..., "version": ...} objects')
    return [Installed("PyPI", canonicalize_name(e["name"]), e["version"], location=location) for e in entries]


# -- RPM -----------------------------------------------------------------------------------------------


def rpm_version(evr: str) -> str:
    """An RPM version as advisories write it: "0:5.1.8-6.el9" -> "5.1.8-6.el9", "1:1.1.1k-7.el9" kept."""
    epoch, sep, rest = evr.partition(":")
    if not sep:
        return evr
    return rest if epoch in ("", "0", "(none)") else evr


def source_rpm_name(source_rpm: str) -> str | None:
    """The package name of a source RPM file name: "glibc-2.34-60.el9.src.rpm" -> "glibc"; None for
    "(none)" (gpg-pubkey) or anything else."""
    match = re.fullmatch(r"(?P<name>\S+)-[^-\s]+-[^-\s]+\.(?:no)?src\.rpm", source_rpm)
    return match["name"] if match else None


def parse_rpm_qa(text: str, ecosystem: str = "") -> list[Installed]:
    """Output of `rpm -qa --qf RPM_QUERY_FORMAT`: name, epoch:version-release, arch and, in a 4th
    column, the source RPM (3 columns, the older format, are read too), tab-separated.

    rpm does not say which distribution it belongs to: give `ecosystem` ("Rocky Linux", "Red Hat", ...);
    left "" it must be filled in by the caller (`detect_and_parse` does, from its `distro`). gpg-pubkey
    entries (imported signing keys, not software) are left out. A package keeps its source RPM's name
    as its source (its version: the binary's, which a source RPM shares). Raises ValueError on a line
    without three or four columns.
    """
    packages = []
    for number, columns in _tab_lines(text):
        if len(columns) not in (3, 4):
            raise ValueError(
                f"rpm line {number}: expected 3 or 4 tab-separated columns (name, E:V-R, arch, source RPM)"
            )
        name, evr, arch = columns[:3]
        if name == "gpg-pubkey" or not name or not evr:
            continue
        version = rpm_version(evr)
        source = source_rpm_name(columns[3]) if len(columns) == 4 else None
        packages.append(
            Installed(ecosystem, name, version, source, version if source else None, None if arch == "(none)" else arch)
        )
    return packages


def parse_rpm_nevra(text: str, ecosystem: str = "") -> list[Installed]:
    """Plain `rpm -qa`: name-version-release.arch per line. The epoch is not printed, so versions lack it
    (an epoch above 0 makes a version compare newer than it looks here). `ecosystem` as for parse_rpm_qa."""
    packages = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _NEVRA.match(line)
        if match is None:
            if line.startswith("gpg-pubkey-"):
                continue
            raise ValueError(f"rpm -qa line {number} is not name-version-release.arch: {line[:120]!r}")
        if match["name"] == "gpg-pubkey":
            continue
        version = rpm_version(f"{match['version']}-{match['release']}")
        packages.append(Installed(ecosystem, match["name"], version, arch=match["arch"]))
    return packages


# -- gpufleet's export ---------------------------------------------------------------------------------

_EXPORT_FIELDS = ("ecosystem", "name", "version", "source_name", "source_version", "arch", "location")


def export_json(packages: Iterable[Installed], distro: Distro | None) -> str:
    """The gpufleet-software/1 JSON document `detect_and_parse` reads back (the agent's --export)."""
    document = {
        "format": EXPORT_FORMAT,
        "distro": None if distro is None else {"ecosystem": distro.ecosystem, "release": distro.release},
        "packages": [asdict(package) for package in packages],
    }
    return json.dumps(document, indent=1, sort_keys=False)


def _export_package(index: int, entry: Any) -> Installed:
    """One package of an export; raises ValueError naming the entry when it does not fit Installed."""
    if not isinstance(entry, dict) or set(entry) - set(_EXPORT_FIELDS):
        raise ValueError(f"{EXPORT_FORMAT} package {index}: expected an object with fields {', '.join(_EXPORT_FIELDS)}")
    for key in ("ecosystem", "name", "version"):
        if not isinstance(entry.get(key), str) or not entry[key]:
            raise ValueError(f"{EXPORT_FORMAT} package {index}: {key} must be a non-empty string")
    for key in _EXPORT_FIELDS[3:]:
        if entry.get(key) is not None and not isinstance(entry[key], str):
            raise ValueError(f"{EXPORT_FORMAT} package {index}: {key} must be a string or null")
    optional = [entry.get(key) for key in _EXPORT_FIELDS[3:]]
    return Installed(entry["ecosystem"], entry["name"], entry["version"], *optional)


def _parse_export(document: dict[str, Any], distro: Distro | None) -> InventoryFile:
    """A gpufleet-software/1 document; its own distro wins over the one given."""
    raw_distro = document.get("distro")
    if raw_distro is not None:
        if not isinstance(raw_distro, dict) or not all(
            isinstance(raw_distro.get(k), str) for k in ("ecosystem", "release")
        ):
            raise ValueError(f'{EXPORT_FORMAT}: distro must be {{"ecosystem": ..., "release": ...}} or null')
        distro = Distro(raw_distro["ecosystem"], raw_distro["release"])
    entries = document.get("packages")
    if not isinstance(entries, list):
        # ValueError, not TypeError: every kind of unreadable input reaches the CLI as one ValueError.
        raise ValueError(f"{EXPORT_FORMAT}: packages must be a list")  # noqa: TRY004
    packages = [_export_package(i, entry) for i, entry in enumerate(entries)]
    # An export of an apt list carries no source names either; the scan should say so the same way.
    binary_only = any(p.ecosystem in SOURCE_PACKAGE_DISTROS and p.source_name is None for p in packages)
    return InventoryFile("gpufleet-json", packages, distro, binary_only)


# -- detection -------------------------------------------------------------------------------------------


def _meaningful_lines(text: str) -> list[str]:
    """Lines that carry data: blank lines, comments and tool chatter left out."""
    skip = ("#", "Listing...", "WARNING:")
    return [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith(skip)]


def _tab_kind(lines: list[str], distro: Distro | None) -> str:
    """dpkg-query (5/6 columns), dpkg-query-3col or rpm-qa for tab-separated text."""
    columns = len(lines[0].split("\t"))
    if columns in (5, 6):
        return "dpkg-query"
    if columns == 4 and lines[0].split("\t")[3].strip().endswith((".rpm", "(none)")):
        return "rpm-qa"  # with the source RPM
    if columns != 3:
        raise ValueError(
            f"tab-separated text with {columns} columns is not dpkg-query or rpm output; accepted: {ACCEPTED}"
        )
    arches = {line.split("\t")[2].strip() for line in lines if line.count("\t") == 2}
    if arches & _DEB_ONLY_ARCHES and not arches & _RPM_ONLY_ARCHES:
        return "dpkg-query-3col"
    if arches & _RPM_ONLY_ARCHES and not arches & _DEB_ONLY_ARCHES:
        return "rpm-qa"
    scheme = ECOSYSTEMS.get(distro.ecosystem) if distro else None
    if scheme in ("deb", "rpm"):
        # Architectures both families spell alike (i386, s390x): the distribution decides.
        return "dpkg-query-3col" if scheme == "deb" else "rpm-qa"
    raise ValueError(
        f"cannot tell dpkg-query from rpm output by its architectures ({', '.join(sorted(arches))}): {DISTRO_HINT}"
    )


# What the first package line of each line-per-package format looks like.
_LINE_SHAPES = (
    ("dpkg-l", _DPKG_L_ROW),
    ("dpkg-query-source", _DPKG_SOURCE_ROW),
    ("apt-list", _APT_LINE),
    ("pip-freeze", _PIP_PINNED),
    ("pip-freeze", _PIP_DIRECT),
    ("rpm-nevra", _NEVRA),
)


def _detect(text: str, distro: Distro | None) -> str:
    """The kind of a non-JSON software list; raises ValueError naming the accepted formats."""
    if re.search(r"^Package:", text, re.MULTILINE) and re.search(r"^Status:", text, re.MULTILINE):
        return "dpkg-status"
    lines = [line for line in _meaningful_lines(text) if not line.startswith(_DPKG_L_HEADER)]
    if not lines:
        raise ValueError(f"no packages in the file; accepted: {ACCEPTED}")
    first = lines[0]
    if "\t" in first:
        return _tab_kind(lines, distro)
    if first.startswith(("-e ", "--editable")):
        return "pip-freeze"
    kind = next((kind for kind, shape in _LINE_SHAPES if shape.match(first)), None)
    if kind is not None:
        return kind
    raise ValueError(f"not a software list gpufleet reads (first line {first[:80]!r}); accepted: {ACCEPTED}")


def _distro_for(kind: str, distro: Distro | None) -> Distro:
    """The distribution a deb or rpm list belongs to, which the list itself does not say."""
    scheme = "deb" if kind.startswith(("dpkg", "apt")) else "rpm"
    family = "a Debian/Ubuntu" if scheme == "deb" else "an RPM"
    if distro is None:
        raise ValueError(f"{kind} output is {family} package list that names no distribution: {DISTRO_HINT}")
    if ECOSYSTEMS.get(distro.ecosystem) != scheme:
        raise ValueError(f"{kind} output is {family} package list, but the distribution given is {distro.ecosystem}")
    return distro


def _parse_json(text: str, distro: Distro | None) -> InventoryFile:
    """A JSON document: gpufleet's export or `pip list --format=json`."""
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"the file looks like JSON but does not parse ({exc}); accepted: {ACCEPTED}") from exc
    if isinstance(document, dict) and document.get("format") == EXPORT_FORMAT:
        return _parse_export(document, distro)
    if isinstance(document, list):
        return InventoryFile("pip-list-json", parse_pip_list_json(text), distro, False)
    raise ValueError(f'JSON without "format": "{EXPORT_FORMAT}" and not a pip list; accepted: {ACCEPTED}')


def detect_and_parse(text: str, distro: Distro | None) -> InventoryFile:
    """Recognise which format `text` is (see the module docstring) and parse it.

    `distro` is the distribution a dpkg, apt or rpm list belongs to (those lists do not say); it is
    required for them and must be of the same family. Python lists need none and keep it as given;
    an export's own distro wins. Raises ValueError with a one-line reason for unreadable text.
    """
    if text.lstrip().startswith(("{", "[")):
        return _parse_json(text, distro)
    kind = _detect(text, distro)
    if kind == "pip-freeze":
        packages, notes = _pip_freeze(text, None)
        return InventoryFile(kind, packages, distro, False, notes)
    distro = _distro_for(kind, distro)
    packages = _DISTRO_PARSERS[kind](text, distro.ecosystem)
    return InventoryFile(kind, packages, distro, kind in _BINARY_ONLY, list(_KIND_NOTES.get(kind, ())))


_DISTRO_PARSERS: dict[str, Callable[[str, str], list[Installed]]] = {
    "dpkg-status": parse_dpkg_status,
    "dpkg-query": parse_dpkg_query,
    "dpkg-query-3col": parse_dpkg_query,
    "dpkg-query-source": parse_dpkg_query_source,
    "dpkg-l": parse_dpkg_l,
    "apt-list": parse_apt_list,
    "rpm-qa": parse_rpm_qa,
    "rpm-nevra": parse_rpm_nevra,
}
_BINARY_ONLY = {"dpkg-query-3col", "dpkg-l", "apt-list"}
_BINARY_ONLY_NOTE = (
    "no source package names: advisories (which name source packages) are matched by binary name,"
    " through the binary packages an advisory lists (Ubuntu's) or as if it were the source name"
)
_KIND_NOTES = {
    "dpkg-query-3col": (_BINARY_ONLY_NOTE,),
    "dpkg-l": (_BINARY_ONLY_NOTE,),
    "apt-list": (_BINARY_ONLY_NOTE,),
    "rpm-nevra": ("plain rpm -qa shows no epochs: versions are compared without them",),
}
