"""CSAF 2.0 parsing on the OASIS CSAF TC's examples modelled on real advisories (provenance in
tests/fixtures/SOURCES.md): Red Hat's RHSA-2022:0011 (telnet RPMs on RHEL 7.6 AUS/E4S/TUS),
RHSA-2021:5186 (OpenShift container images) and BSI-2022-0001 (a product no package manager owns)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from gpufleet.assets.advisories.csaf import ProductTree, parse_csaf, parse_purl
from gpufleet.assets.records import Affected, Range

ADVISORIES = Path(__file__).resolve().parents[1] / "fixtures" / "advisories"
TELNET_FIX = "1:0.17-65.el7_6"


def _doc(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((ADVISORIES / name).read_text())
    return data


def _fixed(ecosystem: str, package: str, release: str | None, version: str) -> Affected:
    return Affected(
        ecosystem,
        package,
        release,
        ranges=(Range("ECOSYSTEM", (("introduced", "0"), ("fixed", version))),),
        fixed=version,
    )


def test_rhsa_telnet_fixed_in_release_7() -> None:
    [advisory] = parse_csaf(_doc("rhsa-2022_0011.json"))
    assert advisory.id == "CVE-2020-10188"
    assert advisory.aliases == ("RHSA-2022:0011", "https://bugzilla.redhat.com/show_bug.cgi?id=1811673")
    assert advisory.source == "csaf"
    assert advisory.summary.startswith("CVE-2020-10188 telnet-server: no bounds checks in nextitem()")
    assert advisory.published == "2022-01-04T08:38:00Z"
    # No CVSS in the document: Red Hat's impact "Important" is high.
    assert (advisory.severity, advisory.cvss_score) == ("high", None)
    # Three platforms, two arches, src and debuginfo RPMs: one entry per binary package.
    assert advisory.affected == (
        _fixed("Red Hat", "telnet", "7", TELNET_FIX),
        _fixed("Red Hat", "telnet-server", "7", TELNET_FIX),
    )


def test_relationship_resolves_to_package_version_and_platform_release() -> None:
    tree = ProductTree(_doc("rhsa-2022_0011.json")["product_tree"])
    component = tree.component("7Server-7.6.TUS:telnet-server-1:0.17-65.el7_6.x86_64")
    assert component is not None
    assert (component.ecosystem, component.package, component.version, component.release) == (
        "Red Hat",
        "telnet-server",
        TELNET_FIX,
        "7",
    )
    assert tree.component("7Server-7.6.AUS:telnet-debuginfo-1:0.17-65.el7_6.x86_64") is None
    assert tree.component("no-such-product") is None


def test_openshift_images_are_generic_and_not_affected_products_are_left_out() -> None:
    first, second = parse_csaf(_doc("rhsa-2021_5186.json"))
    assert (first.id, second.id) == ("CVE-2021-4104", "CVE-2021-4125")
    assert first.aliases[0] == "RHSA-2021:5186"
    assert (first.severity, second.severity) == ("medium", "critical")  # Moderate, Critical
    tag = "v4.6.0-202112160147.p0.gf139e12.assembly.stream"
    # The two known_not_affected operator images give nothing.
    assert first.affected == (_fixed("generic", "openshift4/ose-metering-hive", None, tag),)


def test_bsi_generic_product_fixed_and_known_affected_versions() -> None:
    [advisory] = parse_csaf(_doc("bsi-2022-0001.json"))
    assert advisory.id == "CVE-2022-27193"
    assert advisory.aliases == ("BSI-2022-0001", "csaf-tools/CVRF-CSAF-Converter#78")
    assert advisory.summary == "CVRF-CSAF-Converter: XML External Entities Vulnerability"  # the document's title
    assert advisory.cvss_vector == "CVSS:3.1/AV:L/AC:L/PR:N/UI:R/S:U/C:H/I:N/A:L/E:F/RL:O/RC:C"
    assert (advisory.cvss_score, advisory.severity) == (6.1, "medium")  # the base score, not the temporal 5.7
    assert advisory.affected == (
        _fixed("generic", "cvrf-csaf-converter", None, "1.0.0-rc2"),  # first_fixed and fixed: one entry
        Affected(
            "generic",
            "cvrf-csaf-converter",
            versions=("1.0.0-alpha", "1.0.0-dev1", "1.0.0-dev2", "1.0.0-dev3", "1.0.0-rc1"),
        ),
    )


def test_vulnerability_without_cve_is_named_by_tracking_id_and_position() -> None:
    data = _doc("bsi-2022-0001.json")
    second = copy.deepcopy(data["vulnerabilities"][0])
    del data["vulnerabilities"][0]["cve"], second["cve"]
    data["vulnerabilities"].append(second)
    assert [a.id for a in parse_csaf(data)] == ["BSI-2022-0001#1", "BSI-2022-0001#2"]


def test_purl_identifies_rpm_with_epoch_and_pypi_and_deb() -> None:
    data = _doc("rhsa-2022_0011.json")
    product = data["product_tree"]["branches"][0]["branches"][2]["branches"][0]["product"]
    assert product["product_id"] == "telnet-1:0.17-65.el7_6.x86_64"
    product["name"] = "telnet (renamed, so only the purl can identify it)"
    # A version unlike the product id's, so the test shows which one was read.
    product["product_identification_helper"] = {"purl": "pkg:rpm/redhat/telnet@0.17-66.el7_9?arch=x86_64&epoch=2"}
    component = ProductTree(data["product_tree"]).component("7Server-7.6.E4S:telnet-1:0.17-65.el7_6.x86_64")
    assert component is not None
    assert (component.ecosystem, component.package, component.version, component.release) == (
        "Red Hat",
        "telnet",
        "2:0.17-66.el7_9",
        "7",
    )
    tree = ProductTree(
        {
            "full_product_names": [
                {"name": "a", "product_id": "A", "product_identification_helper": {"purl": "pkg:pypi/pillow@9.1.1"}},
                {
                    "name": "b",
                    "product_id": "B",
                    "product_identification_helper": {
                        "purl": "pkg:deb/debian/curl@7.88.1-10%2Bdeb12u5?distro=bookworm"
                    },
                },
            ]
        }
    )
    pypi, deb = tree.component("A"), tree.component("B")
    assert pypi is not None
    assert deb is not None
    assert (pypi.ecosystem, pypi.package, pypi.version, pypi.release) == ("PyPI", "pillow", "9.1.1", None)
    assert (deb.ecosystem, deb.package, deb.version, deb.release) == ("Debian", "curl", "7.88.1-10+deb12u5", "12")


def test_parse_purl() -> None:
    purl = parse_purl("pkg:npm/%40angular/core@16.0.0?arch=x#sub/path")
    assert purl is not None
    assert (purl.type, purl.namespace, purl.name, purl.version) == ("npm", "@angular", "core", "16.0.0")
    assert purl.qualifiers == {"arch": "x"}
    assert parse_purl("cpe:/a:x:y") is None
    assert parse_purl("pkg:pypi") is None


def test_known_affected_product_without_version_on_rhel_is_every_version() -> None:
    """Red Hat's VEX style: a bare package name on a RHEL platform, affected, no fix yet."""
    data = {
        "document": {"csaf_version": "2.0", "title": "kernel", "tracking": {"id": "CVE-2024-1"}},
        "product_tree": {
            "full_product_names": [
                {
                    "name": "Red Hat Enterprise Linux 9",
                    "product_id": "red_hat_enterprise_linux_9",
                    "product_identification_helper": {"cpe": "cpe:/o:redhat:enterprise_linux:9"},
                },
                {"name": "kernel", "product_id": "kernel"},
            ],
            "relationships": [
                {
                    "category": "default_component_of",
                    "full_product_name": {
                        "name": "kernel on RHEL 9",
                        "product_id": "red_hat_enterprise_linux_9:kernel",
                    },
                    "product_reference": "kernel",
                    "relates_to_product_reference": "red_hat_enterprise_linux_9",
                }
            ],
        },
        "vulnerabilities": [
            {"cve": "CVE-2024-1", "product_status": {"known_affected": ["red_hat_enterprise_linux_9:kernel"]}}
        ],
    }
    [advisory] = parse_csaf(data)
    assert advisory.aliases == ()  # the tracking id is the CVE itself
    assert advisory.affected == (
        Affected("Red Hat", "kernel", "9", ranges=(Range("ECOSYSTEM", (("introduced", "0"),)),)),
    )


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"id": "CVE-1"}, "not a CSAF document"),
        ({"document": {"title": "x"}, "vulnerabilities": []}, "not a CSAF document"),
        ({"document": {"csaf_version": "2.0", "tracking": {}}}, "tracking.id"),
    ],
)
def test_not_csaf_raises_value_error(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_csaf(data)
