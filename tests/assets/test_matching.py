"""Matching installed packages against advisories: ecosystems and releases, source packages and the
binary packages an advisory lists, source RPMs, range events, version lists, one finding per CVE, and
versions that cannot be judged. Ubuntu's glibc records are real (tests/fixtures/advisories)."""

from __future__ import annotations

from pathlib import Path

from gpufleet.assets.advisories.load import load_path
from gpufleet.assets.matching import BINARY_NAME_NOTE, AdvisoryIndex, Matcher, targets, verdict
from gpufleet.assets.records import Advisory, Affected, Distro, Installed, Range

ADVISORIES = Path(__file__).resolve().parents[1] / "fixtures" / "advisories"

BOOKWORM = Distro("Debian", "12")
JAMMY = Distro("Ubuntu", "22.04")


def fixed_at(version: str, introduced: str = "0") -> tuple[Range, ...]:
    return (Range("ECOSYSTEM", (("introduced", introduced), ("fixed", version))),)


def advisory(id_: str, *affected: Affected, aliases: tuple[str, ...] = (), severity: str = "high") -> Advisory:
    return Advisory(id_, aliases, "summary", "osv", severity=severity, affected=affected)  # type: ignore[arg-type]


GLIBC = advisory(
    "DSA-9999-1",
    Affected("Debian", "glibc", "12", fixed_at("2.36-9+deb12u4"), fixed="2.36-9+deb12u4"),
    aliases=("CVE-2023-4911",),
)


def scan(
    advisories: list[Advisory], packages: list[Installed], distro: Distro | None = BOOKWORM
) -> list[tuple[str, str, str | None]]:
    result = Matcher(AdvisoryIndex(advisories)).scan(packages, distro)
    return [(f.advisory.id, f.installed.name, f.fixed) for f in result.findings]


def libc6(version: str, source_version: str | None = None) -> Installed:
    return Installed("Debian", "libc6", version, "glibc", source_version or version, "amd64")


def test_a_binary_package_matches_through_its_source_package() -> None:
    assert scan([GLIBC], [libc6("2.36-9+deb12u3")]) == [("DSA-9999-1", "libc6", "2.36-9+deb12u4")]


def test_the_fixed_version_and_later_are_not_affected() -> None:
    assert scan([GLIBC], [libc6("2.36-9+deb12u4")]) == []
    assert scan([GLIBC], [libc6("2.36-9+deb12u10")]) == []  # u10 > u4: digits compare as numbers


def test_another_release_or_distribution_is_not_touched() -> None:
    assert scan([GLIBC], [libc6("2.36-9+deb12u3")], Distro("Debian", "11")) == []
    ubuntu = Installed("Ubuntu", "libc6", "2.35-0ubuntu3.1", "glibc", "2.35-0ubuntu3.1")
    assert scan([GLIBC], [ubuntu], JAMMY) == []


def test_an_epoch_outranks_the_rest_of_the_version() -> None:
    epoch = advisory("DSA-1", Affected("Debian", "automake-1.16", "12", fixed_at("1:1.16.5-1.3")))
    pkg = Installed("Debian", "automake", "1.16.5-1.3ubuntu1", "automake-1.16", "1.16.5-1.3ubuntu1")
    assert scan([epoch], [pkg]) == [("DSA-1", "automake", "1:1.16.5-1.3")]  # no epoch: older than any 1:
    newer = Installed("Debian", "automake", "1:1.16.5-1.3", "automake-1.16", "1:1.16.5-1.3")
    assert scan([epoch], [newer]) == []


def test_without_a_source_name_the_binary_name_is_tried_and_the_finding_says_so() -> None:
    sudo = advisory("DSA-2", Affected("Ubuntu", "sudo", "22.04", fixed_at("1.9.9-1ubuntu2.1")))
    result = Matcher(AdvisoryIndex([sudo])).scan([Installed("Ubuntu", "sudo", "1.9.9-1ubuntu2")], JAMMY)
    ((finding),) = result.findings
    assert finding.notes == (BINARY_NAME_NOTE,)
    assert scan([GLIBC], [Installed("Debian", "libc6", "2.36-9")]) == []  # libc6 is not glibc: missed


def test_range_events_last_affected_limit_and_version_lists() -> None:
    last = Affected("PyPI", "jinja2", None, (Range("ECOSYSTEM", (("introduced", "2.0"), ("last_affected", "2.11.2"))),))
    assert verdict(last, "2.11.2") == (True, None)
    assert verdict(last, "2.11.3") == (False, None)
    assert verdict(last, "1.9") == (False, None)
    limited = Affected("Go", "x", None, (Range("SEMVER", (("introduced", "0"), ("limit", "1.5.0"))),))
    assert verdict(limited, "1.4.9") == (True, None)
    assert verdict(limited, "1.5.0") == (False, None)
    listed = Affected("PyPI", "pillow", None, (), versions=("9.5.0", "10.0.0"), fixed="10.0.1")
    assert verdict(listed, "10.0.0") == (True, "10.0.1")
    assert verdict(listed, "10.0.1") == (False, None)
    two = Affected(
        "PyPI",
        "p",
        None,
        (Range("ECOSYSTEM", (("introduced", "1.0"), ("fixed", "1.2"), ("introduced", "2.0"), ("fixed", "2.3"))),),
    )
    assert [verdict(two, v) for v in ("0.9", "1.1", "1.5", "2.0", "2.3")] == [
        (False, None),
        (True, "1.2"),
        (False, None),
        (True, "2.3"),
        (False, None),
    ]


def test_pypi_names_are_compared_normalized() -> None:
    requests = advisory("PYSEC-2023-74", Affected("PyPI", "Requests", None, fixed_at("2.31.0")))
    assert scan([requests], [Installed("PyPI", "requests", "2.28.1")], None) == [
        ("PYSEC-2023-74", "requests", "2.31.0")
    ]
    assert scan([requests], [Installed("PyPI", "requests", "2.31.0")], None) == []


def test_one_problem_in_several_feeds_is_one_finding() -> None:
    osv = advisory(
        "PYSEC-2023-74",
        Affected("PyPI", "requests", None, fixed_at("2.31.0")),
        aliases=("CVE-2023-32681",),
        severity="medium",
    )
    ghsa = advisory(
        "GHSA-j8r2-6x86-q33q",
        Affected("PyPI", "requests", None, fixed_at("2.31.0", "2.3.0")),
        aliases=("CVE-2023-32681",),
    )
    result = Matcher(AdvisoryIndex([osv, ghsa])).scan([Installed("PyPI", "requests", "2.28.1")], None)
    ((finding),) = result.findings
    assert finding.advisory.id == "GHSA-j8r2-6x86-q33q"  # the more severe record leads
    assert finding.also == ("PYSEC-2023-74",)
    assert finding.advisory.key() == "CVE-2023-32681"


def test_a_version_that_cannot_be_read_is_reported_not_guessed() -> None:
    odd = advisory("X-1", Affected("PyPI", "torch", None, fixed_at("1.13.1")))
    result = Matcher(AdvisoryIndex([odd])).scan([Installed("PyPI", "torch", "not-a-version")], None)
    assert result.findings == []
    assert [(p.name, a) for p, a, _ in result.unjudged] == [("torch", "X-1")]


def test_driver_versions_compare_as_numbers() -> None:
    driver = advisory("CVE-2024-0090", Affected("NVIDIA", "driver", None, fixed_at("550.90.07", "550")))
    assert scan([driver], [Installed("NVIDIA", "driver", "550.54.15")], BOOKWORM) == [
        ("CVE-2024-0090", "driver", "550.90.07")
    ]
    assert scan([driver], [Installed("NVIDIA", "driver", "550.90.07")], BOOKWORM) == []
    assert scan([driver], [Installed("NVIDIA", "driver", "535.183.01")], BOOKWORM) == []  # before 550: another branch


# -- binary and source package names (issue 23, item 1) -----------------------------------------------


def _real(name: str) -> Advisory:
    [(_, record)] = list(load_path(ADVISORIES / name))
    return record


def test_binary_names_match_through_the_binaries_an_ubuntu_advisory_lists() -> None:
    """Ubuntu's real glibc record names the source `glibc` and lists libc6, libc-bin, locales...: a
    list of binary names alone (apt list, dpkg -l) is matched through that list, with no guess."""
    glibc = _real("UBUNTU-CVE-2023-4911.json")
    binaries = [Installed("Ubuntu", name, "2.35-0ubuntu3.1", arch="amd64") for name in ("libc6", "libc-bin", "locales")]
    result = Matcher(AdvisoryIndex([glibc])).scan([*binaries, Installed("Ubuntu", "bash", "5.1-6ubuntu1")], JAMMY)
    assert [(f.installed.name, f.fixed, f.notes) for f in result.findings] == [
        ("libc6", "2.35-0ubuntu3.4", ()),
        ("libc-bin", "2.35-0ubuntu3.4", ()),
        ("locales", "2.35-0ubuntu3.4", ()),
    ]
    fixed = Installed("Ubuntu", "libc6", "2.35-0ubuntu3.4")
    assert Matcher(AdvisoryIndex([glibc])).scan([fixed], JAMMY).findings == []
    noble = Installed("Ubuntu", "libc6", "2.35-0ubuntu3.1")  # a jammy version on a 24.04 node: noble's entry
    assert [f.fixed for f in Matcher(AdvisoryIndex([glibc])).scan([noble], Distro("Ubuntu", "24.04")).findings] == [
        "2.38-1ubuntu6"
    ]


def test_the_binary_list_works_from_the_heads_lazy_index_too() -> None:
    glibc = _real("UBUNTU-CVE-2023-4911.json")
    index = AdvisoryIndex()
    index.add_lazy(targets(glibc), lambda: glibc)
    assert ("Ubuntu", "22.04", "binary:libc-bin") in targets(glibc)
    ((finding),) = Matcher(index).scan([Installed("Ubuntu", "libc-bin", "2.35-0ubuntu3.3")], JAMMY).findings
    assert finding.advisory.id == "UBUNTU-CVE-2023-4911"


def test_source_and_binary_names_finding_one_advisory_make_one_finding() -> None:
    glibc = _real("UBUNTU-CVE-2023-4911.json")
    both = Installed("Ubuntu", "libc6", "2.35-0ubuntu3.1", "glibc", "2.35-0ubuntu3.1")
    ((finding),) = Matcher(AdvisoryIndex([glibc])).scan([both], JAMMY).findings
    assert (finding.advisory.id, finding.also, finding.notes) == ("UBUNTU-CVE-2023-4911", (), ())


def test_a_notice_of_several_cves_joins_the_finding_of_its_cve() -> None:
    """USN-6409-1 fixes CVE-2023-4527 and CVE-2023-4911; on jammy's libc-bin it is the 4911 finding's
    `also`, not a second problem named after 4527."""
    records = [_real("USN-6409-1.json"), _real("UBUNTU-CVE-2023-4911.json")]
    result = Matcher(AdvisoryIndex(records)).scan([Installed("Ubuntu", "libc-bin", "2.35-0ubuntu3.1")], JAMMY)
    ((finding),) = result.findings
    assert (finding.key(), finding.advisory.id, finding.also) == (
        "CVE-2023-4911",
        "UBUNTU-CVE-2023-4911",
        ("USN-6409-1",),
    )
    alone = Matcher(AdvisoryIndex(records[:1])).scan([Installed("Ubuntu", "libc-bin", "2.35-0ubuntu3.1")], JAMMY)
    assert [f.key() for f in alone.findings] == ["CVE-2023-4527"]  # alone, it keeps its own key


def test_rpm_packages_match_by_binary_and_by_source_rpm_name() -> None:
    rocky = Distro("Rocky Linux", "9")
    by_source = advisory("RLSA-1", Affected("Rocky Linux", "glibc", "9", fixed_at("2.34-100.el9_4.2")))
    langpack = Installed("Rocky Linux", "glibc-langpack-en", "2.34-100.el9", "glibc", "2.34-100.el9", "x86_64")
    assert scan([by_source], [langpack], rocky) == [("RLSA-1", "glibc-langpack-en", "2.34-100.el9_4.2")]
    by_binary = advisory("RLSA-2", Affected("Rocky Linux", "glibc-langpack-en", "9", fixed_at("2.34-100.el9_4.2")))
    assert sorted(scan([by_binary, by_source], [langpack], rocky)) == [
        ("RLSA-1", "glibc-langpack-en", "2.34-100.el9_4.2"),
        ("RLSA-2", "glibc-langpack-en", "2.34-100.el9_4.2"),
    ]
    without_source = Installed("Rocky Linux", "glibc-langpack-en", "2.34-100.el9")
    assert scan([by_source], [without_source], rocky) == []
