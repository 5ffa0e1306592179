"""NVD CVE API 2.0 parsing on real records copied from fkie-cad/nvd-json-data-feeds (provenance in
tests/fixtures/SOURCES.md): CVE-2023-0184 (NVIDIA GPU display driver, analysed, Linux and Windows
branches) and CVE-2024-0132 (NVIDIA Container Toolkit, not yet analysed: no configurations)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from gpufleet.assets.advisories.nvd import parse_cpe, parse_nvd
from gpufleet.assets.records import Affected, Range

ADVISORIES = Path(__file__).resolve().parents[1] / "fixtures" / "advisories"
DRIVER_LINUX = "cpe:2.3:a:nvidia:gpu_display_driver:*:*:*:*:*:linux:*:*"


def _cve(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((ADVISORIES / name).read_text())
    return data


def _with_matches(*matches: dict[str, Any]) -> dict[str, Any]:
    """CVE-2023-0184 with its configurations replaced by one node holding these cpeMatch entries."""
    cve = _cve("nvd-CVE-2023-0184.json")
    cve["configurations"] = [{"nodes": [{"operator": "OR", "negate": False, "cpeMatch": list(matches)}]}]
    return cve


def _driver(events: tuple[tuple[str, str], ...], fixed: str | None) -> Affected:
    return Affected("NVIDIA", "driver", ranges=(Range("ECOSYSTEM", events),), fixed=fixed)


def test_driver_cve_linux_branches_become_ranges() -> None:
    [advisory] = parse_nvd(_cve("nvd-CVE-2023-0184.json"))
    assert advisory.id == "CVE-2023-0184"
    assert advisory.aliases == ()
    assert advisory.source == "nvd"
    assert advisory.summary.startswith("NVIDIA GPU Display Driver for Windows and Linux contains a vulnerability")
    assert advisory.published == "2023-04-22T03:15:08.817"
    assert advisory.modified == "2023-10-19T16:05:59.697"
    # Windows branches (454.14, 474.30, 518.03, 528.89, 531.41) are left out; each Linux branch is its own entry.
    assert advisory.affected == (
        _driver((("introduced", "470"), ("fixed", "470.182.03")), "470.182.03"),
        _driver((("introduced", "515"), ("fixed", "515.105.01")), "515.105.01"),
        _driver((("introduced", "525"), ("fixed", "525.105.17")), "525.105.17"),
        _driver((("introduced", "530"), ("fixed", "530.41.03")), "530.41.03"),
        _driver((("introduced", "450"), ("fixed", "450.236.01")), "450.236.01"),
    )
    assert all(a.release is None for a in advisory.affected)


def test_primary_metric_wins_over_a_higher_secondary_one() -> None:
    [advisory] = parse_nvd(_cve("nvd-CVE-2023-0184.json"))
    assert advisory.cvss_vector == "CVSS:3.1/AV:L/AC:L/PR:L/UI:N/S:U/C:H/I:H/A:H"  # nvd@nist.gov, Primary
    assert (advisory.cvss_score, advisory.severity) == (7.8, "high")  # not the CNA's 8.8


def test_record_without_analysis_has_the_cna_score_and_affects_nothing_known() -> None:
    [advisory] = parse_nvd(_cve("nvd-CVE-2024-0132.json"))
    assert advisory.id == "CVE-2024-0132"
    assert (advisory.cvss_score, advisory.severity) == (9.0, "critical")  # Secondary is all there is
    assert advisory.affected == ()


def test_api_response_and_cve_wrapper() -> None:
    driver, toolkit = _cve("nvd-CVE-2023-0184.json"), _cve("nvd-CVE-2024-0132.json")
    response = {
        "resultsPerPage": 2,
        "startIndex": 0,
        "totalResults": 2,
        "format": "NVD_CVE",
        "version": "2.0",
        "vulnerabilities": [{"cve": driver}, {"cve": toolkit}],
    }
    assert [a.id for a in parse_nvd(response)] == ["CVE-2023-0184", "CVE-2024-0132"]
    assert [a.id for a in parse_nvd({"cve": toolkit})] == ["CVE-2024-0132"]
    assert parse_nvd({"format": "NVD_CVE", "vulnerabilities": []}) == []


def test_version_bounds() -> None:
    cve = _with_matches(
        {"vulnerable": True, "criteria": DRIVER_LINUX, "versionEndIncluding": "535.54.03"},
        {
            "vulnerable": True,
            "criteria": DRIVER_LINUX,
            "versionStartExcluding": "550",
            "versionEndExcluding": "550.90.07",
        },
        {"vulnerable": True, "criteria": DRIVER_LINUX},
    )
    [advisory] = parse_nvd(cve)
    assert advisory.affected == (
        _driver((("introduced", "0"), ("last_affected", "535.54.03")), None),
        # OSV has no exclusive start: 550 itself is (wrongly, conservatively) included.
        _driver((("introduced", "550"), ("fixed", "550.90.07")), "550.90.07"),
        _driver((("introduced", "0"),), None),  # no bounds: every version
    )


def test_exact_versions_other_products_and_skipped_matches() -> None:
    cve = _with_matches(
        {"vulnerable": True, "criteria": "cpe:2.3:a:nvidia:cuda_toolkit:12.4:*:*:*:*:*:*:*"},
        {"vulnerable": True, "criteria": "cpe:2.3:a:nvidia:cuda_toolkit:12.4.1:*:*:*:*:*:*:*"},
        {
            "vulnerable": True,
            "criteria": "cpe:2.3:a:nvidia:container_toolkit:*:*:*:*:*:*:*:*",
            "versionEndIncluding": "1.16.1",
        },
        {"vulnerable": True, "criteria": "cpe:2.3:a:nvidia:gpu_display_driver:550.54:*:*:*:*:windows:*:*"},
        {"vulnerable": False, "criteria": DRIVER_LINUX, "versionEndExcluding": "1"},
        {"vulnerable": True, "criteria": "cpe:2.3:a:python:pillow:*:*:*:*:*:*:*:*", "versionEndExcluding": "9.2.0"},
        {"vulnerable": True, "criteria": "not a cpe"},
    )
    [advisory] = parse_nvd(cve)
    assert advisory.affected == (
        Affected(
            "NVIDIA",
            "container-toolkit",
            ranges=(Range("ECOSYSTEM", (("introduced", "0"), ("last_affected", "1.16.1"))),),
        ),
        Affected("NVIDIA", "cuda-toolkit", versions=("12.4", "12.4.1")),
    )


def test_repeated_matches_and_negated_nodes() -> None:
    match = {"vulnerable": True, "criteria": DRIVER_LINUX, "versionEndExcluding": "470.182.03"}
    cve = _with_matches(match)
    cve["configurations"].append(copy.deepcopy(cve["configurations"][0]))
    cve["configurations"].append(
        {"nodes": [{"negate": True, "cpeMatch": [{"vulnerable": True, "criteria": DRIVER_LINUX}]}]}
    )
    [advisory] = parse_nvd(cve)
    assert advisory.affected == (_driver((("introduced", "0"), ("fixed", "470.182.03")), "470.182.03"),)


def test_rejected_cve_affects_nothing() -> None:
    cve = _cve("nvd-CVE-2023-0184.json") | {"vulnStatus": "Rejected"}
    [advisory] = parse_nvd(cve)
    assert advisory.affected == ()


def test_v2_metric_and_english_description() -> None:
    cve = _cve("nvd-CVE-2024-0132.json")
    cve["metrics"] = {
        "cvssMetricV2": [
            {
                "source": "nvd@nist.gov",
                "type": "Primary",
                "cvssData": {"version": "2.0", "vectorString": "AV:L/AC:L/Au:N/C:P/I:N/A:N", "baseScore": 2.1},
                "baseSeverity": "LOW",
            }
        ]
    }
    cve["descriptions"] = [{"lang": "es", "value": "Spanish"}, {"lang": "en", "value": "English\nsecond line"}]
    [advisory] = parse_nvd(cve)
    assert (advisory.cvss_score, advisory.severity) == (2.1, "low")
    assert advisory.summary == "English"


def test_parse_cpe() -> None:
    cpe = parse_cpe(DRIVER_LINUX)
    assert cpe is not None
    assert (cpe.part, cpe.vendor, cpe.product, cpe.version, cpe.target_sw) == (
        "a",
        "nvidia",
        "gpu_display_driver",
        "*",
        "linux",
    )
    escaped = parse_cpe(r"cpe:2.3:a:vendor:prod\:uct:1.0\-beta:*:*:*:*:*:*:*")
    assert escaped is not None
    assert (escaped.product, escaped.version) == ("prod:uct", "1.0-beta")
    uri = parse_cpe("cpe:/o:redhat:rhel_aus:7.6::server")
    assert uri is not None
    assert (uri.part, uri.vendor, uri.product, uri.version, uri.target_sw) == ("o", "redhat", "rhel_aus", "7.6", "*")
    assert parse_cpe("pkg:pypi/pillow") is None


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"resultsPerPage": 0}, "not an NVD"),
        ({"vulnerabilities": [{"id": "CVE-1"}]}, "not a list of"),
        ({"cve": {"descriptions": []}}, "no CVE id"),
        ({"cve": "CVE-2024-0132"}, "not an object"),
    ],
)
def test_not_nvd_raises_value_error(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_nvd(data)
