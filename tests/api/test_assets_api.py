"""The assets and CVE API over HTTP: agents report their software, advisories are imported, the
leader's pass finds what they touch, and people read the report, judge findings and compare nodes."""

from __future__ import annotations

import re
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gpufleet.assets.advisories.load import load_path
from gpufleet.assets.installed import detect_and_parse, parse_distro_arg
from gpufleet.assets.records import Installed, advisory_to_json
from gpufleet.protocol.software import SoftwareInventory, SoftwarePackage, package_digest
from tests.api.dashboard_helpers import logged_in
from tests.api.test_channel import _credential
from tests.conftest import FIXTURES

# One database: HTTP translation.
pytestmark = pytest.mark.one_database

SOFTWARE = FIXTURES / "software"


def inventory(
    packages: list[Installed], distro: str | None = "Ubuntu 24.04", kernel: str = "6.8.0-60-generic"
) -> dict[str, Any]:
    wire = [SoftwarePackage(**vars(p)) for p in packages]
    ecosystem, release = distro.split() if distro else (None, None)
    report = SoftwareInventory(
        distro_ecosystem=ecosystem, distro_release=release, kernel=kernel, packages=wire, digest=package_digest(wire)
    )
    return report.model_dump(mode="json")


def h200() -> list[Installed]:
    """The H200's real dpkg list and pip freeze, and its real driver."""
    dpkg = detect_and_parse((SOFTWARE / "dpkg-query.tsv").read_text(), parse_distro_arg("ubuntu:24.04")).packages
    pip = detect_and_parse((SOFTWARE / "pip-freeze.txt").read_text(), None).packages
    return [*dpkg, *pip, Installed("NVIDIA", "driver", "580.159.04"), Installed("Linux", "kernel", "6.8.0-60-generic")]


def colab() -> list[Installed]:
    """Colab's real pip freeze, on a node with an old driver branch."""
    pip = detect_and_parse((SOFTWARE / "2023-02-22_e0be326_pip-freeze.txt").read_text(), None).packages
    return [*pip, Installed("NVIDIA", "driver", "525.85.12"), Installed("Linux", "kernel", "5.15.0-60-generic")]


def put(client: TestClient, name: str, body: dict[str, Any]) -> int:
    credential = _credential(client, name)
    return client.put(
        "/api/v1/agent/software", json=body, headers={"Authorization": f"Bearer {credential}"}
    ).status_code


@pytest.fixture
def evaluated(client: TestClient) -> TestClient:
    assert put(client, "gpu01", inventory(h200())) == 204
    assert put(client, "gpu02", inventory(h200())) == 204
    assert put(client, "old01", inventory(colab(), distro=None)) == 204
    advisories = [
        advisory_to_json(a) for path in sorted((FIXTURES / "advisories").iterdir()) for _, a in load_path(path)
    ]
    imported = client.post("/api/v1/cve/advisories", json={"advisories": advisories})
    assert imported.status_code == 200, imported.text
    assert imported.json() == {"new": len(advisories), "updated": 0, "unchanged": 0}
    ctx = client.app.state.ctx  # type: ignore[attr-defined]
    ctx.loops.lead_once()
    assert ctx.assets.evaluate_once() is not None
    return client


def test_the_report_names_the_problems_their_nodes_and_fixes(evaluated: TestClient) -> None:
    found = evaluated.get("/api/v1/cve/report").json()
    by_problem = {p["problem"]: p for p in found}
    assert set(by_problem) == {"CVE-2023-0184", "CVE-2022-45198", "CVE-2023-32681", "PYSEC-2023-175"}
    driver = by_problem["CVE-2023-0184"]
    assert (driver["severity"], driver["cvss_score"], driver["hostlist"]) == ("high", 7.8, "old01")
    assert driver["packages"] == [
        {"ecosystem": "NVIDIA", "package": "driver", "installed": ["525.85.12"], "fixed": "525.105.17"}
    ]
    assert found[0]["problem"] == "CVE-2023-0184"  # the most severe first
    assert evaluated.get("/api/v1/cve/report", params={"node": "gpu01"}).json() == []  # the H200s are clear
    again = evaluated.post(
        "/api/v1/cve/advisories",
        json={"advisories": [advisory_to_json(a) for _, a in load_path(FIXTURES / "advisories" / "DSA-3029-1.json")]},
    )
    assert again.json() == {"new": 0, "updated": 0, "unchanged": 1}


def test_a_finding_is_judged_with_who_and_why(evaluated: TestClient) -> None:
    findings = evaluated.get("/api/v1/cve/findings", params={"node": "old01"}).json()
    requests = next(f for f in findings if f["package"] == "requests")
    refused = evaluated.patch(f"/api/v1/cve/findings/{requests['id']}", json={"status": "accepted"})
    assert refused.status_code == 400
    assert "reason is required" in refused.text
    judged = evaluated.patch(
        f"/api/v1/cve/findings/{requests['id']}", json={"status": "accepted", "reason": "no proxies"}
    )
    assert judged.status_code == 200
    assert (judged.json()["status"], judged.json()["status_by"], judged.json()["status_reason"]) == (
        "accepted",
        "token:initial admin#1",
        "no proxies",
    )
    open_only = evaluated.get("/api/v1/cve/findings", params={"node": "old01", "status": "open"}).json()
    assert "requests" not in {f["package"] for f in open_only}


def test_an_upgrade_reported_by_the_agent_fixes_the_finding(evaluated: TestClient) -> None:
    ctx = evaluated.app.state.ctx  # type: ignore[attr-defined]
    upgraded = [p if p.name != "driver" else Installed("NVIDIA", "driver", "525.105.17") for p in colab()]
    assert put(evaluated, "old01", inventory(upgraded, distro=None)) == 204
    ctx.assets.evaluate_once()
    assert "CVE-2023-0184" not in {p["problem"] for p in evaluated.get("/api/v1/cve/report").json()}
    fixed = evaluated.get("/api/v1/cve/report", params={"status": "fixed"}).json()
    assert [p["problem"] for p in fixed] == ["CVE-2023-0184"]


def test_software_views_show_diff_where_matrix_and_drift(evaluated: TestClient) -> None:
    shown = evaluated.get("/api/v1/assets/nodes/gpu01", params={"ecosystem": "NVIDIA"}).json()
    assert (shown["distro"], shown["kernel"], [p["version"] for p in shown["packages"]]) == (
        "Ubuntu 24.04",
        "6.8.0-60-generic",
        ["580.159.04"],
    )
    diff = evaluated.get("/api/v1/assets/diff", params={"a": "gpu01", "b": "old01"}).json()
    assert {"ecosystem": "NVIDIA", "name": "driver", "location": None, "a": "580.159.04", "b": "525.85.12"} in diff[
        "changed"
    ]
    assert evaluated.get("/api/v1/assets/diff", params={"a": "gpu01", "b": "gpu02"}).json()["changed"] == []
    where = evaluated.get("/api/v1/assets/where", params={"package": "driver", "versions": ">=525,<525.105.17"}).json()
    assert [w["node"] for w in where] == ["old01"]
    automake = evaluated.get("/api/v1/assets/where", params={"package": "automake", "versions": ">=1:1.16"}).json()
    assert [w["node"] for w in automake] == ["gpu01", "gpu02"]  # epoch 1 sorts above 1.16 without one
    assert evaluated.get("/api/v1/assets/where", params={"package": "x", "versions": "~>1"}).status_code == 400
    matrix = evaluated.get("/api/v1/assets/matrix").json()
    assert matrix["driver"] == {"525.85.12": ["old01"], "580.159.04": ["gpu01", "gpu02"]}
    drift = evaluated.get("/api/v1/assets/drift").json()
    driver = next(d for d in drift if d["software"] == "driver")
    assert (driver["baseline"], driver["nodes"]) == ("580.159.04", {"525.85.12": ["old01"]})
    assert driver["summary"] == "(none): 1 node run driver 525.85.12; the category mostly runs 580.159.04"


def test_bad_reports_are_refused_and_viewers_see_no_vulnerabilities(client: TestClient) -> None:
    body = inventory(h200())
    body["digest"] = "not a digest"
    assert put(client, "gpu01", body) == 400
    huge = inventory([Installed("PyPI", f"p{i}", "1.0", location="x" * 1000) for i in range(9000)])
    assert put(client, "gpu02", huge) == 413
    viewer = logged_in(client, "viewer")
    assert viewer.get("/api/v1/cve/report").status_code == 403
    assert viewer.get("/api/v1/assets/matrix").status_code == 403
    assert client.post("/api/v1/cve/advisories", json={"advisories": [{"id": "X"}]}).status_code == 400


def test_a_big_but_legal_report_fits(client: TestClient) -> None:
    many = [Installed("PyPI", f"package-{i}", f"1.{i}", location="/opt/conda") for i in range(15_000)]
    assert put(client, "big01", inventory(many)) == 204
    assert len(client.get("/api/v1/assets/nodes/big01").json()["packages"]) == 15_000


def test_the_software_page_shows_problems_versions_and_drift(evaluated: TestClient) -> None:
    operator = logged_in(evaluated, "operator", "olga")
    page = operator.get("/software")
    assert page.status_code == 200
    problems = re.findall(r'<tr data-problem="([^"]+)" data-severity="([^"]+)"', page.text)
    assert problems[0] == ("CVE-2023-0184", "high")
    assert len(problems) == 4
    assert "driver 525.85.12 → 525.105.17" in page.text
    row = re.search(r'<tr data-software="driver" data-version="580.159.04">(.*?)</tr>', page.text)
    assert row is not None
    assert "2: gpu01, gpu02" in row.group(1)
    assert "1 node run driver 525.85.12; the category mostly runs 580.159.04" in page.text
    assert 'href="/software"' in page.text.split('aria-label="Main"', 1)[1].split("</nav>", 1)[0]
    high = operator.get("/software?severity=critical")
    assert re.findall(r'<tr data-problem="([^"]+)"', high.text) == []
    assert operator.get("/software?status=broken").status_code == 400
    viewer = logged_in(evaluated, "viewer", "vera")
    assert viewer.get("/software").status_code == 403
    assert 'href="/software"' not in viewer.get("/nodes").text
