"""gpufleet cve scan on real data, as a CI pipeline runs it (the console entry, no server): real
inventories (Colab's pip freeze and apt list, an H200's package lists) against real advisories (OSV
from PyPA, Debian and Ubuntu; NVD 2.0; CSAF from Red Hat), with the boundary cases: installed ==
fixed, another distribution release, an epoch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.test_logs_cli import gpufleet
from tests.conftest import FIXTURES

ADVISORIES = str(FIXTURES / "advisories")
SOFTWARE = FIXTURES / "software"


def scan(inventory: Path | str, *extra: str) -> tuple[list[dict[str, object]], str, int]:
    result = gpufleet("cve", "scan", "--inventory", str(inventory), "--advisories", ADVISORIES, "-o", "json", *extra)
    return (json.loads(result.stdout) if result.stdout.strip() else []), result.stderr, result.returncode


def seen(findings: list[dict[str, object]]) -> set[tuple[object, ...]]:
    return {(f["advisory"], f["package"], f["installed"], f["fixed"]) for f in findings}


def test_colabs_pip_freeze_finds_pillow_and_requests_but_not_jinja2_at_its_fix() -> None:
    findings, stderr, code = scan(SOFTWARE / "2023-02-22_e0be326_pip-freeze.txt")
    assert code == 0, stderr
    assert seen(findings) == {
        ("PYSEC-2022-42979", "pillow", "7.1.2", "9.2.0"),
        ("PYSEC-2023-175", "pillow", "7.1.2", "10.0.1"),
        ("PYSEC-2023-74", "requests", "2.25.1", "2.31.0"),
    }  # Jinja2==2.11.3 is PYSEC-2021-66's fixed version: not affected
    requests = next(f for f in findings if f["package"] == "requests")
    assert requests["aliases"] == ["CVE-2023-32681", "GHSA-j8r2-6x86-q33q"]
    assert {"advisory", "aliases", "package", "installed", "fixed", "severity"} <= set(requests)
    assert "3 findings in 413 packages against" in stderr


def test_the_h200s_current_packages_are_clear_and_the_scan_says_what_it_could_not_see() -> None:
    findings, stderr, code = scan(SOFTWARE / "pip-freeze.txt")
    assert (findings, code) == ([], 0)
    findings, stderr, code = scan(SOFTWARE / "dpkg-query.tsv", "--distro", "ubuntu:24.04")
    assert (findings, code) == ([], 0)
    assert "matched by binary name" in stderr  # a 3-column dpkg-query names no source packages
    assert "(Ubuntu 24.04)" in stderr


def dpkg_query(tmp_path: Path, *rows: str) -> Path:
    """The issue's 5-column dpkg-query format; the rows are real packages at real versions."""
    path = tmp_path / "dpkg-query.tsv"
    path.write_text("".join(row + "\n" for row in rows))
    return path


def test_a_debian_advisory_touches_its_release_only_and_not_its_fixed_version(tmp_path: Path) -> None:
    wheezy2 = dpkg_query(tmp_path, "nginx-full\t1.2.1-2.2+wheezy2\tamd64\tnginx\t1.2.1-2.2+wheezy2")
    findings, _, _ = scan(wheezy2, "--distro", "debian:7")
    assert seen(findings) == {("DSA-3029-1", "nginx-full", "1.2.1-2.2+wheezy2", "1.2.1-2.2+wheezy3")}
    assert findings[0]["aliases"] == ["CVE-2014-3616"]
    assert scan(wheezy2, "--distro", "debian:8")[0] == []  # another release
    assert scan(wheezy2, "--distro", "ubuntu:14.04")[0] == []  # another distribution
    fixed = dpkg_query(tmp_path, "nginx-full\t1.2.1-2.2+wheezy3\tamd64\tnginx\t1.2.1-2.2+wheezy3")
    assert scan(fixed, "--distro", "debian:7")[0] == []  # installed == fixed


def test_an_ubuntu_kernel_advisory_matches_through_the_source_package_on_its_release(tmp_path: Path) -> None:
    kernel = dpkg_query(tmp_path, "linux-image-3.13.0-24-generic\t3.13.0-24.47\tamd64\tlinux\t3.13.0-24.47")
    findings, _, _ = scan(kernel, "--distro", "ubuntu:14.04")
    assert seen(findings) == {("UBUNTU-CVE-2025-38094", "linux-image-3.13.0-24-generic", "3.13.0-24.47", None)}
    assert scan(kernel, "--distro", "ubuntu:24.04")[0] == []


def test_an_rpm_epoch_outranks_the_version(tmp_path: Path) -> None:
    older = tmp_path / "rpm.tsv"
    older.write_text("telnet\t0.17-66.el7\tx86_64\n")  # no epoch: 0, below the fix's epoch 1
    findings, _, _ = scan(older, "--distro", "rhel:7")
    assert seen(findings) == {("CVE-2020-10188", "telnet", "0.17-66.el7", "1:0.17-65.el7_6")}
    assert "RHSA-2022:0011" in findings[0]["aliases"]  # type: ignore[operator]
    fixed = tmp_path / "rpm-fixed.tsv"
    fixed.write_text("telnet\t1:0.17-65.el7_6\tx86_64\n")
    assert scan(fixed, "--distro", "rhel:7")[0] == []


def test_a_driver_on_an_affected_branch_is_found_by_nvd_configurations(tmp_path: Path) -> None:
    export = tmp_path / "export.json"
    packages = [{"ecosystem": "NVIDIA", "name": "driver", "version": v} for v in ("525.85.12",)]
    export.write_text(json.dumps({"format": "gpufleet-software/1", "distro": None, "packages": packages}))
    findings, stderr, _ = scan(export)
    assert seen(findings) == {("CVE-2023-0184", "driver", "525.85.12", "525.105.17")}, stderr
    packages[0]["version"] = "580.159.04"  # the H200's driver: a later branch
    export.write_text(json.dumps({"format": "gpufleet-software/1", "distro": None, "packages": packages}))
    assert scan(export)[0] == []


def test_fail_on_sets_the_exit_status_for_pipelines(tmp_path: Path) -> None:
    older = tmp_path / "rpm.tsv"
    older.write_text("telnet\t0.17-66.el7\tx86_64\n")
    assert scan(older, "--distro", "rhel:7", "--fail-on", "high")[2] == 1  # RHSA-2022:0011 is high
    assert scan(older, "--distro", "rhel:7", "--fail-on", "critical")[2] == 0
    # PYSEC records carry no severity: unknown is below low, so it never fails a pipeline
    assert scan(SOFTWARE / "2023-02-22_e0be326_pip-freeze.txt", "--fail-on", "low")[2] == 0


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    _, stderr, code = scan(SOFTWARE / "2023-02-22_e0be326_apt-list.txt")
    assert code == 2
    assert "give --distro" in stderr
    bad = tmp_path / "bad.json"
    bad.write_text('{"not": "an advisory"}')
    result = gpufleet("cve", "scan", "--inventory", str(SOFTWARE / "pip-freeze.txt"), "--advisories", str(bad))
    assert result.returncode == 2
    assert str(bad) in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_gpufleets_own_export_from_a_real_h200_is_clear_until_its_driver_is_an_old_branch(tmp_path: Path) -> None:
    """The export the agent's collector wrote on a real H200 (bench/device_software_check.sh)."""
    export = SOFTWARE / "h200-gpufleet-export.json"
    findings, stderr, code = scan(export)
    assert (findings, code) == ([], 0), stderr
    assert "(Ubuntu 24.04)" in stderr
    data = json.loads(export.read_text())
    nvidia = {p["name"]: p["version"] for p in data["packages"] if p["ecosystem"] == "NVIDIA"}
    assert (nvidia["driver"], nvidia["cuda-driver"]) == ("580.159.04", "13.0")
    for package in data["packages"]:
        if package["name"] == "driver":
            package["version"] = "525.85.12"
    older = tmp_path / "older.json"
    older.write_text(json.dumps(data))
    assert seen(scan(older)[0]) == {("CVE-2023-0184", "driver", "525.85.12", "525.105.17")}


# -- issue 23, items 1-5 -------------------------------------------------------------------------------


def test_an_apt_list_of_a_half_upgraded_jammy_machine_finds_glibc_by_binary_name() -> None:
    """Colab's real jammy list: libc-bin left at 2.35-0ubuntu3.1 while libc6 reached the fix 3.4.
    Ubuntu's glibc records name the source `glibc`; the list names binaries only."""
    findings, stderr, code = scan(SOFTWARE / "0042aa2_apt-list-jammy-excerpt.txt", "--distro", "ubuntu:22.04")
    assert code == 0, stderr
    assert seen(findings) == {("UBUNTU-CVE-2023-4911", "libc-bin", "2.35-0ubuntu3.1", "2.35-0ubuntu3.4")}
    [finding] = findings
    assert (finding["problem"], finding["severity"], finding["cvss_score"]) == ("CVE-2023-4911", "high", 7.8)
    assert finding["aliases"] == ["CVE-2023-4911", "USN-6409-1"]
    assert finding["also"] == ["USN-6409-1"]
    assert finding["notes"] == []  # found through the record's binary list: no guess to own up to


def test_advisories_take_several_paths_after_one_flag_or_repeated() -> None:
    inventory = str(SOFTWARE / "0042aa2_apt-list-jammy-excerpt.txt")
    names = ("DSA-3029-1.json", "USN-6409-1.json", "UBUNTU-CVE-2023-4911.json")
    paths = [str(FIXTURES / "advisories" / name) for name in names]
    after_one = gpufleet(
        "cve", "scan", "--inventory", inventory, "--distro", "ubuntu:22.04", "--advisories", *paths, "-o", "json"
    )
    assert after_one.returncode == 0, after_one.stderr
    assert "against 3 advisories" in after_one.stderr
    repeated = [arg for path in paths for arg in ("--advisories", path)]
    again = gpufleet("cve", "scan", "--inventory", inventory, "--distro", "ubuntu:22.04", *repeated, "-o", "json")
    assert (again.returncode, again.stdout) == (0, after_one.stdout)
    assert {f["advisory"] for f in json.loads(after_one.stdout)} == {"UBUNTU-CVE-2023-4911"}


def test_dpkg_l_is_accepted(tmp_path: Path) -> None:
    findings, stderr, code = scan(SOFTWARE / "debian12-dpkg-l.txt", "--distro", "debian:12")
    assert (findings, code) == ([], 0), stderr
    assert "724 packages (Debian 12)" in stderr
    assert "matched by binary name" in stderr


def test_a_vulnerable_container_toolkit_package_is_found_through_its_go_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real list with the toolkit's deb added in the shape apt prints it (NVIDIA's repository names
    no suite: "/unknown", as Colab's CUDA packages show)."""
    listing = (SOFTWARE / "0042aa2_apt-list-jammy-excerpt.txt").read_text()
    toolkit = "nvidia-container-toolkit/unknown,now 1.16.1-1 amd64 [installed]\n"
    inventory = tmp_path / "apt-list.txt"
    inventory.write_text(listing + toolkit)
    findings, stderr, _ = scan(inventory, "--distro", "ubuntu:22.04")
    assert ("GO-2024-3239", "nvidia-container-toolkit", "1.16.1-1", "1.16.2") in seen(findings), stderr
    inventory.write_text(listing + toolkit.replace("1.16.1-1", "1.16.2-1"))
    assert all(f["package"] != "nvidia-container-toolkit" for f in scan(inventory, "--distro", "ubuntu:22.04")[0])
    # An admin's own link, from the setting or the command line; a bad one is one clear line.
    inventory.write_text(listing + "nvidia-ctk-fork/unknown,now 1.16.1-1 amd64 [installed]\n")
    assert all(f["package"] != "nvidia-ctk-fork" for f in scan(inventory, "--distro", "ubuntu:22.04")[0])
    link = "nvidia-ctk-fork = Go:github.com/NVIDIA/nvidia-container-toolkit"
    linked = seen(scan(inventory, "--distro", "ubuntu:22.04", "--link", link)[0])
    assert ("GO-2024-3239", "nvidia-ctk-fork", "1.16.1-1", "1.16.2") in linked
    monkeypatch.setenv("GPUFLEET_PACKAGE_LINKS", json.dumps([link]))
    assert seen(scan(inventory, "--distro", "ubuntu:22.04")[0]) == linked
    _, stderr, code = scan(inventory, "--distro", "ubuntu:22.04", "--link", "x = Cargo:y")
    assert code == 2
    assert "must be one of" in stderr
    assert "Traceback" not in stderr


def test_a_truncated_advisory_is_one_line_naming_the_file(tmp_path: Path) -> None:
    cut = tmp_path / "PYSEC-2023-74.yaml"
    text = (FIXTURES / "advisories" / "PYSEC-2023-74.yaml").read_text()
    cut.write_text(text[: text.index("aliases:")])  # cut at a line end: still valid YAML
    result = gpufleet("cve", "scan", "--inventory", str(SOFTWARE / "pip-freeze.txt"), "--advisories", str(cut))
    assert result.returncode == 2
    assert str(cut) in result.stderr
    assert "'modified'" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
