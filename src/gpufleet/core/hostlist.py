"""Hostlist expressions such as gpu[001-016] (the Slurm syntax), through python-hostlist.

Every hostlist gpufleet reads (API, CLI, Slurm's node lists) goes through `expand`: python-hostlist
turns each run of digits into an int, and Python refuses to convert one of more than 4,300 digits
with a ValueError that is no BadHostlist. A run longer than any node name can hold is refused here
first, as invalid input.
"""

from __future__ import annotations

import re

import hostlist as _hostlist

from gpufleet.core.errors import InvalidInput

MAX_EXPANSION = 100_000
# No node name holds a longer run of digits (a name is at most 63 characters: protocol.messages).
MAX_DIGITS = 63
_LONG_NUMBER = re.compile(rf"\d{{{MAX_DIGITS + 1},}}")


def _check_numbers(text: str) -> None:
    if _LONG_NUMBER.search(text):
        raise InvalidInput(f"hostlist {text[:40]!r}... holds a number of more than {MAX_DIGITS} digits")


def expand(expressions: list[str] | str) -> list[str]:
    """Expand one or more hostlist expressions into names, in order, without duplicates.

    Raises InvalidInput for a malformed expression, one with a number longer than MAX_DIGITS digits,
    or one that expands past MAX_EXPANSION names.
    """
    items = [expressions] if isinstance(expressions, str) else expressions
    names: list[str] = []
    seen: set[str] = set()
    for item in items:
        _check_numbers(item)
        try:
            expanded = _hostlist.expand_hostlist(item)
        except _hostlist.BadHostlist as exc:
            raise InvalidInput(f"invalid hostlist expression {item[:200]!r}: {exc}") from None
        if not expanded:
            raise InvalidInput(f"hostlist expression {item[:200]!r} names no hosts")
        for name in expanded:
            if name not in seen:
                seen.add(name)
                names.append(name)
        if len(names) > MAX_EXPANSION:
            raise InvalidInput(f"hostlist expands to more than {MAX_EXPANSION} names")
    return names


def collect(names: list[str]) -> str:
    """Compress names back into one expression, e.g. for messages. Raises InvalidInput for a name
    with a number longer than MAX_DIGITS digits (python-hostlist would fail to convert it)."""
    for name in names:
        _check_numbers(name)
    return str(_hostlist.collect_hostlist(names))
