"""A small YAML writer for the files `gpufleet export prometheus` writes.

The CLI installs without PyYAML, and these files hold only mappings, lists, strings, numbers and
booleans. Block style, keys in the order given; a string is written plain only when it cannot be read
back as anything else, otherwise double-quoted with JSON's escapes, which YAML's double-quoted
style shares.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

_PLAIN = re.compile(r"^[A-Za-z_/][A-Za-z0-9_./-]*$")
# YAML 1.1 (what Prometheus' parser speaks) reads these as booleans or null when unquoted.
_RESERVED = {"y", "n", "yes", "no", "on", "off", "true", "false", "null", "~"}


def scalar(value: Any) -> str:
    """One scalar as YAML. Raises TypeError for anything else."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return json.dumps(value)
    if isinstance(value, str):
        if _PLAIN.match(value) and value.lower() not in _RESERVED:
            return value
        return json.dumps(value, ensure_ascii=False)
    raise TypeError(f"not a YAML scalar: {type(value).__name__}")


def _key(key: Any) -> str:
    if not isinstance(key, str):
        raise TypeError(f"mapping keys must be strings, not {type(key).__name__}")
    return scalar(key)


def _is_scalar(value: Any) -> bool:
    return not isinstance(value, Mapping | list | tuple) or len(value) == 0


def _inline_empty(value: Any) -> str:
    if isinstance(value, Mapping):
        return "{}"
    if isinstance(value, list | tuple):
        return "[]"
    return scalar(value)


def _lines(value: Any, indent: int) -> list[str]:
    pad = " " * indent
    out: list[str] = []
    if isinstance(value, Mapping):
        for key, item in value.items():
            if _is_scalar(item):
                out.append(f"{pad}{_key(key)}: {_inline_empty(item)}")
            else:
                out.append(f"{pad}{_key(key)}:")
                out.extend(_lines(item, indent + 2))
    elif isinstance(value, Sequence) and not isinstance(value, str):
        for item in value:
            if _is_scalar(item):
                out.append(f"{pad}- {_inline_empty(item)}")
            else:
                nested = _lines(item, indent + 2)
                # The first line of the item goes after the dash: "- key: value".
                out.append(f"{pad}- {nested[0].lstrip()}")
                out.extend(nested[1:])
    else:
        out.append(f"{pad}{scalar(value)}")
    return out


def dump(document: Mapping[str, Any], header: str = "") -> str:
    """The document as YAML text, after `header` (comment lines, each starting with '#').

    Raises TypeError for a value that is not a mapping, list, string, number, boolean or None.
    """
    lines = [f"# {line}" if line else "#" for line in header.splitlines()]
    return "\n".join([*lines, *_lines(document, 0)]) + "\n"
