"""Distribution packages advised under another ecosystem (gpufleet.assets.links, issue 23 item 5): the
NVIDIA Container Toolkit's deb/rpm against the real Go vulndb record GO-2024-3239 (CVE-2024-0132,
tests/fixtures/advisories), and the table an admin extends."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.assets.advisories.load import load_path
from gpufleet.assets.links import DEFAULT_LINKS, PackageLink, package_links, parse_link, upstream_version
from gpufleet.assets.matching import AdvisoryIndex, Matcher
from gpufleet.assets.records import Advisory, Affected, Distro, Installed, Range

ADVISORIES = Path(__file__).resolve().parents[1] / "fixtures" / "advisories"
JAMMY = Distro("Ubuntu", "22.04")
ROCKY_9 = Distro("Rocky Linux", "9")


def toolkit_record() -> Advisory:
    [(_, record)] = list(load_path(ADVISORIES / "GO-2024-3239.json"))
    return record


def findings(
    packages: list[Installed], distro: Distro, links: tuple[PackageLink, ...] = DEFAULT_LINKS
) -> list[tuple[str, ...]]:
    result = Matcher(AdvisoryIndex([toolkit_record()]), links).scan(packages, distro)
    return [(f.key(), f.installed.name, f.installed.version, f.fixed or "", *f.notes) for f in result.findings]


@pytest.mark.parametrize("name", ["nvidia-container-toolkit", "nvidia-container-toolkit-base"])
def test_a_vulnerable_toolkit_package_gets_the_go_modules_finding(name: str) -> None:
    note = "advised as Go github.com/NVIDIA/nvidia-container-toolkit: compared as version 1.16.1"
    assert findings([Installed("Ubuntu", name, "1.16.1-1", arch="amd64")], JAMMY) == [
        ("CVE-2024-0132", name, "1.16.1-1", "1.16.2", note)
    ]
    assert findings([Installed("Rocky Linux", name, "1.16.1-1", arch="x86_64")], ROCKY_9)[0][:4] == (
        "CVE-2024-0132",
        name,
        "1.16.1-1",
        "1.16.2",
    )


def test_the_fixed_toolkit_and_unlinked_packages_are_clear() -> None:
    assert findings([Installed("Ubuntu", "nvidia-container-toolkit", "1.16.2-1")], JAMMY) == []
    assert findings([Installed("Ubuntu", "nvidia-container-toolkit", "1.17.8-1")], JAMMY) == []
    assert findings([Installed("Ubuntu", "nvidia-container-toolkit", "1.16.1-1")], JAMMY, links=()) == []
    # A link is for distribution packages: a PyPI package of that name is not the toolkit.
    assert findings([Installed("PyPI", "nvidia-container-toolkit", "1.16.1")], JAMMY) == []


def test_an_admin_link_is_used_like_the_built_in_ones() -> None:
    """An NVIDIA-ecosystem advisory for a component gpufleet has no built-in link for."""
    fabric = Advisory(
        "NVIDIA-1",
        ("CVE-2099-0001",),
        "made-up advisory of a fabric manager package",
        "nvd",
        severity="high",
        affected=(
            Affected(
                "NVIDIA", "fabric-manager", None, (Range("ECOSYSTEM", (("introduced", "0"), ("fixed", "550.90.07"))),)
            ),
        ),
    )
    package = Installed("Ubuntu", "nvidia-fabricmanager-550", "550.54.15-1", arch="amd64")
    links = package_links(["nvidia-fabricmanager-550 = NVIDIA:fabric-manager"])
    result = Matcher(AdvisoryIndex([fabric]), links).scan([package], JAMMY)
    assert [(f.installed.name, f.fixed) for f in result.findings] == [("nvidia-fabricmanager-550", "550.90.07")]
    assert Matcher(AdvisoryIndex([fabric])).scan([package], JAMMY).findings == []
    assert set(DEFAULT_LINKS) <= set(links)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("nvidia-container-toolkit", "is not 'PACKAGE = ECOSYSTEM:NAME'"),
        ("nvidia-container-toolkit = github.com/NVIDIA/x", "is not 'PACKAGE = ECOSYSTEM:NAME'"),
        ("x = Cargo:y", "must be one of"),
        ("x = Ubuntu:y", "must be one of"),  # a distribution is matched directly, not through a link
    ],
)
def test_bad_links_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_link(text)


def test_upstream_versions() -> None:
    assert upstream_version("1.16.1-1", "semver") == "1.16.1"
    assert upstream_version("1:3.3.5", "dotted") == "3.3.5"
    assert upstream_version("1:4.1.1-1", "dotted") == "4.1.1"
    assert upstream_version("1.17.0~rc.1-1", "semver") == "1.17.0-rc.1"
    assert upstream_version("1.17.0~rc.1-1", "dotted") == "1.17.0~rc.1"
    assert str(parse_link(" a = Go:b ")) == "a = Go:b"


def test_nvd_names_reach_what_nodes_report() -> None:
    """The NVD names NVIDIA software by CPE: the container toolkit reaches the distribution package
    through its link, the CUDA toolkit the name the agent reports (version.json: "cuda-toolkit")."""
    from gpufleet.assets.advisories.nvd import parse_nvd
    from tests.assets.test_nvd import _with_matches

    [nvd] = parse_nvd(
        _with_matches(
            {"vulnerable": True, "criteria": "cpe:2.3:a:nvidia:cuda_toolkit:12.4.1:*:*:*:*:*:*:*"},
            {
                "vulnerable": True,
                "criteria": "cpe:2.3:a:nvidia:container_toolkit:*:*:*:*:*:*:*:*",
                "versionEndIncluding": "1.16.1",
            },
        )
    )
    packages = [
        Installed("Ubuntu", "nvidia-container-toolkit", "1.16.1-1"),
        Installed("Ubuntu", "nvidia-container-toolkit", "1.16.2-1", location="a newer one"),
        Installed("NVIDIA", "cuda-toolkit", "12.4.1", location="/usr/local/cuda-12.4"),
    ]
    result = Matcher(AdvisoryIndex([nvd])).scan(packages, JAMMY)
    assert [(f.installed.name, f.installed.version) for f in result.findings] == [
        ("nvidia-container-toolkit", "1.16.1-1"),
        ("cuda-toolkit", "12.4.1"),
    ]


def test_the_heads_evaluator_takes_the_admins_links_and_refuses_bad_ones() -> None:
    from pydantic import ValidationError

    from gpufleet.api.app import _evaluator
    from gpufleet.core.config import Settings
    from gpufleet.core.errors import ConfigError

    extra = "nvidia-fabricmanager-550 = NVIDIA:fabric-manager"
    evaluator = _evaluator(Settings(package_links=[extra]))
    assert parse_link(extra) in evaluator.links
    assert set(DEFAULT_LINKS) <= set(evaluator.links)
    with pytest.raises(ConfigError, match=r"package_links: .*must be one of"):
        _evaluator(Settings(package_links=["x = Cargo:y"]))
    with pytest.raises(ValidationError, match="PACKAGE = ECOSYSTEM:NAME"):
        Settings(package_links=["nvidia-container-toolkit"])
