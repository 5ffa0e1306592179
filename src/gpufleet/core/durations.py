"""Human durations such as 30d, 1h, 90m, 45s, as used on the command line."""

from __future__ import annotations

import re

from gpufleet.core.errors import InvalidInput

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_PATTERN = re.compile(r"^(\d+)([smhdw])$")


def parse_duration(text: str) -> int:
    """Seconds in a duration like '1h'. Raises InvalidInput for anything else."""
    match = _PATTERN.match(text.strip().lower())
    if not match or int(match.group(1)) == 0:
        raise InvalidInput(f"invalid duration {text!r}: use a positive number and a unit, e.g. 90s, 30m, 1h, 7d")
    return int(match.group(1)) * _UNITS[match.group(2)]
