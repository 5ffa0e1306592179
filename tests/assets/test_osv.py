"""OSV parsing on real records (tests/fixtures/advisories, provenance in tests/fixtures/SOURCES.md):
Debian's DSA-3029-1, PyPA's PYSEC YAML, Ubuntu's CVE-level record with its Pro/ESM ecosystem."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufleet.assets.advisories.load import load_path
from gpufleet.assets.advisories.osv import best_cvss, cvss_base, parse_osv, shorten, split_ecosystem
from gpufleet.assets.records import Advisory, Range

ADVISORIES = Path(__file__).resolve().parents[1] / "fixtures" / "advisories"


def _json(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((ADVISORIES / name).read_text())
    return data


def _yaml(name: str) -> Advisory:
    """A PYSEC record read the way gpufleet reads YAML (scalars kept as text)."""
    [(_, advisory)] = list(load_path(ADVISORIES / name))
    return advisory


def test_debian_dsa_ids_release_and_fix() -> None:
    advisory = parse_osv(_json("DSA-3029-1.json"))
    assert advisory.id == "DSA-3029-1"
    assert advisory.aliases == ("CVE-2014-3616",)
    assert advisory.key() == "CVE-2014-3616"
    assert advisory.source == "osv"
    assert advisory.summary == "nginx - security update"
    assert advisory.published == "2014-09-20T00:00:00Z"
    assert advisory.modified == "2014-09-20T08:18:07Z"
    assert advisory.severity == "unknown"  # the DSA record carries no severity
    [affected] = advisory.affected
    assert (affected.ecosystem, affected.release, affected.package) == ("Debian", "7", "nginx")
    assert affected.ranges == (Range("ECOSYSTEM", (("introduced", "0"), ("fixed", "1.2.1-2.2+wheezy3"))),)
    assert affected.fixed == "1.2.1-2.2+wheezy3"
    assert affected.versions == ()


def test_ubuntu_upstream_cve_is_an_alias_and_pro_lts_qualifiers_are_dropped() -> None:
    advisory = parse_osv(_json("UBUNTU-CVE-2025-38094.json"))
    assert advisory.aliases == ("CVE-2025-38094",)  # from `upstream`; `aliases` is empty
    assert advisory.severity == "medium"  # type "Ubuntu", score "medium"
    assert advisory.cvss_score is None
    assert advisory.summary.startswith("In the Linux kernel, the following vulnerability has been resolved")
    assert len(advisory.summary) == 300
    assert advisory.summary.endswith("…")
    [affected] = advisory.affected
    assert (affected.ecosystem, affected.release, affected.package) == ("Ubuntu", "14.04", "linux")
    assert affected.ranges == (Range("ECOSYSTEM", (("introduced", "0"),)),)
    assert affected.fixed is None  # no fix for the ESM trusty kernel
    assert affected.versions[:2] == ("3.11.0-12.19", "3.12.0-1.3")
    assert len(affected.versions) == 180


def test_related_ids_are_not_aliases() -> None:
    advisory = _yaml("PYSEC-2023-175.yaml")
    assert advisory.aliases == ()  # CVE-2023-4863 and CVE-2023-5129 are only `related`
    assert advisory.key() == "PYSEC-2023-175"
    assert advisory.summary.startswith("Pillow versions before v10.0.1 bundled libwebp binaries")


def test_yaml_versions_stay_text() -> None:
    [affected] = _yaml("PYSEC-2023-175.yaml").affected
    assert affected.versions[:3] == ("1.0", "1.1", "1.2")  # quoted in the file
    assert "10.0.0" in affected.versions  # unquoted
    assert all(isinstance(v, str) for v in affected.versions)
    assert affected.fixed == "10.0.1"
    jinja = _yaml("PYSEC-2021-66.yaml").affected[0]
    assert jinja.versions[:3] == ("2.0rc1", "2.0", "2.1")
    assert "2.10" in jinja.versions


def test_unquoted_yaml_number_version_is_read_as_written(tmp_path: Path) -> None:
    """An unquoted 2.10 is the float 2.1 to a default YAML loader; gpufleet's loader keeps "2.10"."""
    text = (ADVISORIES / "PYSEC-2021-66.yaml").read_text().replace("- '2.10'", "- 2.10")
    assert "- 2.10\n" in text
    (tmp_path / "PYSEC-2021-66.yaml").write_text(text)
    [(_, advisory)] = list(load_path(tmp_path / "PYSEC-2021-66.yaml"))
    assert "2.10" in advisory.affected[0].versions
    assert "2.1" in advisory.affected[0].versions  # the real 2.1, listed separately


def test_a_float_version_is_refused_rather_than_guessed() -> None:
    data = yaml.safe_load((ADVISORIES / "PYSEC-2021-66.yaml").read_text().replace("- '2.10'", "- 2.10"))
    with pytest.raises(ValueError, match=r"PYSEC-2021-66.*2\.1 is not text"):
        parse_osv(data)


def test_git_range_is_kept_but_fixed_comes_from_the_ecosystem_range() -> None:
    advisory = _yaml("PYSEC-2023-74.yaml")
    assert advisory.aliases == ("CVE-2023-32681", "GHSA-j8r2-6x86-q33q")
    [affected] = advisory.affected
    assert [r.kind for r in affected.ranges] == ["GIT", "ECOSYSTEM"]
    assert affected.ranges[1].events == (("introduced", "2.3.0"), ("fixed", "2.31.0"))
    assert affected.fixed == "2.31.0"  # not the GIT range's commit 74ea7cf7...


def test_cve_aliases_come_first() -> None:
    data = _json("DSA-3029-1.json") | {"aliases": ["GHSA-xxxx-yyyy-zzzz", "CVE-2014-3616", "DSA-3029-1"]}
    assert parse_osv(data).aliases == ("CVE-2014-3616", "GHSA-xxxx-yyyy-zzzz")


@pytest.mark.parametrize(
    ("ecosystem", "expected"),
    [
        ("Debian:7", ("Debian", "7")),
        ("Debian:12", ("Debian", "12")),
        ("Ubuntu:22.04:LTS", ("Ubuntu", "22.04")),
        ("Ubuntu:Pro:14.04:LTS", ("Ubuntu", "14.04")),
        ("Ubuntu:Pro:FIPS-updates:22.04:LTS", ("Ubuntu", "22.04")),
        ("Red Hat:enterprise_linux:9::appstream", ("Red Hat", "9")),
        ("Red Hat:rhel_aus:8.4::appstream", ("Red Hat", "8")),
        ("Rocky Linux:9", ("Rocky Linux", "9")),
        ("AlmaLinux:8", ("AlmaLinux", "8")),
        ("Alpine:v3.16", ("Alpine", "3.16")),
        ("openEuler:22.03-LTS-SP1", ("openEuler", "22.03-LTS-SP1")),
        ("PyPI", ("PyPI", None)),
        ("Go", ("Go", None)),
    ],
)
def test_split_ecosystem(ecosystem: str, expected: tuple[str, str | None]) -> None:
    assert split_ecosystem(ecosystem) == expected


def test_cvss_v3_vector_gives_score_and_severity() -> None:
    """NVD's own 7.8 HIGH for CVE-2023-0184's vector; the NVIDIA CNA's scope-changed variant is 8.8."""
    nvd = cvss_base("CVSS:3.1/AV:L/AC:L/PR:L/UI:N/S:U/C:H/I:H/A:H")
    assert nvd is not None
    assert (nvd.version, nvd.score, nvd.severity) == (3, 7.8, "high")
    cna = cvss_base("CVSS:3.1/AV:L/AC:L/PR:L/UI:N/S:C/C:H/I:H/A:H")
    assert cna is not None
    assert cna.score == 8.8


def test_cvss_v2_and_v4_vectors() -> None:
    v2 = cvss_base("AV:N/AC:L/Au:N/C:P/I:P/A:P")
    assert v2 is not None
    assert (v2.version, v2.score, v2.severity) == (2, 7.5, "high")
    v4 = cvss_base("CVSS:4.0/AV:N/AC:L/AT:N/PR:N/UI:N/VC:H/VI:H/VA:H/SC:N/SI:N/SA:N")
    assert v4 is not None
    assert (v4.version, v4.score, v4.severity) == (4, 9.3, "critical")
    assert cvss_base("CVSS:3.1/AV:Q/garbage") is None


def test_best_cvss_prefers_the_highest_version_over_a_higher_score() -> None:
    best = best_cvss(["AV:N/AC:L/Au:N/C:C/I:C/A:C", "CVSS:3.1/AV:L/AC:L/PR:L/UI:N/S:U/C:H/I:H/A:H"])
    assert best is not None
    assert best.version == 3
    assert best.score == 7.8  # though the v2 vector scores 10.0


def test_record_severity_from_cvss_entries() -> None:
    data = _json("DSA-3029-1.json") | {
        "severity": [
            {"type": "CVSS_V2", "score": "AV:N/AC:L/Au:N/C:C/I:C/A:C"},
            {"type": "CVSS_V3", "score": "CVSS:3.1/AV:L/AC:L/PR:L/UI:N/S:U/C:H/I:H/A:H"},
        ]
    }
    advisory = parse_osv(data)
    assert (advisory.severity, advisory.cvss_score) == ("high", 7.8)
    assert advisory.cvss_vector == "CVSS:3.1/AV:L/AC:L/PR:L/UI:N/S:U/C:H/I:H/A:H"


def test_github_database_specific_moderate_is_medium() -> None:
    data = _json("DSA-3029-1.json") | {"database_specific": {"severity": "MODERATE"}}
    assert parse_osv(data).severity == "medium"


def test_withdrawn_record_affects_nothing() -> None:
    data = _json("DSA-3029-1.json") | {"withdrawn": "2015-01-01T00:00:00Z"}
    advisory = parse_osv(data)
    assert advisory.id == "DSA-3029-1"
    assert advisory.aliases == ("CVE-2014-3616",)
    assert advisory.affected == ()


def test_withdrawn_record_without_affected_is_still_osv() -> None:
    advisory = parse_osv(
        {
            "id": "GHSA-aaaa-bbbb-cccc",
            "modified": "2024-01-01T00:00:00Z",
            "withdrawn": "2024-01-01T00:00:00Z",
            "summary": "gone",
        }
    )
    assert advisory.affected == ()
    assert advisory.summary == "gone"


def test_summary_falls_back_to_the_first_line_of_details() -> None:
    data = _json("DSA-3029-1.json")
    del data["summary"]
    assert parse_osv(data).summary == ("Antoine Delignat-Lavaud and Karthikeyan Bhargavan discovered that it was")
    assert shorten("x" * 301) == "x" * 299 + "…"
    assert shorten("\n\n  short  \nmore") == "short"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"affected": []}, "no id"),
        ({"id": "X-1"}, "neither 'affected' nor 'withdrawn'"),
        ({"id": "X-1", "affected": "nginx"}, "'affected' is str, not a list"),
        ({"id": "X-1", "affected": [{"package": {"name": "nginx"}}]}, "needs an ecosystem and a name"),
        ({"id": "X-1", "modified": "2024-01-01T00:00:00Z", "affected": [], "aliases": "CVE-1"}, "'aliases' is str"),
    ],
)
def test_not_osv_raises_value_error_naming_the_record(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_osv(data)
    if "id" in data:
        with pytest.raises(ValueError, match="'X-1'"):
            parse_osv(data)


# -- Ubuntu's records keep their ids, severity and binaries (issue 23, item 4) -----------------------


def test_ubuntu_cve_record_keeps_its_cve_usn_cvss_and_binaries() -> None:
    """This record puts CVE-2023-4911 and USN-6409-1 in `related`, not `upstream`."""
    advisory = parse_osv(_json("UBUNTU-CVE-2023-4911.json"))
    assert advisory.aliases == ("CVE-2023-4911", "USN-6409-1")
    assert advisory.key() == "CVE-2023-4911"
    assert (advisory.severity, advisory.cvss_score) == ("high", 7.8)
    assert advisory.cvss_vector == "CVSS:3.1/AV:L/AC:L/PR:L/UI:N/S:U/C:H/I:H/A:H"
    jammy, noble = advisory.affected
    assert (jammy.release, jammy.package, jammy.fixed) == ("22.04", "glibc", "2.35-0ubuntu3.4")
    assert {"libc6", "libc-bin", "locales", "nscd"} <= set(jammy.binaries)
    assert len(jammy.binaries) == 28
    assert "libc6-dev-dbgsym" in noble.binaries
    assert "libc6-dev-dbgsym" not in jammy.binaries


def test_usn_record_names_the_cves_it_fixes() -> None:
    advisory = parse_osv(_json("USN-6409-1.json"))
    assert advisory.aliases == ("CVE-2023-4527", "CVE-2023-4911", "UBUNTU-CVE-2023-4527", "UBUNTU-CVE-2023-4911")
    assert advisory.severity == "unknown"  # a USN carries no severity of its own
    assert advisory.summary == "glibc vulnerabilities"


def test_ubuntu_priority_is_the_severity_without_cvss() -> None:
    data = _json("UBUNTU-CVE-2023-4911.json")
    del data["severity"]
    assert parse_osv(data).severity == "high"  # ecosystem_specific.ubuntu_priority


def test_binaries_round_trip_through_the_wire_form() -> None:
    from gpufleet.assets.records import advisory_from_json, advisory_to_json

    advisory = parse_osv(_json("UBUNTU-CVE-2023-4911.json"))
    assert advisory_from_json(advisory_to_json(advisory)) == advisory
    assert "binaries" not in advisory_to_json(parse_osv(_json("DSA-3029-1.json")))["affected"][0]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"modified": None}, "no 'modified' time"),
        ({"modified": "2023-10-03T17:"}, "not an RFC 3339 date-time"),
        ({"published": "2023-10-03"}, "not an RFC 3339 date-time"),
        ({"severity": [{"type": "CVSS_V3"}]}, "needs a type and a score"),
        (
            {"severity": [{"type": "CVSS_V3", "score": "CVSS:3.1/AV:L/AC:L/PR:L/UI:N/S:U/C:H/I:H/A:"}]},
            "not a valid CVSS",
        ),
    ],
)
def test_a_broken_record_is_refused_not_read_short(change: dict[str, Any], message: str) -> None:
    data = _json("UBUNTU-CVE-2023-4911.json") | change
    with pytest.raises(ValueError, match=message):
        parse_osv(data)


def test_broken_ranges_and_binaries_are_refused() -> None:
    data = _json("UBUNTU-CVE-2023-4911.json")
    data["affected"][0]["ranges"][0]["events"] = []
    with pytest.raises(ValueError, match="range has no events"):
        parse_osv(data)
    data = _json("UBUNTU-CVE-2023-4911.json")
    data["affected"][0]["ranges"][0]["events"][1] = {"fixed": None}
    with pytest.raises(ValueError, match="a version is empty"):
        parse_osv(data)
    data = _json("UBUNTU-CVE-2023-4911.json")
    data["affected"][0]["ecosystem_specific"]["binaries"].append({"binary_version": "2.35-0ubuntu3.4"})
    with pytest.raises(ValueError, match="has no binary_name"):
        parse_osv(data)
