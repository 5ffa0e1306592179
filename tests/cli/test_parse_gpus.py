"""`gpufleet job submit --gpus`: whole GPUs as a number, MIG instances as PROFILE[:N]."""

import pytest

from gpufleet.cli.jobs import parse_gpus
from gpufleet.core.errors import InvalidInput


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("2", (None, 2)),
        ("0", (None, 0)),
        (" 8 ", (None, 8)),
        ("1g.18gb", ("1g.18gb", 1)),
        ("1g.18gb:3", ("1g.18gb", 3)),
        ("3g.71gb:2", ("3g.71gb", 2)),
        ("7g.141gb", ("7g.141gb", 1)),
    ],
)
def test_gpus_in_every_form(text: str, parsed: tuple[str | None, int]) -> None:
    assert parse_gpus(text) == parsed


@pytest.mark.parametrize(
    "text", ["", "two", "-1", "1.5", "1g", "1g.18gb:", "1g.18gb:x", ":2", "9g.18gb", "1g.18GB", "2x1g.18gb", "100"]
)
def test_bad_gpus_are_refused_saying_what_is_expected(text: str) -> None:
    with pytest.raises(InvalidInput, match=r"1g\.18gb:2"):
        parse_gpus(text)
