"""The job CLI's own parsing: sizes, time limits and environment pairs, with clear errors."""

import pytest

from gpufleet.cli.jobs import parse_mem, parse_pairs, parse_time
from gpufleet.core.errors import InvalidInput


@pytest.mark.parametrize(
    ("text", "mib"), [("512M", 512), ("16G", 16384), ("1T", 1048576), ("64GiB", 65536), ("100", 100), ("1.5g", 1536)]
)
def test_memory_sizes(text: str, mib: int) -> None:
    assert parse_mem(text) == mib


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 5400), ("90m", 5400), ("4h", 14400), ("2d", 172800), ("1:30:00", 5400), ("0:05", 5), ("1-00:00:00", 86400)],
)
def test_time_limits_in_every_form_admins_type(text: str, seconds: int) -> None:
    assert parse_time(text) == seconds


@pytest.mark.parametrize("bad", ["", "soon", "0:00", "4 hours", "-1h"])
def test_bad_time_limits(bad: str) -> None:
    with pytest.raises(InvalidInput):
        parse_time(bad)


@pytest.mark.parametrize("bad", ["", "lots", "16X", "-4G"])
def test_bad_sizes(bad: str) -> None:
    with pytest.raises(InvalidInput, match="memory size"):
        parse_mem(bad)


def test_environment_pairs() -> None:
    assert parse_pairs(["A=1", "B=x=y", "EMPTY="]) == {"A": "1", "B": "x=y", "EMPTY": ""}
    with pytest.raises(InvalidInput, match="NAME=VALUE"):
        parse_pairs(["NOEQUALS"])
    with pytest.raises(InvalidInput, match="NAME=VALUE"):
        parse_pairs(["=value"])
