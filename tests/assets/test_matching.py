"""Matching installed packages against advisories: ecosystems and releases, source packages, range
events, version lists, one finding per CVE, and versions that cannot be judged."""

from __future__ import annotations

from gpufleet.assets.matching import BINARY_NAME_NOTE, AdvisoryIndex, Matcher, verdict
from gpufleet.assets.records import Advisory, Affected, Distro, Installed, Range

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
