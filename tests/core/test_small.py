import pytest

from gpufleet.core import hostlist
from gpufleet.core.durations import parse_duration
from gpufleet.core.errors import InvalidInput


def test_hostlist_expands_ranges_in_order_without_duplicates() -> None:
    assert hostlist.expand(["gpu[001-003]", "gpu002", "cpu1"]) == ["gpu001", "gpu002", "gpu003", "cpu1"]
    assert hostlist.collect(["gpu001", "gpu002", "gpu003"]) == "gpu[001-003]"


@pytest.mark.parametrize("bad", ["gpu[001-", "gpu[3-1]", "gpu[a-b]", ""])
def test_hostlist_rejects_malformed(bad: str) -> None:
    with pytest.raises(InvalidInput):
        hostlist.expand([bad])


def test_hostlist_caps_huge_expansions() -> None:
    with pytest.raises(InvalidInput, match=r"too large|more than"):
        hostlist.expand(["n[0-999999]"])


@pytest.mark.parametrize(("text", "seconds"), [("45s", 45), ("30m", 1800), ("1h", 3600), ("7d", 604800)])
def test_durations(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["1", "h", "0h", "-1h", "1y", "1.5h"])
def test_bad_durations(bad: str) -> None:
    with pytest.raises(InvalidInput):
        parse_duration(bad)
