"""Hostlist expressions such as gpu[001-016] (the Slurm syntax), through python-hostlist."""

from __future__ import annotations

import hostlist as _hostlist

from gpufleet.core.errors import InvalidInput

MAX_EXPANSION = 100_000


def expand(expressions: list[str] | str) -> list[str]:
    """Expand one or more hostlist expressions into names, in order, without duplicates.

    Raises InvalidInput for a malformed expression or one that expands past MAX_EXPANSION names.
    """
    items = [expressions] if isinstance(expressions, str) else expressions
    names: list[str] = []
    seen: set[str] = set()
    for item in items:
        try:
            expanded = _hostlist.expand_hostlist(item)
        except _hostlist.BadHostlist as exc:
            raise InvalidInput(f"invalid hostlist expression {item!r}: {exc}") from None
        if not expanded:
            raise InvalidInput(f"hostlist expression {item!r} names no hosts")
        for name in expanded:
            if name not in seen:
                seen.add(name)
                names.append(name)
        if len(names) > MAX_EXPANSION:
            raise InvalidInput(f"hostlist expands to more than {MAX_EXPANSION} names")
    return names


def collect(names: list[str]) -> str:
    """Compress names back into one expression, e.g. for messages."""
    return str(_hostlist.collect_hostlist(names))
