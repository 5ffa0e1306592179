"""Version ordering per ecosystem: dpkg's (checked against python-debian), PEP 440, RPM, semver and
the dotted versions of drivers and firmware."""

from __future__ import annotations

from functools import cmp_to_key
from pathlib import Path

import pytest
from debian.debian_support import Version as DebianVersion
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.assets.versions import InvalidVersion, compare, sort_key

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def reference(a: str, b: str) -> int:
    va, vb = DebianVersion(a), DebianVersion(b)
    return (va > vb) - (va < vb)


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("1.0~rc1", "1.0", -1),  # a tilde sorts before the end
        ("1.0", "1.0a", -1),  # letters after the end
        ("1.0a", "1.0+", -1),  # letters before other characters
        ("1.0", "1.00", 0),  # digit runs are numbers
        ("1:1.0", "2.0", 1),  # the epoch first
        ("2.31-0ubuntu9.9", "2.31-0ubuntu9.10", -1),
        ("1.0", "1.0-0", 0),  # no revision is revision 0
        ("1.2.1-2.2+wheezy3", "1.2.1-2.2", 1),
        ("1.16.5-1.3ubuntu1", "1:1.16.5-1.3ubuntu1", -1),
        ("2.0-1~bpo12+1", "2.0-1", -1),
        ("0", "0~", 1),  # an exhausted string against a tilde, where the other starts with a zero
    ],
)
def test_debian_order(a: str, b: str, expected: int) -> None:
    assert compare("deb", a, b) == expected
    assert reference(a, b) == expected


_part = st.text(alphabet="0123456789.+~abz", min_size=1, max_size=8).filter(lambda s: s[0].isdigit())
_revision = st.text(alphabet="0123456789.+~abz", min_size=1, max_size=6)
_versions = st.builds(
    lambda epoch, upstream, revision: (f"{epoch}:" if epoch else "") + upstream + (f"-{revision}" if revision else ""),
    st.sampled_from([None, 1, 2]),
    _part,
    st.one_of(st.none(), _revision),
)


@settings(max_examples=600, deadline=None)
@given(_versions, _versions)
def test_the_debian_key_agrees_with_python_debian(a: str, b: str) -> None:
    assert compare("deb", a, b) == reference(a, b)


def test_the_debian_key_sorts_a_real_package_list_as_python_debian_does() -> None:
    lines = (FIXTURES / "software" / "dpkg-query.tsv").read_text().splitlines()
    versions = sorted({line.split("\t")[1] for line in lines})
    assert len(versions) > 100
    assert sorted(versions, key=lambda v: sort_key("deb", v)) == sorted(versions, key=cmp_to_key(reference))


@pytest.mark.parametrize(
    ("scheme", "a", "b", "expected"),
    [
        ("pep440", "1.13.1+cu116", "1.13.1", 1),  # a local version sorts after its public one
        ("pep440", "2.31.0", "2.31.0rc1", 1),
        ("pep440", "10.0.0", "9.5.0", 1),
        ("rpm", "1:0.17-65.el7_6", "0.17-65.el7_6", 1),
        ("rpm", "0.17-64.el7", "0.17-65.el7_6", -1),
        ("semver", "v1.10.0", "1.9.3", 1),
        ("dotted", "550.90.07", "550.90.7", 0),
        ("dotted", "535.183.01", "550.90.07", -1),
        ("dotted", "13.0", "12.9", 1),
    ],
)
def test_other_schemes(scheme: str, a: str, b: str, expected: int) -> None:
    assert compare(scheme, a, b) == expected


@pytest.mark.parametrize(("scheme", "text"), [("deb", "not a version!"), ("pep440", "what?"), ("dotted", "...")])
def test_an_unparseable_version_is_refused(scheme: str, text: str) -> None:
    with pytest.raises(InvalidVersion):
        sort_key(scheme, text)
