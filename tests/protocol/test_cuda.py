"""The CUDA -> NVIDIA driver rule: driver versions read and compared as numbers, and NVIDIA's table."""

from __future__ import annotations

from itertools import pairwise

import pytest

from gpufleet.core.errors import InvalidInput
from gpufleet.protocol.cuda import (
    TOOLKIT_DRIVER,
    driver_for_cuda,
    format_driver,
    newest_cuda,
    parse_cuda,
    parse_driver,
)


def test_driver_versions_compare_as_numbers_not_text() -> None:
    older, newer = parse_driver("550.54.14"), parse_driver("550.127.05")
    assert older == (550, 54, 14)
    assert newer == (550, 127, 5)
    assert older < newer
    assert sorted(["550.54.14", "550.127.05"]) == ["550.127.05", "550.54.14"]  # as text: the wrong order
    assert parse_driver("  535.183.01\n") == (535, 183, 1)
    assert parse_driver("550") == (550, 0, 0)  # always three fields, so tuples compare as versions


@pytest.mark.parametrize("text", ["470.42.01", "525.60.13", "550.127.05", "450.51.05", "570.26", "550"])
def test_format_driver_round_trips_nvidias_two_digit_fields(text: str) -> None:
    assert format_driver(parse_driver(text)) == text


def test_format_driver_pads_the_minor_fields() -> None:
    assert format_driver((470, 42, 1)) == "470.42.01"
    assert format_driver((525, 60, 13)) == "525.60.13"
    assert format_driver((455, 23)) == "455.23"


@pytest.mark.parametrize(
    "text",
    ["", "abc", "550.54.14.1", "550..14", ".550", "550.", "550.54.x", "12345.1", "-550.1", "550 54 14"],
)
def test_garbage_driver_strings_are_invalid(text: str) -> None:
    with pytest.raises(InvalidInput, match="not an NVIDIA driver version"):
        parse_driver(text)


def test_parse_cuda_keeps_major_and_minor() -> None:
    assert parse_cuda("12.4") == (12, 4)
    assert parse_cuda("12.4.1") == (12, 4)
    assert parse_cuda(" 11.8 ") == (11, 8)


@pytest.mark.parametrize("text", ["", "12", "12.", "v12.4", "12.4.1.2", "twelve", "12.x", "123.4", "12.4-rc1"])
def test_garbage_cuda_strings_are_invalid(text: str) -> None:
    with pytest.raises(InvalidInput, match="not a CUDA version"):
        parse_cuda(text)
    with pytest.raises(InvalidInput, match="not a CUDA version"):
        driver_for_cuda(text)


def test_driver_for_cuda_follows_nvidias_table() -> None:
    assert driver_for_cuda("12.4") == (550, 54, 14)
    assert driver_for_cuda("12.4.1") == (550, 54, 14)  # the patch release needs what the minor's GA needed
    assert driver_for_cuda("11.4") == (470, 42, 1)
    assert driver_for_cuda("12.0") == (525, 60, 13)
    assert driver_for_cuda("13.0") == (580, 65, 6)


@pytest.mark.parametrize("cuda", ["14.2", "12.7", "10.2"])
def test_a_cuda_version_outside_the_table_asks_for_the_driver(cuda: str) -> None:
    with pytest.raises(InvalidInput, match="--min-driver") as caught:
        driver_for_cuda(cuda)
    assert f"CUDA {cuda}" in str(caught.value)


def test_newest_cuda_a_driver_runs() -> None:
    assert newest_cuda((535, 183, 1)) == (12, 2)
    assert newest_cuda((580, 159, 4)) == (13, 0)
    assert newest_cuda((550, 54, 14)) == (12, 4)  # exactly the GA driver counts
    assert newest_cuda((550, 54, 13)) == (12, 3)
    assert newest_cuda((440, 33)) is None
    assert newest_cuda((450, 51, 5)) == (11, 0)


def test_the_table_is_monotonic() -> None:
    """A later CUDA never needs an older driver: otherwise newest_cuda and the scheduler would disagree."""
    ordered = sorted(TOOLKIT_DRIVER.items())
    assert len(ordered) >= 2
    for (cuda, driver), (later, later_driver) in pairwise(ordered):
        assert later_driver > driver, f"CUDA {later} needs {later_driver}, older than CUDA {cuda}'s {driver}"


def test_every_table_driver_runs_its_own_cuda_and_no_later_one() -> None:
    for cuda, driver in TOOLKIT_DRIVER.items():
        assert newest_cuda(driver) == cuda
        assert driver_for_cuda(f"{cuda[0]}.{cuda[1]}") == driver
        assert parse_driver(format_driver(driver)) == driver
